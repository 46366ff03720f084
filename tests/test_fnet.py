"""FNet: the mixing equals numpy's FFT of the zero-padded values (padding at the end and in the middle),
the one-head probe is the cosine matrix, dropout drops whole value entries unbiasedly, no causal form."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, random_qkv
from tests.dense_reference import run_core


def end_and_middle_mask(batch, length):
  mask = np.ones((batch, length), bool)
  mask[0, length - 8:] = False
  mask[1, 5:12] = False
  return mask


@pytest.mark.parametrize("mix_heads", [True, False])
def test_equals_numpy_fft_of_zero_padded_values(x64, mix_heads):
  q, k, v = random_qkv(0, 3, 29, 3, 4, 5, dtype=jnp.float64)
  mask = end_and_middle_mask(3, 29)
  out = run_core(create("fnet", mix_heads=mix_heads), q, k, v, mask)
  zeroed = np.where(mask[:, :, None, None], np.asarray(v), 0.0)
  expected = np.fft.fftn(zeroed, axes=(1, 2) if mix_heads else (1,)).real
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-10, atol=1e-10)


def test_one_head_probe_is_the_cosine_matrix(x64):
  length = 23
  q, k, _ = random_qkv(1, 1, length, 1, 4, 1, dtype=jnp.float64)
  mask = np.ones((1, length), bool)
  mask[0, 6:9] = False
  eye = jnp.eye(length, dtype=jnp.float64)[None, :, None, :]
  p = np.asarray(run_core(create("fnet"), q, k, eye, mask))[0, :, 0]
  i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
  expected = np.cos(2 * np.pi * i * j / length) * mask[0][None, :]
  np.testing.assert_allclose(p, expected, rtol=1e-10, atol=1e-12)


def test_queries_and_keys_are_ignored():
  q, k, v = random_qkv(2, 2, 20, 2, 4, 4)
  q2, k2, _ = random_qkv(3, 2, 20, 2, 4, 4)
  core = create("fnet")
  np.testing.assert_array_equal(np.asarray(run_core(core, q, k, v)), np.asarray(run_core(core, q2, k2, v)))


def test_dropout_drops_value_entries_unbiased():
  """Probe under dropout 0.5: each column is dropped or doubled (the eye's entry was dropped or kept)."""
  length = 24
  q, k, _ = random_qkv(4, 1, length, 1, 4, 1)
  eye = jnp.eye(length)[None, :, None, :]
  core = create("fnet", dropout_rate=0.5)
  det = np.asarray(run_core(core, q, k, eye))[0, :, 0]
  drop = np.asarray(run_core(core, q, k, eye, deterministic=False, seed=5))[0, :, 0]
  kept = np.all(np.isclose(drop, 2 * det, rtol=1e-5, atol=1e-6), axis=0)
  dropped = np.all(drop == 0, axis=0)
  assert np.all(kept | dropped) and kept.any() and dropped.any()


def test_causal_raises():
  q, k, v = random_qkv(5, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="causal"):
    run_core(create("fnet", causal=True), q, k, v)
