"""Local attention: blockwise output equals dense attention under the group mask (contiguous blocks and
LRA's strided reshape), causal inside a group, LRA's always-pad rule, declared support."""

import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import local
from tests.attention_probe import create, effective_matrix, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, run_core


def end_and_middle_mask(batch, length):
  """bool [B, L]: example 0 padded at the end, example 1 in the middle."""
  mask = np.ones((batch, length), bool)
  mask[0, length - 6:] = False
  mask[1, 11:15] = False
  return mask


def group_mask(length, size, grouping):
  """bool [L, L] from the definitions: consecutive blocks of S, or LRA's reshape of the padded
  positions to [S, N] with attention along S (a group = one column of that reshape)."""
  if grouping == "contiguous":
    group = np.arange(length) // size
  else:
    padded = length + size - length % size
    columns = np.arange(padded).reshape(size, padded // size)
    group = np.argsort(columns.T.reshape(-1)) // size  # position -> index of its column
    group = group[:length]
  return group[:, None] == group[None, :]


@pytest.mark.parametrize("length, size, grouping, causal", [
    (37, 5, "contiguous", False),
    (37, 5, "contiguous", True),
    (37, 5, "lra_strided", False),
    (35, 5, "lra_strided", True),   # S divides L: LRA still adds a whole block (N = 8, not 7)
])
def test_matches_dense_reference_under_group_mask(x64, length, size, grouping, causal):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(2, length)
  out = run_core(create("local", block_size=size, grouping=grouping, causal=causal), q, k, v, mask)
  allowed = group_mask(length, size, grouping) & key_and_causal_mask(mask, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], dense_masked_attention(q, k, v, allowed)[mask],
                             rtol=1e-10, atol=1e-12)


def test_strided_groups_are_residues_mod_num_blocks():
  # L = 35, S = 5: LRA pads to 40, N = 8 groups of the tokens t ≡ r (mod 8).
  np.testing.assert_array_equal(local.group_index(35, 5, "lra_strided"), np.arange(35) % 8)
  np.testing.assert_array_equal(local.group_index(37, 5, "contiguous"), np.arange(37) // 5)
  assert local.padded_length(40, 5, "lra_strided") == 45 and local.padded_length(40, 5, "contiguous") == 40


@pytest.mark.parametrize("grouping", local.GROUPINGS)
def test_support_is_the_group_mask_and_filled(x64, grouping):
  """With q = k = 0 the probe is uniform over the declared support: every in-group key is used once."""
  length, size = 23, 4
  support = local.LocalConfig(block_size=size, grouping=grouping).support(length)
  np.testing.assert_array_equal(support, group_mask(length, size, grouping))
  zeros = jnp.zeros((1, length, 1, 4), jnp.float64)
  p = effective_matrix(create("local", block_size=size, grouping=grouping), zeros, zeros)[0]
  np.testing.assert_allclose(p, support / support.sum(-1, keepdims=True), rtol=1e-12, atol=1e-15)


def test_invalid_options_are_rejected():
  with pytest.raises(ValueError, match="grouping"):
    local.LocalConfig(grouping="rows")
  with pytest.raises(ValueError, match="block_size"):
    local.LocalConfig(block_size=0)
