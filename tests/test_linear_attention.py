"""The shared feature-map attention (attention_zoo._linear_attention) against its dense definition:
bidirectional and causal, per-key log scales with a causal running max, key dropout, padding at the end
and in the middle, chunks that do not divide the length."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import _linear_attention as linear_attention

LENGTH, FEATURES = 29, 5


def dense_feature_attention(qf, kf, v, mask, causal, keep=None, log_scale=None, eps=0.0, clamp=None):
  """w_ij = φ(q_i)·φ(k_j)·exp(r_j) over real (and, if causal, j ≤ i) keys; out = Σ_j w_ij keep_j v_j /
  (Σ_j w_ij + eps), clamped below at ``clamp``. Dense numpy float64 with an explicit L×L matrix."""
  qf, kf, v = (np.asarray(x, np.float64) for x in (qf, kf, v))
  r = np.zeros(kf.shape[:3]) if log_scale is None else np.asarray(log_scale, np.float64)
  allowed = np.broadcast_to(np.asarray(mask, bool)[:, None, :], (qf.shape[0], qf.shape[1], qf.shape[1]))
  if causal:
    allowed = allowed & np.tril(np.ones(allowed.shape[1:], bool))
  weights = np.einsum("bqhm,bkhm->bqkh", qf, kf) * np.exp(r)[:, None]
  weights = np.where(allowed[..., None], weights, 0.0)
  den = weights.sum(2) + eps
  if clamp is not None:
    den = np.maximum(den, clamp)
  keep = np.ones(kf.shape[:3]) if keep is None else np.asarray(keep, np.float64)
  num = np.einsum("bqkh,bkh,bkhv->bqhv", weights, keep, v)
  return num / np.where(den == 0, 1.0, den)[..., None]


def _inputs(seed, log_range=0.0):
  rng = np.random.default_rng(seed)
  qf = rng.uniform(0.1, 1.0, (2, LENGTH, 2, FEATURES))
  kf = rng.uniform(0.1, 1.0, (2, LENGTH, 2, FEATURES))
  v = rng.normal(size=(2, LENGTH, 2, 3))
  keep = rng.choice([0.0, 2.0], size=(2, LENGTH, 2))
  log_scale = rng.uniform(-log_range, log_range, (2, LENGTH, 2))
  mask = np.ones((2, LENGTH), bool)
  mask[0, -6:] = False      # padding at the end
  mask[1, 9:14] = False     # padding in the middle
  return qf, kf, v, keep, log_scale, mask


@pytest.mark.parametrize("causal", [False, True])
def test_equals_dense_definition(x64, causal):
  """Log scales spanning ±300 (weights spanning 1e260; in float32 exp would overflow without the
  running max) and numerator-only key dropout; chunk 8 at L = 29 (last chunk partial)."""
  qf, kf, v, keep, log_scale, mask = _inputs(0, log_range=300.0)
  run = jax.jit(lambda *a: linear_attention.feature_attention(*a[:4], causal=causal, chunk=8, keep=a[4],
                                                              k_log_scale=a[5]))
  out = np.asarray(run(qf, kf, v, mask, keep, log_scale))
  expected = dense_feature_attention(qf, kf, v, mask, causal, keep, log_scale)
  np.testing.assert_allclose(out[mask], expected[mask], rtol=1e-10, atol=1e-12)
  assert np.all(np.isfinite(out))


@pytest.mark.parametrize("causal", [False, True])
def test_eps_and_clamp_placement(x64, causal):
  qf, kf, v, _, _, mask = _inputs(1)
  qf = qf * 1e-4  # small denominators, so eps and the clamp matter
  for kwargs in (dict(eps=1e-5), dict(clamp=1e-5)):
    run = jax.jit(functools.partial(linear_attention.feature_attention, causal=causal, chunk=8, **kwargs))
    out = run(qf, kf, v, mask)
    expected = dense_feature_attention(qf, kf, v, mask, causal, **kwargs)
    np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_causal_running_max_is_strictly_causal():
  """A huge future log scale must not change past outputs, not even by underflow (float32)."""
  qf, kf, v, _, log_scale, mask = (jnp.asarray(x, jnp.float32) for x in _inputs(2, log_range=5.0))
  mask = np.ones((2, LENGTH), bool)
  run = jax.jit(lambda r: linear_attention.feature_attention(qf, kf, v, mask, causal=True, chunk=8,
                                                             k_log_scale=r))
  cut = 12  # inside the second chunk
  base, bumped = run(log_scale), run(log_scale.at[:, cut:].add(1e4))
  np.testing.assert_array_equal(np.asarray(base)[:, :cut], np.asarray(bumped)[:, :cut])
  assert np.all(np.isfinite(np.asarray(bumped)))


def test_positional_blocks():
  features = jnp.arange(2 * 3 * 1 * 2, dtype=jnp.float32).reshape(2, 3, 1, 2)
  weights = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  blocks = np.asarray(linear_attention.positional_blocks(features, weights))
  assert blocks.shape == (2, 3, 1, 4)
  np.testing.assert_array_equal(blocks[..., :2], np.asarray(features) * np.asarray(weights)[None, :, None, :1])
  np.testing.assert_array_equal(blocks[..., 2:], np.asarray(features) * np.asarray(weights)[None, :, None, 1:])


@pytest.mark.parametrize("causal", [False, True])
def test_heads_first_layout_and_no_mask_equal_the_default(x64, causal):
  """[B, H, L, ...] inputs give the same result as [B, L, H, ...] (with padding, dropout and log
  scales); mask None equals an all-True mask."""
  qf, kf, v, keep, log_scale, mask = _inputs(3, log_range=30.0)
  kwargs = dict(causal=causal, chunk=8)
  default = np.asarray(linear_attention.feature_attention(qf, kf, v, mask, keep=keep, k_log_scale=log_scale,
                                                          **kwargs))
  swap = lambda x: np.swapaxes(x, 1, 2)
  heads_first = linear_attention.feature_attention(swap(qf), swap(kf), swap(v), mask, keep=swap(keep),
                                                   k_log_scale=swap(log_scale), heads_first=True, **kwargs)
  np.testing.assert_allclose(swap(np.asarray(heads_first))[mask], default[mask], rtol=1e-12, atol=1e-14)
  everyone = np.ones_like(mask)
  for layout in (False, True):
    fix = swap if layout else (lambda x: x)
    args = (fix(qf), fix(kf), fix(v))
    no_mask = linear_attention.feature_attention(*args, None, keep=fix(keep), heads_first=layout, **kwargs)
    all_real = linear_attention.feature_attention(*args, everyone, keep=fix(keep), heads_first=layout,
                                                  **kwargs)
    np.testing.assert_allclose(np.asarray(no_mask), np.asarray(all_real), rtol=1e-12)
