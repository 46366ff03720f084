"""Flash (exact attention through a fused kernel, XLA's dense path or the blockwise online-softmax path):
XLA's path equals ``vanilla`` and a dense float64 reference at float32 tolerance (its softmax runs in float32);
the blockwise path (the CPU default) equals ``vanilla`` in float64 to 1e-10 in outputs AND q/k/v gradients,
bidirectional and causal, with padding at the end, in the middle and a fully padded example, at lengths that
are no multiple of the block and with V != D; bfloat16 inputs stay close to float32; its backward holds no
L x L array; the prefix-lengths padding form equals the mask form for trailing padding; the Pallas kernel
(through its interpreter on CPU) gives the same outputs; training dropout takes the explicit path, and
``resolve_implementation`` says which implementation runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import flash
from attention_zoo.flash import FlashConfig, resolve_implementation
from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, run_core


def holes_mask(batch, length):
  """bool [B, L]: example 0 padded at the end, example 1 padded in the middle (LRA image black pixels)."""
  mask = np.ones((batch, length), bool)
  mask[0, length - 6:] = False
  mask[1, 9:14] = False
  return mask


@pytest.mark.parametrize("implementation", [None, "xla"])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_dense_reference_and_vanilla(x64, causal, implementation):
  q, k, v = random_qkv(0, 2, 23, 2, 8, 5, dtype=jnp.float64)   # odd length, V != D
  mask = holes_mask(2, 23)
  out = np.asarray(run_core(create("flash", causal=causal, implementation=implementation), q, k, v, mask))
  ref = dense_masked_attention(q, k, v, key_and_causal_mask(mask, causal))
  vanilla = np.asarray(run_core(create("vanilla", causal=causal), q, k, v, mask))
  np.testing.assert_allclose(out[mask], ref[mask], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out[mask], vanilla[mask], rtol=1e-5, atol=1e-6)
  assert np.all(out[~mask] == 0), "padded query rows are zeroed"


def test_prefix_lengths_equal_mask_for_trailing_padding():
  q, k, v = random_qkv(1, 2, 21, 2, 8, 8)
  mask = np.ones((2, 21), bool)
  mask[0, 15:] = False
  by_mask = run_core(create("flash", implementation="xla"), q, k, v, mask)
  by_lengths = run_core(create("flash", implementation="xla", padding="lengths"), q, k, v, mask)
  np.testing.assert_allclose(np.asarray(by_lengths), np.asarray(by_mask), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("padding", ["mask", "lengths"])
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_path_pads_an_odd_length_with_masked_keys(monkeypatch, causal, padding):
  # cuDNN refuses odd lengths when training with a bias (check_is_flash_attention); the CPU has no cuDNN, so the
  # kernel is replaced by XLA's, called with what the "cudnn" path passes: an even length, padded keys masked
  seen = []
  real = jax.nn.dot_product_attention

  def kernel(query, key, value, **kwargs):
    seen.append(query.shape[1])
    assert kwargs.pop("implementation") == "cudnn"
    return real(query, key, value, implementation="xla", **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", kernel)
  q, k, v = random_qkv(4, 2, 23, 2, 8, 8)
  mask = np.ones((2, 23), bool)
  mask[0, 17:] = False                                      # trailing padding: both padding forms apply
  out = np.asarray(run_core(create("flash", causal=causal, implementation="cudnn", padding=padding), q, k, v, mask))
  vanilla = np.asarray(run_core(create("vanilla", causal=causal), q, k, v, mask))
  assert seen == [24]
  np.testing.assert_allclose(out[mask], vanilla[mask], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("implementation", [None, "xla"])
def test_fully_padded_example_is_finite(implementation):
  q, k, v = random_qkv(2, 2, 17, 1, 8, 8)
  mask = np.ones((2, 17), bool)
  mask[0] = False
  out = np.asarray(run_core(create("flash", causal=True, implementation=implementation), q, k, v, mask))
  assert np.all(np.isfinite(out)) and np.all(out[0] == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_pallas_kernel_in_interpreter_matches_xla(causal):
  q, k, v = random_qkv(3, 1, 19, 1, 8, 4)
  mask = holes_mask(2, 19)[1:]
  pallas = run_core(create("flash", implementation="pallas", pallas_interpret=True, causal=causal),
                    q, k, v, mask)
  xla = run_core(create("flash", implementation="xla", causal=causal), q, k, v, mask)
  np.testing.assert_allclose(np.asarray(pallas), np.asarray(xla), rtol=1e-5, atol=1e-5)


def test_pallas_off_gpu_needs_the_interpreter():
  if jax.default_backend() == "gpu":
    pytest.skip("the Pallas kernel runs natively here")
  q, k, v = random_qkv(4, 1, 16, 1, 8, 8)
  with pytest.raises(NotImplementedError, match="needs a GPU"):
    run_core(create("flash", implementation="pallas"), q, k, v)


def test_training_dropout_takes_the_explicit_path():
  """In training the (explicit) dropout changes the output; in evaluation the rate is ignored and the
  default path gives exactly the dropout-free output. (Unbiasedness: the registry-wide test.)"""
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
  with pytest.raises(ValueError, match="block_size"):
    FlashConfig(block_size=0)


# ----------------------------------------------------------------------------------------------------
# The blockwise path (FlashAttention-2's online softmax over key blocks, custom VJP) against vanilla.


def relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def padding_cases():
  """bool [3, 23]: padding at the end, in the middle, and one fully padded example."""
  mask = np.ones((3, 23), bool)
  mask[0, 17:] = False
  mask[1, 6:13] = False
  mask[2] = False
  return mask


def outputs_and_grads(core, q, k, v, mask, cotangent):
  """(output with padded query rows zeroed, (dq, dk, dv) of sum(output * cotangent)) in one jit."""
  where = mask[:, :, None, None]

  def loss(q, k, v):
    out = jnp.where(where, core.apply({}, q, k, v, mask=mask), 0)
    return jnp.sum(out * cotangent), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


@pytest.mark.parametrize("block_size", [8, 5, 256])   # 23 = 3 blocks of 8 (+1 pad), 5 of 5 (+2), one block
@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_equals_vanilla_outputs_and_gradients_float64(x64, causal, block_size):
  """Float64, 1e-10 relative: the blockwise path is the same function as vanilla, forward and backward, with
  padding at the end, in the middle and a fully padded example (finite, zero output and gradients there)."""
  q, k, v = random_qkv(6, 3, 23, 2, 8, 5, dtype=jnp.float64)    # V != D
  cotangent = random_qkv(7, 3, 23, 2, 5, 5, dtype=jnp.float64)[0]
  mask = padding_cases()
  core = create("flash", implementation="blockwise", causal=causal, block_size=block_size)
  out, grads = outputs_and_grads(core, q, k, v, mask, cotangent)
  ref, ref_grads = outputs_and_grads(create("vanilla", causal=causal), q, k, v, mask, cotangent)
  assert out.dtype == jnp.float64 and all(g.dtype == jnp.float64 for g in grads)
  assert relative_error(out, ref) <= 1e-10
  for name, grad, want in zip("qkv", grads, ref_grads):
    assert relative_error(grad, want) <= 1e-10, f"d{name}: {relative_error(grad, want):.3g}"
    assert np.all(np.isfinite(np.asarray(grad))) and np.all(np.asarray(grad)[2] == 0), f"d{name}"
  assert np.all(np.asarray(out)[2] == 0)


def test_blockwise_causal_future_keys_change_nothing(x64):
  """Causal: changing the keys and values after position 11 leaves outputs and gradients of queries <= 11
  exactly as they were (across block boundaries: blocks of 4)."""
  q, k, v = random_qkv(8, 1, 21, 1, 8, 8, dtype=jnp.float64)
  core = create("flash", implementation="blockwise", causal=True, block_size=4)
  before = np.asarray(run_core(core, q, k, v))
  k2, v2 = k.at[:, 12:].set(5.0), v.at[:, 12:].set(-3.0)
  after = np.asarray(run_core(core, q, k2, v2))
  np.testing.assert_array_equal(after[:, :12], before[:, :12])


def test_blockwise_bfloat16_is_finite_and_close_to_float32():
  """bfloat16 inputs: float32 accumulation inside, output in bfloat16, within about one bfloat16 rounding
  (2^-8 relative) of the float32 result for the same (rounded) inputs, where accumulating 200 keys in
  bfloat16 would be off by several; gradients finite and in bfloat16."""
  q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(9, 2, 200, 2, 16, 16))
  mask = np.ones((2, 200), bool)
  mask[0, 150:] = False
  mask[1, 40:90] = False
  core = create("flash", implementation="blockwise", block_size=64)
  out, grads = outputs_and_grads(core, q, k, v, mask, jnp.ones((2, 200, 2, 16), jnp.bfloat16))
  ref = np.asarray(run_core(core, *(x.astype(jnp.float32) for x in (q, k, v)), mask))
  assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
  assert all(np.all(np.isfinite(np.asarray(x, np.float32))) for x in (out, *grads))
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=2 ** -8, atol=2 ** -9 * np.abs(ref).max())


def test_blockwise_backward_holds_no_length_squared_array():
  """The compiled gradient at L = 4096 (B = H = 1, D = 64, float32) needs far less scratch memory than one
  L x L float32 array (64 MiB; vanilla's gradient needs 256 MiB). Per key block S = 256 the backward step
  holds a few [L, S] arrays (weights, dP, dS, logits: 4 MiB each); the bound, 6 of them (24 MiB), leaves
  room for XLA's buffer assignment and is well under L x L. Dropping the custom VJP (autodiff saving every
  block's weights) needs L x L again."""
  length = 4096
  x = jax.ShapeDtypeStruct((1, length, 1, 64), jnp.float32)
  core = create("flash", implementation="blockwise")
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(core.apply({}, q, k, v)), argnums=(0, 1, 2)))
  temp = grad.lower(x, x, x).compile().memory_analysis().temp_size_in_bytes
  size = flash.block_layout(length, flash.BLOCK_SIZE, 1)[0]
  assert temp <= 6 * length * size * 4 < length * length * 4 // 2, f"{temp / 2**20:.1f} MiB"


def test_resolve_implementation_table():
  f32, bf16, f16, f64 = jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64
  auto = FlashConfig()
  assert [resolve_implementation(auto, dtype, "cpu") for dtype in (f32, bf16, f64)] == ["blockwise"] * 3
  assert [resolve_implementation(auto, dtype, "gpu") for dtype in (bf16, f16, f32, f64)] == (
      ["cudnn", "cudnn", "xla", "xla"])
  assert resolve_implementation(auto, bf16, "cuda") == "cudnn"
  assert [resolve_implementation(auto, dtype, "tpu") for dtype in (bf16, f32)] == ["xla", "xla"]
  for name in ("xla", "cudnn", "pallas", "blockwise"):   # explicit: itself, on every backend
    assert {resolve_implementation(FlashConfig(implementation=name), d, b)
            for d in (f32, bf16) for b in ("cpu", "gpu", "tpu")} == {name}
  for name in flash.IMPLEMENTATIONS:   # training dropout: the explicit vanilla core, whatever was asked for
    dropout = FlashConfig(implementation=name, dropout_rate=0.1)
    assert {resolve_implementation(dropout, bf16, b) for b in ("cpu", "gpu")} == {"explicit (training dropout)"}
    assert resolve_implementation(dropout, bf16, "gpu", training_dropout=False) == name or (
        name is None and resolve_implementation(dropout, bf16, "gpu", training_dropout=False) == "cudnn")
  assert resolve_implementation(auto, f32) == resolve_implementation(auto, f32, jax.default_backend())
