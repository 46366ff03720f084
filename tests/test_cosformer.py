"""cosFormer: equals its definition w_ij = relu(q_i)·relu(k_j)·cos(π(i − j)/2L), out_i = Σ_j w_ij v_j /
max(Σ_j w_ij, 1e-6), bidirectional and causal, padding at the end and in the middle; what the clamp does
to the rows."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, effective_matrix, random_qkv
from tests.dense_reference import padded_mask, run_core


def dense_cosformer(q, k, v, mask, causal, eps=1e-6):
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  length = q.shape[1]
  i = np.arange(length)
  decay = np.cos(np.pi * (i[:, None] - i[None, :]) / (2 * length))         # [Q, K]
  weights = np.einsum("bqhd,bkhd->bhqk", np.maximum(q, 0), np.maximum(k, 0)) * decay
  allowed = np.asarray(mask, bool)[:, None, None, :]
  if causal:
    allowed = allowed & np.tril(np.ones((length, length), bool))
  weights = np.where(allowed, weights, 0.0)
  p = weights / np.maximum(weights.sum(-1, keepdims=True), eps)
  return np.einsum("bhqk,bkhv->bqhv", p, v), p


@pytest.mark.parametrize("causal", [False, True])
def test_equals_definition(x64, causal):
  length = 37
  q, k, v = random_qkv(0, 2, length, 2, 6, 5, dtype=jnp.float64)
  mask = padded_mask(2, length, 9)
  mask[1, 10:17] = False  # padding in the middle: real positions keep their index
  out = run_core(create("cosformer", causal=causal, causal_chunk=8), q, k, v, mask)
  expected, _ = dense_cosformer(q, k, v, mask, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_rows_sum_to_one_unless_clamped(x64):
  """A query with relu(q) = 0 has a clamped denominator and a zero row (why rows_sum_to_one = False)."""
  length = 29
  q, k, _ = random_qkv(1, 1, length, 1, 8, 1, dtype=jnp.float64)
  q = q.at[0, 5].set(-jnp.abs(q[0, 5]))  # query 5: every coordinate negative
  p = effective_matrix(create("cosformer"), q, k)[0]
  assert np.all(p >= 0)
  np.testing.assert_array_equal(p[5], 0.0)
  others = np.arange(length) != 5
  np.testing.assert_allclose(p[others].sum(-1), 1.0, rtol=1e-12)
  _, expected = dense_cosformer(q, k, jnp.eye(length)[None, :, None], np.ones((1, length), bool), False)
  np.testing.assert_allclose(p, expected[0, 0], rtol=1e-10, atol=1e-14)
