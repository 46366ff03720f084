"""Efficient Attention: equals ρ_q(Q) ρ_k(K)ᵀ V from its definition (softmax over features of each query,
masked softmax over the length of each key feature), rows of P sum to 1, no causal form."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, effective_matrix, init_and_apply, random_qkv
from tests.dense_reference import padded_mask, run_core


def dense_efficient_attention(q, k, v, mask):
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  rho_q = np.exp(q - q.max(-1, keepdims=True))
  rho_q /= rho_q.sum(-1, keepdims=True)
  real = np.asarray(mask, bool)[:, :, None, None]
  logits = np.where(real, k, -np.inf)
  rho_k = np.where(real, np.exp(logits - logits.max(1, keepdims=True)), 0.0)
  rho_k /= rho_k.sum(1, keepdims=True)
  p = np.einsum("bqhd,bkhd->bhqk", rho_q, rho_k)
  return np.einsum("bhqk,bkhv->bqhv", p, v), p


def test_equals_definition(x64):
  length = 37
  q, k, v = random_qkv(0, 2, length, 2, 6, 5, dtype=jnp.float64, scale=2.0)
  mask = padded_mask(2, length, 9)
  mask[1, 10:17] = False  # padding in the middle
  out = run_core(create("efficient_attention"), q, k, v, mask)
  expected, p = dense_efficient_attention(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)  # the definition's rows sum to 1


def test_effective_matrix_rows_sum_to_one(x64):
  q, k, _ = random_qkv(1, 1, 23, 1, 8, 1, dtype=jnp.float64, scale=3.0)
  p = effective_matrix(create("efficient_attention"), q, k)
  assert np.all(p >= 0)
  np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)


def test_causal_raises():
  q, k, v = random_qkv(2, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="key softmax"):
    init_and_apply(create("efficient_attention", causal=True), q, k, v)
