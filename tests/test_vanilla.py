"""Vanilla attention equals a naive softmax reference, with padding and causal masks (float64)."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, effective_matrix, init_and_apply, random_qkv


def naive_attention(q, k, v, mask, causal):
  q, k, v, mask = (np.asarray(x, np.float64) for x in (q, k, v, mask))
  batch, length, heads, dim = q.shape
  out = np.zeros(v.shape)
  for b in range(batch):
    for h in range(heads):
      for i in range(length):
        allowed = mask[b].astype(bool) & ((np.arange(length) <= i) if causal else True)
        logits = np.array([q[b, i, h] @ k[b, j, h] / np.sqrt(dim) for j in range(length)])
        w = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
        out[b, i, h] = (w / w.sum()) @ v[b, :, h]
  return out


@pytest.mark.parametrize("causal", [False, True])
def test_vanilla_matches_naive_reference(x64, causal):
  q, k, v = random_qkv(0, 2, 11, 2, 4, 3, dtype=jnp.float64)
  mask = np.ones((2, 11), bool)
  mask[1, 7:] = False
  out, _ = init_and_apply(create("vanilla", causal=causal), q, k, v, jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(out)[mask], naive_attention(q, k, v, mask, causal)[mask],
                             rtol=1e-10, atol=1e-12)


def test_identity_probe_gives_row_stochastic_matrix():
  q, k, _ = random_qkv(1, 1, 16, 1, 8, 1)
  p = effective_matrix(create("vanilla"), q, k)[0]
  assert p.shape == (16, 16)
  assert np.all(p > 0)
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
