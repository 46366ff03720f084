"""Sparse-Fixed: gathers equal dense attention under the closed-form "fixed" mask (bidirectional, causal,
LRA's extra column), summary columns are counted once, and the default sizes follow the length.
Sparse-Strided (the sibling pattern in the same module): equals dense attention under the paper's
strided mask written from its definition, counts band/stride overlaps once, declares that support."""

import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import sparse_fixed
from tests.attention_probe import create, effective_matrix, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, padded_mask, run_core


def closed_form_mask(length, block_len, summary, first_column=False):
  """bool [L, L]: same block, or key column j mod l ≥ l − c (or j mod l = 0 with first_column)."""
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  allowed = (i // block_len == j // block_len) | (j % block_len >= block_len - summary)
  return allowed | ((j % block_len == 0) if first_column else False)


@pytest.mark.parametrize("length, overrides", [
    (37, {}),                                                  # derived l = 7, c = 1; last block partial
    (45, {"block_len": 9, "summary": 3, "first_column": True}),
    (45, {"block_len": 9, "summary": 3, "first_column": True, "causal": True}),  # LRA-style causal
])
def test_matches_dense_reference_under_closed_form_mask(x64, length, overrides):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 8)
  out = run_core(create("sparse_fixed", **overrides), q, k, v, mask)
  block_len, summary = sparse_fixed.pattern_sizes(length, overrides.get("block_len"),
                                                  overrides.get("summary"))
  allowed = (closed_form_mask(length, block_len, summary, overrides.get("first_column", False))
             & key_and_causal_mask(mask, overrides.get("causal", False)))
  np.testing.assert_allclose(np.asarray(out)[mask], dense_masked_attention(q, k, v, allowed)[mask],
                             rtol=1e-10, atol=1e-12)


def test_each_key_counted_once(x64):
  """With q = k = 0 the effective matrix is uniform over the support, so a key counted twice in the
  own-block and summary parts would get twice the weight of the others."""
  length, block_len, summary = 24, 6, 2
  zeros = jnp.zeros((1, length, 1, 4), jnp.float64)
  p = effective_matrix(create("sparse_fixed", block_len=block_len, summary=summary), zeros, zeros)[0]
  support = closed_form_mask(length, block_len, summary)
  assert np.all(support.sum(-1) == block_len + summary * (length // block_len - 1))
  np.testing.assert_allclose(p, support / support.sum(-1, keepdims=True), rtol=1e-12, atol=1e-15)


def test_default_sizes_follow_the_length():
  assert sparse_fixed.pattern_sizes(16) == (4, 1)
  assert sparse_fixed.pattern_sizes(1024) == (32, 8)
  assert sparse_fixed.pattern_sizes(4096) == (64, 8)
  assert sparse_fixed.pattern_sizes(1000, 50, 10) == (50, 10)  # LRA's l, c
  np.testing.assert_array_equal(sparse_fixed.summary_offsets(5, 2, True), [0, 3, 4])


def strided_definition_mask(length, block_len, causal):
  """bool [L, L] from Child et al.'s sets: A1 = {max(0, i − l) .. i}, A2 = {j : (i − j) mod l = 0}
  (causal, j ≤ i); the bidirectional form mirrors both sets (j ↔ i)."""
  allowed = np.zeros((length, length), bool)
  for i in range(length):
    for j in range(max(0, i - block_len), i + 1):
      allowed[i, j] = True
    for j in range(i % block_len, i + 1, block_len):
      allowed[i, j] = True
  return allowed if causal else allowed | allowed.T


def middle_and_end_mask(batch, length):
  mask = np.ones((batch, length), bool)
  mask[0, length - 5:] = False
  mask[1, 10:16] = False
  return mask


@pytest.mark.parametrize("length, overrides", [
    (37, {}),                                  # derived l = 7, last block partial
    (43, {"block_len": 5, "causal": True}),
])
def test_strided_matches_dense_reference_under_definition_mask(x64, length, overrides):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = middle_and_end_mask(2, length)
  out = run_core(create("sparse_strided", **overrides), q, k, v, mask)
  block_len = overrides.get("block_len") or int(np.ceil(np.sqrt(length)))
  causal = overrides.get("causal", False)
  pattern = strided_definition_mask(length, block_len, causal)
  allowed = pattern & key_and_causal_mask(mask, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], dense_masked_attention(q, k, v, allowed)[mask],
                             rtol=1e-10, atol=1e-12)
  config = create("sparse_strided", **overrides).config
  if "block_len" not in overrides:
    np.testing.assert_array_equal(config.support(length), pattern)


def test_strided_each_key_counted_once(x64):
  """q = k = 0: uniform weights over the pattern; a key in both band and stride would weigh double."""
  length, block_len = 30, 4
  zeros = jnp.zeros((1, length, 1, 4), jnp.float64)
  p = effective_matrix(create("sparse_strided", block_len=block_len), zeros, zeros)[0]
  support = strided_definition_mask(length, block_len, False)
  np.testing.assert_allclose(p, support / support.sum(-1, keepdims=True), rtol=1e-12, atol=1e-15)


def lra_cls_mask(length, block_len, summary, causal):
  """bool [L, L] as LRA built it with ``use_cls_token`` (``sparse_attention.py``): the fixed pattern
  with the first column on positions 1..L−1 (ANDed with j ≤ i when causal), then a first row and a
  first column of ones."""
  rest = closed_form_mask(length - 1, block_len, summary, first_column=True)
  if causal:
    rest = rest & np.tril(np.ones((length - 1, length - 1), bool))
  return np.pad(rest, ((1, 0), (1, 0)), constant_values=True)


@pytest.mark.parametrize("length, overrides", [
    (41, {"block_len": 8, "summary": 2, "causal": True}),   # LRA's form: causal, first column, CLS
    (41, {"block_len": 8, "summary": 2}),
    (30, {}),                                                 # derived l, c on the L − 1 positions
])
def test_cls_token_matches_lra_mask(x64, length, overrides):
  """``cls_token=True``: dense float64 attention under LRA's CLS-padded mask, with key padding."""
  overrides = {"first_column": True, "cls_token": True, **overrides}
  q, k, v = random_qkv(3, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 7)
  out = run_core(create("sparse_fixed", **overrides), q, k, v, mask)
  block_len, summary = sparse_fixed.pattern_sizes(length - 1, overrides.get("block_len"),
                                                  overrides.get("summary"))
  allowed = (lra_cls_mask(length, block_len, summary, overrides.get("causal", False))
             & key_and_causal_mask(mask, False))
  np.testing.assert_allclose(np.asarray(out)[mask], dense_masked_attention(q, k, v, allowed)[mask],
                             rtol=1e-10, atol=1e-12)


def test_cls_token_row_sees_every_key_and_is_seen_by_every_query(x64):
  """With q = k = 0 the weights are uniform over the support: the CLS row is 1/L everywhere, every row
  gives the CLS column a non-zero weight; without ``cls_token`` the CLS row covers far fewer keys."""
  length = 60
  zeros = jnp.zeros((1, length, 1, 4), jnp.float64)
  cfg = dict(block_len=10, summary=2, first_column=True)
  p = effective_matrix(create("sparse_fixed", cls_token=True, **cfg), zeros, zeros)[0]
  np.testing.assert_allclose(p[0], np.full(length, 1 / length), rtol=1e-12)
  assert np.all(p[:, 0] > 0)
  plain = effective_matrix(create("sparse_fixed", **cfg), zeros, zeros)[0]
  assert np.count_nonzero(plain[0]) == 10 + 3 * 5   # own block + 3 summary columns of the 5 others


def test_cls_token_single_position(x64):
  q, k, v = random_qkv(1, 1, 1, 2, 4, 3, dtype=jnp.float64)
  out = run_core(create("sparse_fixed", cls_token=True), q, k, v)
  np.testing.assert_allclose(np.asarray(out), np.asarray(v), rtol=1e-12)
