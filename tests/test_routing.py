"""Routing attention: equals a float64 reference built from the definition (each centroid's top-W real
tokens, softmax inside every window without self unless alone, mean over a token's windows, own value
for unchosen tokens) with padding at the end and in the middle; centroids move only in training, by the
shared EMA k-means rule; no causal form; the key is ignored."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import routing
from tests.attention_probe import create, random_qkv


def init_apply(core, q, k, v, mask=None, variables=None, **kwargs):
  if variables is None:
    variables = jax.jit(lambda *a: core.init({"params": jax.random.key(0)}, *a))(q, k, v, mask)
  apply = jax.jit(lambda var, *a: core.apply(var, *a, **kwargs))
  return apply(variables, q, k, v, mask), variables


def unit(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)


def routing_reference(q, v, mask, means):
  """float64 numpy routing attention: q [B, L, H, D], v [B, L, H, V], means [H, K, D]."""
  q, v, means = (np.asarray(x, np.float64) for x in (q, v, means))
  batch, length, heads, dim = q.shape
  clusters = means.shape[1]
  width = min(length, -(-length // clusters))
  out = np.zeros((batch, length, heads, v.shape[-1]))
  for b in range(batch):
    for h in range(heads):
      scores = unit(q[b, :, h]) @ means[h].T                            # [L, K]
      outs = [[] for _ in range(length)]
      for c in range(clusters):
        rank = np.where(mask[b], scores[:, c], -np.inf)
        window = np.sort(np.argsort(-rank, kind="stable")[:width])
        real = window[mask[b, window]]
        for i in window:
          keys = [j for j in real if j != i] or [i]
          logits = np.array([q[b, i, h] @ unit(q[b, j, h]) for j in keys]) / np.sqrt(dim)
          w = np.exp(logits - logits.max())
          outs[i].append(w @ v[b, keys, h] / w.sum())
      for i in range(length):
        out[b, i, h] = np.mean(outs[i], 0) if outs[i] else v[b, i, h]
  return out


@pytest.mark.parametrize("length, overrides", [(37, {}), (29, {"num_clusters": 3}),
                                               (23, {"num_clusters": 8})])
def test_matches_reference_from_the_definition(x64, length, overrides):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = np.ones((2, length), bool)
  mask[0, -6:] = False
  mask[1, length // 2:length // 2 + 4] = False
  out, variables = init_apply(create("routing", **overrides), q, k, v, mask)
  means = variables["centroids"]["means"]
  assert means.shape[1] == overrides.get("num_clusters", int(np.ceil(np.sqrt(length))))
  np.testing.assert_allclose(np.asarray(out)[mask], routing_reference(q, v, mask, means)[mask],
                             rtol=1e-9, atol=1e-12)


def test_key_argument_is_ignored():
  q, k, v = random_qkv(1, 1, 24, 2, 4, 3)
  core = create("routing")
  out, variables = init_apply(core, q, k, v)
  np.testing.assert_array_equal(out, init_apply(core, q, 3.0 * k - 1.0, v, variables=variables)[0])


def test_centroids_move_only_in_training_by_the_ema_rule(x64):
  core = create("routing", num_clusters=3, decay=0.5)
  q, k, v = random_qkv(2, 2, 20, 2, 4, 3, dtype=jnp.float64)
  mask = np.ones((2, 20), bool)
  mask[0, 15:] = False
  _, variables = init_apply(core, q, k, v, mask)
  means = np.asarray(variables["centroids"]["means"])
  (_, frozen), _ = init_apply(core, q, k, v, mask, variables, deterministic=True, mutable=["centroids"])
  np.testing.assert_array_equal(frozen["centroids"]["means"], means)     # evaluation: no update
  (_, updates), _ = init_apply(core, q, k, v, mask, variables, deterministic=False,
                               mutable=["centroids"])
  feats = unit(np.asarray(q))                                            # [B, L, H, D]
  expected = means.copy()
  for h in range(2):
    x = feats[:, :, h][mask]                                             # real tokens of the batch
    nearest = np.argmax(x @ means[h].T, -1)
    for c in range(3):
      if np.any(nearest == c):
        expected[h, c] = unit(0.5 * means[h, c] + 0.5 * x[nearest == c].mean(0))
  np.testing.assert_allclose(updates["centroids"]["means"], expected, rtol=1e-9)


def test_windows_are_balanced_and_prefer_real_tokens():
  scores = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (1, 1, 10, 2)))
  mask = jnp.asarray([[True] * 7 + [False] * 3])
  index = np.asarray(routing.top_windows(scores, mask, 5))[0, 0]
  assert index.shape == (2, 5) and np.all(np.diff(index, axis=-1) > 0)
  assert np.all(index < 7)                                              # real tokens first
  for c in range(2):
    assert set(np.argsort(-np.asarray(scores[0, 0, :7, c]))[:5]) == set(index[c])
  assert routing.window_size(37, 7) == 6 and routing.window_size(5, 1) == 5


def test_no_causal_form():
  q, k, v = random_qkv(3, 1, 16, 1, 4, 3)
  with pytest.raises(NotImplementedError, match="causal"):
    init_apply(create("routing", causal=True), q, k, v)
