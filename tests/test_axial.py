"""Axial: every mode equals its dense reference built from closed-form row/column masks (float64),
with padding and causal; the union counts self once."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, effective_matrix, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, padded_mask, run_core


def row_col_masks(length, width):
  """(same row, same column) bool [L, L] on the row-major grid of ``width`` columns."""
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  return i // width == j // width, i % width == j % width


def dense_axial(q, k, v, mask, causal, mode, width):
  """Dense reference for each mode (numpy float64) [B, L, H, V]."""
  same_row, same_col = row_col_masks(q.shape[1], width)
  base = key_and_causal_mask(mask, causal)
  if mode == "union":
    return dense_masked_attention(q, k, v, base & (same_row | same_col))
  row = lambda values: dense_masked_attention(q, k, values, base & same_row)
  col = lambda values: dense_masked_attention(q, k, values, base & same_col)
  return {"row": lambda: row(v), "column": lambda: col(v), "alternating": lambda: col(row(v)),
          "parallel": lambda: 0.5 * (row(v) + col(v))}[mode]()


@pytest.mark.parametrize("mode, causal, width", [
    ("union", False, None),   # 37 -> 7 columns x 6 rows, last row partial
    ("union", True, None),
    ("union", False, 5),      # configured width (images)
    ("alternating", False, None),
    ("alternating", True, None),
    ("parallel", False, None),
])
def test_matches_dense_reference(x64, mode, causal, width):
  length = 37
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 8)
  out = run_core(create("axial", mode=mode, causal=causal, width=width), q, k, v, mask)
  expected = dense_axial(q, k, v, mask, causal, mode, width or 7)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_union_counts_self_once(x64):
  """q = k = 0: uniform weight 1/(n + m − 1) on the row and column of each query, self included once."""
  zeros = jnp.zeros((1, 36, 1, 4), jnp.float64)
  p = effective_matrix(create("axial"), zeros, zeros)[0]
  same_row, same_col = row_col_masks(36, 6)
  np.testing.assert_allclose(p, (same_row | same_col) / 11.0, rtol=1e-12, atol=1e-15)
