"""Long-Short: equals its definition (per-query softmax over the window keys and the r dynamically
projected keys, DualLN on keys) in float64 at odd lengths with padding at the end and in the middle,
bidirectional and causal (segment-wise prefix projection); the window pattern; values stay linear."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import long_short
from tests.attention_probe import create, random_qkv
from tests.dense_reference import padded_mask


def layer_norm(x, p, eps=1e-5):
  """numpy LayerNorm over the last axis with flax params {scale, bias}."""
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(p["scale"]) + np.asarray(p["bias"])


def probs_all(scores, pool):
  """softmax over the pooled positions of ``scores`` [L, H, R] -> [L, H, R]."""
  s = np.where(pool[:, None, None], scores, -np.inf)
  e = np.exp(s - s.max(0))
  return e / e.sum(0)


def reference(params, q, k, v, mask, w, causal):
  """For every real query i: softmax over {window keys j: seg(i)·w − e ≤ j < (seg(i)+1)·w + e, real,
  (j ≤ i)} ∪ {r slots: K̄ = LN_s(Pᵀ LN_l(K)), V̄ = Pᵀ V, P = softmax over real j (< seg(i)·w)}."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
  batch, length, heads, dim = k.shape
  flat = k.reshape(batch, length, -1)
  scores = (flat @ p["dconv_fc"]["kernel"] + p["dconv_fc"]["bias"]).reshape(batch, length, heads, -1)
  k_l = layer_norm(flat, p["dual_ln_l"]).reshape(k.shape)
  ext = max(w // 2, 1)
  out = np.zeros((batch, length, heads, v.shape[-1]))
  for b in range(batch):
    for i in range(length):
      start = (i // w) * w
      pool = mask[b] & ((np.arange(length) < start) if causal else True)
      win = [j for j in range(max(0, start - ext), min(length, start + w + ext))
             if mask[b, j] and (j <= i or not causal)]
      if pool.any():
        probs = probs_all(scores[b], pool)                                     # [L, H, R]
        k_bar = np.einsum("lhr,lhd->rhd", probs, k_l[b])
        k_bar = layer_norm(k_bar.reshape(k_bar.shape[0], -1), p["dual_ln_s"]).reshape(k_bar.shape)
        v_bar = np.einsum("lhr,lhv->rhv", probs, v[b])
      for h in range(heads):
        keys = [k_l[b, j, h] for j in win] + (list(k_bar[:, h]) if pool.any() else [])
        values = [v[b, j, h] for j in win] + (list(v_bar[:, h]) if pool.any() else [])
        logits = np.array(keys) @ q[b, i, h] / np.sqrt(dim)
        weights = np.exp(logits - logits.max())
        out[b, i, h] = weights @ np.array(values) / weights.sum()
  return out


def randomized_params(core, q, k, v, seed=0):
  """Initial params with the layer norms' scale and bias perturbed (so DualLN is really tested)."""
  params = jax.jit(core.init)(jax.random.key(seed), q, k, v)
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(r, x.shape, x.dtype) for x, r in zip(leaves, keys)])


@pytest.mark.parametrize("length, window, causal, middle", [
    (37, 4, False, False), (45, 5, False, True), (45, 4, True, True), (23, 1, True, False)])
def test_matches_definition(x64, length, window, causal, middle):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 6)
  if middle:
    mask[1, 9:15] = False
  core = create("long_short", window_size=window, num_landmarks=3, causal=causal)
  params = randomized_params(core, q, k, v)
  out = jax.jit(lambda p, q, k, v, m: core.apply(p, q, k, v, mask=m))(params, q, k, v, mask)
  expected = reference(params, q, k, v, mask, window, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-11)


def test_window_positions():
  np.testing.assert_array_equal(long_short.window_positions(2, 4), [[-2, -1, 0, 1, 2, 3, 4, 5],
                                                                    [2, 3, 4, 5, 6, 7, 8, 9]])
  assert long_short.window_extension(1) == 1 and long_short.window_extension(8) == 4


def test_linear_in_value():
  """DualLN acts on keys only, so the core is linear in its values (the probe contract)."""
  q, k, v1 = random_qkv(2, 1, 30, 2, 4, 4)
  v2 = random_qkv(3, 1, 30, 2, 4, 4)[2]
  core = create("long_short", window_size=4, num_landmarks=4)
  params = randomized_params(core, q, k, v1)
  apply = jax.jit(lambda v: core.apply(params, q, k, v))
  np.testing.assert_allclose(apply(2.0 * v1 - v2), 2.0 * apply(v1) - apply(v2), rtol=1e-4, atol=1e-5)
