"""Memory-compressed attention: equals a float64 strided convolution + masked softmax written from the
definition (padding at the end and in the middle, a length that is not a multiple of the stride, full and
per-head key kernels, causal), slot masking, parameter shapes and initial mean pooling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention


def end_and_middle_mask(batch, length):
  mask = np.ones((batch, length), bool)
  mask[0, length - 8:] = False
  mask[1, 5:12] = False  # window 1 partially padded, windows 2 and 3 fully padded (stride 3)
  return mask


def init_with_output(core, q, k, v, mask=None):
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1), "attention": jax.random.key(2)}
  fn = jax.jit(lambda q, k, v, m: core.init_with_output(rngs, q, k, v, mask=m))
  return fn(q, k, v, None if mask is None else jnp.asarray(mask))


def reference(params, q, k, v, mask, stride, causal):
  """Loop over windows: K̃[c] = Σ_{real t in window c} K[t]·Wk[t − cS], Ṽ[c] = Σ w[h, t − cS] V[t];
  slots without a real token masked; causal: slot c visible from i iff cS + S − 1 ≤ i."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, length, heads, dim = q.shape
  kernel, filt = np.asarray(params["key_kernel"]), np.asarray(params["value_filter"])
  slots = -(-length // stride)
  ck = np.zeros((batch, slots, heads, dim))
  cv = np.zeros((batch, slots, heads, v.shape[-1]))
  slot_real = np.zeros((batch, slots), bool)
  for b in range(batch):
    for t in range(length):
      if not mask[b, t]:
        continue
      c, s = divmod(t, stride)
      slot_real[b, c] = True
      if kernel.ndim == 5:
        ck[b, c] += np.einsum("hd,hdge->ge", k[b, t], kernel[s])
      else:
        ck[b, c] += np.einsum("hd,hde->he", k[b, t], kernel[:, s])
      cv[b, c] += filt[:, s, None] * v[b, t]
  allowed = np.broadcast_to(slot_real[:, None, None, :], (batch, 1, length, slots))
  if causal:
    visible = np.arange(slots)[None, :] * stride + stride - 1 <= np.arange(length)[:, None]
    allowed = allowed & visible
  return dense_masked_attention(q, ck, cv, allowed)


@pytest.mark.parametrize("overrides", [
    {},                                            # S = 3, full key kernel, L = 29 (last window partial)
    {"key_conv": "per_head", "compression": 4},
    {"causal": True},
])
def test_matches_float64_definition(x64, overrides):
  q, k, v = random_qkv(0, 3, 29, 2, 4, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(3, 29)
  _, variables = init_with_output(create("memory_compressed", **overrides), q, k, v, mask)
  params = variables["params"]
  # Random filters instead of the initial mean pooling, so each window position has its own weight.
  params = dict(params, value_filter=jax.random.normal(jax.random.key(3), params["value_filter"].shape,
                                                       jnp.float64))
  core = create("memory_compressed", **overrides)
  out = jax.jit(lambda p: core.apply({"params": p}, q, k, v, mask=jnp.asarray(mask)))(params)
  expected = reference(params, q, k, v, mask, overrides.get("compression", 3), overrides.get("causal", False))
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_parameters_and_initial_mean_pooling():
  q, k, v = random_qkv(1, 1, 16, 2, 4, 5)
  for key_conv, shape in (("full", (3, 2, 4, 2, 4)), ("per_head", (2, 3, 4, 4))):
    params = jax.eval_shape(create("memory_compressed", key_conv=key_conv).init, jax.random.key(0),
                            q, k, v)["params"]
    assert params["key_kernel"].shape == shape
  _, variables = init_with_output(create("memory_compressed"), q, k, v)
  np.testing.assert_allclose(np.asarray(variables["params"]["value_filter"]), np.full((2, 3), 1 / 3))


def test_causal_first_queries_see_no_slot_and_probe_is_lower_triangular():
  length = 20
  q, k, _ = random_qkv(2, 1, length, 1, 4, 1)
  eye = jnp.eye(length)[None, :, None, :]
  out, _ = init_with_output(create("memory_compressed", causal=True), q, k, eye)
  p = np.asarray(out)[0, :, 0]
  assert np.all(p[:2] == 0)                       # queries 0, 1: no complete window yet
  assert np.all(p[2, 3:] == 0) and np.all(p[2, :3] != 0)
  assert np.all(np.triu(p, 1) == 0)


def test_fully_padded_windows_get_no_weight():
  """value = eye: padded columns zero, and the weights of a window mixing real and padded tokens sit on
  its real tokens only."""
  length = 18
  q, k, _ = random_qkv(3, 1, length, 1, 4, 1)
  mask = np.ones((1, length), bool)
  mask[0, 4:10] = False                           # windows {3, 4, 5}, {9, 10, 11} partial; {6, 7, 8} padded
  eye = jnp.eye(length)[None, :, None, :]
  out, _ = init_with_output(create("memory_compressed"), q, k, eye, mask)
  p = np.asarray(out)[0, :, 0]
  assert np.all(p[:, ~mask[0]] == 0) and np.all(p[mask[0]][:, 3] != 0)


def test_config_validation():
  with pytest.raises(ValueError, match="key_conv"):
    create("memory_compressed", key_conv="depthwise")
  with pytest.raises(ValueError, match="compression"):
    create("memory_compressed", compression=0)
