"""H-Transformer-1D: equals the H-matrix definition (dense float64: exact weights on the level-0 diagonal
and sibling blocks, exp(mean q · mean k) of the pair's coarse groups at the level where their blocks are
siblings, one row normalisation) with padding at the end and in the middle; every pair is covered once;
exact when everything fits in two blocks; no causal form."""

import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import h_transformer_1d
from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, padded_mask, run_core


def pair_levels(padded_length, block):
  """int [Lp, Lp]: the level that covers pair (i, j) (0 for the diagonal and sibling Nr-blocks)."""
  i, j = np.arange(padded_length)[:, None], np.arange(padded_length)[None, :]
  level = np.full((padded_length, padded_length), -1)
  level[(i // block == j // block) | ((i // block) ^ 1 == j // block)] = 0
  l = 1
  while (block << l) <= padded_length // 2:
    size = block << l
    level[(level < 0) & ((i // size) ^ 1 == j // size)] = l
    l += 1
  return level


def reference(q, k, v, mask, block):
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, length, heads, dim = q.shape
  padded = block * 2 ** h_transformer_1d.num_levels(length, block)
  pad = lambda x, value=0: np.concatenate([x, np.full((batch, padded - length, *x.shape[2:]), value)], 1)
  q, k, v, m = pad(q), pad(k), pad(v), pad(np.asarray(mask), False)
  levels = pair_levels(padded, block)
  a = np.zeros((batch, heads, padded, padded))
  for l in range(levels.max() + 1):
    g = 2 ** l
    real = m.reshape(batch, -1, g).sum(-1)                                       # [B, L/g]
    mean = lambda x: ((x * m[..., None, None]).reshape(batch, -1, g, heads, dim).sum(2)
                      / np.maximum(real, 1)[..., None, None])
    coarse = np.exp(np.einsum("bqhd,bkhd->bhqk", mean(q), mean(k)) / np.sqrt(dim))
    fine = np.repeat(np.repeat(coarse, g, axis=2), g, axis=3)                   # back to pairs
    a = np.where(levels == l, fine, a)
  a = a * m[:, None, None, :]
  out = np.einsum("bhqk,bkhv->bqhv", a / a.sum(-1, keepdims=True), v)
  return out[:, :length]


def test_every_pair_covered_once():
  levels = pair_levels(64, 4)
  assert np.all(levels >= 0) and levels.max() == 3
  assert np.all(levels == levels.T)


@pytest.mark.parametrize("length, block, middle", [(37, 4, False), (45, 4, True), (29, 3, True)])
def test_matches_definition(x64, length, block, middle):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 7)
  if middle:
    mask[1, 5:12] = False  # a whole coarse group padded, and partial groups
  out = run_core(create("h_transformer_1d", block_size=block), q, k, v, mask)
  expected = reference(q, k, v, mask, block)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_two_blocks_are_exact_softmax(x64):
  q, k, v = random_qkv(1, 2, 30, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, 30, 4)
  out = run_core(create("h_transformer_1d", block_size=16), q, k, v, mask)
  expected = dense_masked_attention(q, k, v, key_and_causal_mask(mask, False))
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_coarse_blocks_are_constant_per_group(x64):
  """Far off the diagonal the probe is constant on each (query group, key group) of its level."""
  q, k, _ = random_qkv(2, 1, 32, 1, 4, 1, dtype=jnp.float64)
  eye = jnp.eye(32, dtype=jnp.float64)[None, :, None, :]
  p = np.asarray(run_core(create("h_transformer_1d", block_size=4), q, k, eye))[0, :, 0]
  block = p[16:24, 0:8]                                    # level 2: groups of 4 -> 2x2 constant tiles
  rescaled = block / block.sum(-1, keepdims=True)
  np.testing.assert_allclose(rescaled[:4], np.broadcast_to(rescaled[:4].mean(0), (4, 8)), rtol=1e-12)
  np.testing.assert_allclose(block[:, :4], np.broadcast_to(block[:, :1], (8, 4)), rtol=1e-12)


def test_causal_is_not_implemented():
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="causal"):
    run_core(create("h_transformer_1d", causal=True), q, k, v)
