"""Flash (fused exact attention): equals ``vanilla`` and a dense float64 reference at float32 tolerance
(its XLA softmax runs in float32), with padding at the end and in the middle, bidirectional and causal;
the prefix-lengths padding form equals the mask form for trailing padding; the Pallas kernel (through its
interpreter on CPU) gives the same outputs; training dropout takes the explicit path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo.flash import FlashConfig
from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, run_core


def holes_mask(batch, length):
  """bool [B, L]: example 0 padded at the end, example 1 padded in the middle (LRA image black pixels)."""
  mask = np.ones((batch, length), bool)
  mask[0, length - 6:] = False
  mask[1, 9:14] = False
  return mask


@pytest.mark.parametrize("causal", [False, True])
def test_matches_dense_reference_and_vanilla(x64, causal):
  q, k, v = random_qkv(0, 2, 23, 2, 8, 5, dtype=jnp.float64)   # odd length, V != D
  mask = holes_mask(2, 23)
  out = np.asarray(run_core(create("flash", causal=causal), q, k, v, mask))
  ref = dense_masked_attention(q, k, v, key_and_causal_mask(mask, causal))
  vanilla = np.asarray(run_core(create("vanilla", causal=causal), q, k, v, mask))
  np.testing.assert_allclose(out[mask], ref[mask], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out[mask], vanilla[mask], rtol=1e-5, atol=1e-6)
  assert np.all(out[~mask] == 0), "padded query rows are zeroed"


def test_prefix_lengths_equal_mask_for_trailing_padding():
  q, k, v = random_qkv(1, 2, 21, 2, 8, 8)
  mask = np.ones((2, 21), bool)
  mask[0, 15:] = False
  by_mask = run_core(create("flash"), q, k, v, mask)
  by_lengths = run_core(create("flash", padding="lengths"), q, k, v, mask)
  np.testing.assert_allclose(np.asarray(by_lengths), np.asarray(by_mask), rtol=1e-6, atol=1e-6)


def test_fully_padded_example_is_finite():
  q, k, v = random_qkv(2, 2, 17, 1, 8, 8)
  mask = np.ones((2, 17), bool)
  mask[0] = False
  out = np.asarray(run_core(create("flash", causal=True), q, k, v, mask))
  assert np.all(np.isfinite(out)) and np.all(out[0] == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_pallas_kernel_in_interpreter_matches_xla(causal):
  q, k, v = random_qkv(3, 1, 19, 1, 8, 4)
  mask = holes_mask(2, 19)[1:]
  pallas = run_core(create("flash", implementation="pallas", pallas_interpret=True, causal=causal),
                    q, k, v, mask)
  xla = run_core(create("flash", causal=causal), q, k, v, mask)
  np.testing.assert_allclose(np.asarray(pallas), np.asarray(xla), rtol=1e-5, atol=1e-5)


def test_pallas_off_gpu_needs_the_interpreter():
  if jax.default_backend() == "gpu":
    pytest.skip("the Pallas kernel runs natively here")
  q, k, v = random_qkv(4, 1, 16, 1, 8, 8)
  with pytest.raises(NotImplementedError, match="needs a GPU"):
    run_core(create("flash", implementation="pallas"), q, k, v)


def test_training_dropout_takes_the_explicit_path():
  """In training the (explicit) dropout changes the output; in evaluation the rate is ignored and the
  fused path gives exactly the dropout-free output. (Unbiasedness: the registry-wide test.)"""
  q, k, v = random_qkv(5, 1, 20, 2, 8, 8)
  dropped = run_core(create("flash", dropout_rate=0.3), q, k, v, deterministic=False, seed=4)
  det = run_core(create("flash", dropout_rate=0.3), q, k, v)
  plain = run_core(create("flash"), q, k, v)
  np.testing.assert_array_equal(np.asarray(det), np.asarray(plain))
  assert not np.allclose(np.asarray(dropped), np.asarray(det))


def test_config_validation():
  with pytest.raises(ValueError, match="implementation"):
    FlashConfig(implementation="triton")
  with pytest.raises(ValueError, match="padding"):
    FlashConfig(padding="segments")
