"""Skyformer and kernelized (Gaussian-kernel) attention: float64 references from the definitions,
landmarks drawn among real tokens, reproducible draws, error vs the exact kernel shrinking with M."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, random_qkv
from tests.dense_reference import key_and_causal_mask, padded_mask, run_core
from tests.test_nystromformer import numpy_pinv


def gauss(x, y):
  """exp(−‖x_p − y_r‖²/2) [..., P, R] for x [..., P, D], y [..., R, D] (float64)."""
  return np.exp(-0.5 * np.sum((x[..., :, None, :] - y[..., None, :, :]) ** 2, axis=-1))


def kernelized_reference(q, k, v, allowed):
  """Σ_j κ(q̃_i, k̃_j) v_j over allowed (query, key) pairs, allowed [B, 1, L, L]."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  scale = q.shape[-1] ** -0.25
  w = gauss(np.swapaxes(q, 1, 2) * scale, np.swapaxes(k, 1, 2) * scale) * allowed   # [B, H, L, L]
  return np.einsum("bhqk,bkhv->bqhv", w, v)


def skyformer_reference(q, k, v, mask, positions, ridge=0.1, iterations=6):
  """κ(q̃,S) D^{-1/2} Zᵀ D^{-1/2} κ(S,k̃)(v·mask), S = rows ``positions`` of [q̃; k̃]."""
  q, k, v = (np.swapaxes(np.asarray(x, np.float64), 1, 2) for x in (q, k, v))    # [B, H, L, .]
  scale = q.shape[-1] ** -0.25
  stacked = np.concatenate([q, k], axis=2) * scale
  s = np.stack([stacked[b][:, positions[b]] for b in range(len(positions))])      # [B, H, M, D]
  a = gauss(s, s) + ridge * np.eye(s.shape[2])
  d = 1 / np.sqrt(a.sum(-1))
  z = numpy_pinv(d[..., :, None] * a * d[..., None, :], iterations) if iterations else None
  inverse = d[..., :, None] * np.swapaxes(z, -1, -2) * d[..., None, :] if z is not None else np.linalg.inv(a)
  key_side = gauss(s, k * scale) * mask[:, None, None, :]
  out = gauss(q * scale, s) @ inverse @ key_side @ v
  return np.swapaxes(out, 1, 2)


def mixed_padding_mask(length):
  mask = padded_mask(2, length, 6)   # example 0 padded at the end
  mask[1, 10:19] = False             # example 1 padded in the middle
  return mask


@pytest.mark.parametrize("causal", [False, True])
def test_kernelized_matches_dense_formula(x64, causal):
  q, k, v = random_qkv(0, 2, 37, 2, 4, 3, dtype=jnp.float64)
  mask = mixed_padding_mask(37)
  out = np.asarray(run_core(create("kernelized", causal=causal), q, k, v, mask))
  expected = kernelized_reference(q, k, v, key_and_causal_mask(mask, causal))
  np.testing.assert_allclose(out[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_skyformer_matches_definition_with_its_landmarks(x64):
  length, m = 37, 10
  q, k, v = random_qkv(1, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = mixed_padding_mask(length)
  out, sown = run_core(create("skyformer", nb_features=m), q, k, v, mask, intermediates=True)
  positions = np.asarray(sown["landmarks"][0])
  assert positions.shape == (2, m)
  assert np.all(positions[:, : m // 2] < length) and np.all(positions[:, m // 2:] >= length)
  for b in range(2):                                     # landmarks are real queries / real keys
    assert np.all(mask[b][positions[b] % length])
  np.testing.assert_allclose(np.asarray(out)[mask], skyformer_reference(q, k, v, mask, positions)[mask],
                             rtol=1e-9, atol=1e-12)


def landmark_draws(core, q, k, v):
  """(jitted attention key -> sown landmarks, the landmarks drawn without an "attention" stream)."""
  sown = lambda out: out[1]["intermediates"]["landmarks"][0]
  draw = jax.jit(lambda key: sown(core.apply({}, q, k, v, rngs={"attention": key}, mutable=["intermediates"])))
  fixed = jax.jit(lambda: sown(core.apply({}, q, k, v, mutable=["intermediates"])))
  return draw, fixed


def test_skyformer_draws_are_reproducible():
  q, k, v = random_qkv(2, 1, 40, 1, 4, 4)
  draw, fixed = landmark_draws(create("skyformer", nb_features=16), q, k, v)
  np.testing.assert_array_equal(draw(jax.random.key(0)), draw(jax.random.key(0)))
  assert not np.array_equal(draw(jax.random.key(0)), draw(jax.random.key(5)))
  np.testing.assert_array_equal(fixed(), fixed())        # no stream: the fixed per-layer draw
  other_seed, _ = landmark_draws(create("skyformer", nb_features=16, redraw="fixed", seed=1), q, k, v)
  assert not np.array_equal(fixed(), other_seed(jax.random.key(0)))


def test_skyformer_error_vs_exact_kernel_shrinks_with_landmarks():
  length = 64
  q, k, v = random_qkv(3, 2, length, 2, 8, 4)
  exact = kernelized_reference(q, k, v, True)
  keys = jax.random.split(jax.random.key(0), 3)
  errors = []
  for m in (8, 32, 128):
    core = create("skyformer", nb_features=m, ridge=1e-3, pinv_iterations=20)
    outs = jax.jit(jax.vmap(lambda key: core.apply({}, q, k, v, rngs={"attention": key})))(keys)
    errors.append(np.mean([np.linalg.norm(np.asarray(o) - exact) / np.linalg.norm(exact) for o in outs]))
  assert errors[0] > errors[1] > errors[2] and errors[2] < 0.3 * errors[0], errors


def test_skyformer_has_no_causal_form():
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="landmarks"):
    create("skyformer", causal=True).apply({}, q, k, v)
