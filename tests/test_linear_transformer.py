"""Linear Transformer: equals its quadratic form P = φ(Q)φ(K)ᵀ / (row sum + eps), φ = elu + 1, exactly in
float64, bidirectional and causal, with padding at the end and in the middle."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, random_qkv
from tests.dense_reference import padded_mask, run_core


def quadratic_linear_transformer(q, k, v, mask, causal, eps=1e-6):
  """Dense float64: P_ij = φ(q_i)·φ(k_j) / (Σ_j φ(q_i)·φ(k_j) + eps) over allowed j; out = P V."""
  phi = lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))) + 1.0   # elu(x) + 1
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  scores = np.einsum("bqhd,bkhd->bhqk", phi(q), phi(k))
  allowed = np.asarray(mask, bool)[:, None, None, :]
  if causal:
    allowed = allowed & np.tril(np.ones(scores.shape[-2:], bool))
  scores = np.where(allowed, scores, 0.0)
  return np.einsum("bhqk,bkhv->bqhv", scores / (scores.sum(-1, keepdims=True) + eps), v)


@pytest.mark.parametrize("causal", [False, True])
def test_equals_quadratic_form(x64, causal):
  length = 37
  q, k, v = random_qkv(0, 2, length, 2, 6, 5, dtype=jnp.float64)
  mask = padded_mask(2, length, 9)
  mask[1, 10:17] = False  # padding in the middle
  out = run_core(create("linear_transformer", causal=causal, causal_chunk=8), q, k, v, mask)
  expected = quadratic_linear_transformer(q, k, v, mask, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_eps_is_added_to_the_denominator(x64):
  """Small features make the default eps (1e-6) visible: the output is scaled by den / (den + eps)."""
  q, k, v = random_qkv(1, 1, 17, 1, 4, 3, dtype=jnp.float64)
  q, k = q - 10.0, k - 10.0  # elu(x) + 1 ≈ e^x: features ~5e-5, denominators ~1e-7
  mask = np.ones((1, 17), bool)
  out = run_core(create("linear_transformer"), q, k, v, mask)
  expected = quadratic_linear_transformer(q, k, v, mask, False, eps=1e-6)
  without = quadratic_linear_transformer(q, k, v, mask, False, eps=0.0)
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-9)
  assert not np.allclose(expected, without, rtol=1e-3)
