"""Nyströmformer: the core equals a float64 numpy transcription of its definition (landmark means over
real tokens, three softmaxes, the iterative pseudo-inverse, the depthwise convolution); it tends to
softmax attention as the landmarks grow; the exact path for L <= m."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import nystromformer
from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, padded_mask


def apply_with_params(core, q, k, v, mask, seed=0):
  """(output, params) of ``core`` on these inputs, init and apply each under one jit."""
  variables = jax.jit(core.init)(jax.random.key(seed), q, k, v, mask)
  out = jax.jit(lambda var, q, k, v, m: core.apply(var, q, k, v, mask=m))(variables, q, k, v, mask)
  return np.asarray(out), variables.get("params", {})


def softmax_rows(logits, allowed):
  logits = np.where(allowed, logits, -np.inf)
  peak = np.max(logits, -1, keepdims=True)
  w = np.where(allowed, np.exp(logits - np.where(np.isfinite(peak), peak, 0.0)), 0.0)
  total = w.sum(-1, keepdims=True)
  return w / np.where(total > 0, total, 1.0)


def numpy_pinv(a, iterations, per_matrix=True):
  sums = a.sum(-2)
  scale = sums.max(-1)[..., None, None] if per_matrix else sums.max()
  z = np.swapaxes(a, -1, -2) / scale
  eye = np.eye(a.shape[-1])
  for _ in range(iterations):
    az = a @ z
    z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
  return z


def reference(q, k, v, mask, m, iterations=6, conv=None):
  """Definition, one (example, head) at a time: segments of ceil(L/m) tokens, landmark = mean of the
  real tokens of a segment (empty segments dropped), out = A1 pinv(A2) A3 v + conv(v)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, length, heads, dim = q.shape
  seg = -(-length // m)
  out = np.zeros(v.shape)
  for b in range(batch):
    groups = [[i for i in range(s, min(s + seg, length)) if mask[b, i]] for s in range(0, length, seg)]
    groups = [g for g in groups if g]
    for h in range(heads):
      qs, ks = q[b, :, h] * dim ** -0.25, k[b, :, h] * dim ** -0.25
      ql = np.stack([qs[g].mean(0) for g in groups])
      kl = np.stack([ks[g].mean(0) for g in groups])
      a1 = softmax_rows(qs @ kl.T, True)
      a2 = softmax_rows(ql @ kl.T, True)
      a3 = softmax_rows(ql @ ks.T, mask[b][None, :])
      out[b, :, h] = a1 @ numpy_pinv(a2, iterations) @ a3 @ v[b, :, h]
  if conv is not None:
    taps = conv.shape[0]
    vm = np.pad(v * mask[:, :, None, None], ((0, 0), (taps // 2, taps // 2), (0, 0), (0, 0)))
    out += sum(conv[t][None, None, :, None] * vm[:, t:t + length] for t in range(taps))
  return out


def test_matches_definition_with_padding_at_end_and_in_middle(x64):
  length, m = 37, 8                            # segments of 5 tokens, the last one of 2
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 6)
  mask[1, 9:22] = False                        # example 1: segments 2 and 3 entirely padded
  out, params = apply_with_params(create("nystromformer", num_landmarks=m, conv_kernel=5), q, k, v, mask)
  expected = reference(q, k, v, mask, m, conv=np.asarray(params["conv"], np.float64))
  np.testing.assert_allclose(out[mask], expected[mask], rtol=1e-6, atol=1e-6)  # conv weights are f32
  assert np.all(np.isfinite(out))


def test_batch_wide_pinv_init_is_the_original(x64):
  a = np.random.default_rng(0).random((2, 3, 5, 5))
  a /= a.sum(-1, keepdims=True) * np.arange(1, 3)[:, None, None, None]
  for init, per in (("per_matrix", True), ("batch", False)):
    np.testing.assert_allclose(np.asarray(nystromformer.iterative_pinv(jnp.asarray(a), 6, init)),
                               numpy_pinv(a, 6, per), rtol=1e-10)


def test_pinv_converges_to_the_inverse(x64):
  a = np.eye(6) + 0.1 * np.random.default_rng(1).random((6, 6))
  a /= a.sum(-1, keepdims=True)
  z = np.asarray(nystromformer.iterative_pinv(jnp.asarray(a), 6))
  np.testing.assert_allclose(z, np.linalg.inv(a), atol=1e-8)


def test_one_landmark_per_token_is_softmax_attention(x64):
  length = 24
  q, k, v = random_qkv(2, 1, length, 2, 8, 4, dtype=jnp.float64)
  mask = np.ones((1, length), bool)
  out = jax.jit(lambda q, k, v: nystromformer.nystrom_attention(q, k, v, jnp.asarray(mask), length,
                                                                pinv_iterations=20))(q, k, v)
  exact = dense_masked_attention(q, k, v, key_and_causal_mask(mask, False))
  np.testing.assert_allclose(np.asarray(out), exact, atol=1e-6)


def test_error_shrinks_as_landmarks_grow():
  length = 64
  q, k, v = random_qkv(0, 3, length, 2, 8, 4)          # three examples = three draws of inputs
  exact = dense_masked_attention(q, k, v, True)
  errors = []
  for m in (4, 16, 32):
    out, _ = apply_with_params(create("nystromformer", num_landmarks=m, conv_kernel=0), q, k, v, None)
    errors.append(np.mean([np.linalg.norm(o - e) / np.linalg.norm(e) for o, e in zip(out, exact)]))
  assert errors[0] > errors[1] > errors[2] and errors[2] < 0.7 * errors[0], errors


def test_short_sequences_take_the_exact_path(x64):
  length = 21
  q, k, v = random_qkv(3, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 5)
  out, _ = apply_with_params(create("nystromformer", conv_kernel=0), q, k, v, mask)   # L <= 64
  np.testing.assert_allclose(out[mask], dense_masked_attention(q, k, v, key_and_causal_mask(mask, False))[mask],
                             rtol=1e-10, atol=1e-12)


def test_presets_and_causal():
  assert [create(f"nystromformer_{m}").config.num_landmarks for m in (32, 128, 256)] == [32, 128, 256]
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="landmark"):
    create("nystromformer", causal=True).init(jax.random.key(0), q, k, v)
  with pytest.raises(ValueError, match="odd"):
    create("nystromformer", conv_kernel=4)
