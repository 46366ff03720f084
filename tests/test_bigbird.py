"""BigBird: block-gather output equals dense attention under the closed-form mask; sampler invariants."""

import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import bigbird
from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, padded_mask, run_core


def closed_form_mask(length, size, rand):
  """bool [H, L, L] from the module docstring: global blocks, |Δblock| ≤ 1, or a random block."""
  num_blocks = -(-length // size)
  b = np.arange(length) // size
  bi, bj = b[:, None], b[None, :]
  fixed = np.isin(bi, [0, num_blocks - 1]) | np.isin(bj, [0, num_blocks - 1]) | (np.abs(bi - bj) <= 1)
  randoms = np.stack([[np.isin(b, rand[h, row]) for row in b] for h in range(rand.shape[0])])
  return fixed[None] | randoms


@pytest.mark.parametrize("length, block_size, causal", [
    (37, None, False),  # derived block size 5: 8 blocks, last one partial
    (37, None, True),
    (22, 5, False),     # 5 blocks: rows with fewer than r candidates
    (16, 8, True),      # 2 blocks: all global
])
def test_matches_dense_reference_under_closed_form_mask(x64, length, block_size, causal):
  heads = 2
  q, k, v = random_qkv(0, 2, length, heads, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 6)
  core = create("bigbird", block_size=block_size, causal=causal, seed=7)
  out, sown = run_core(core, q, k, v, mask, intermediates=True)
  size = block_size or bigbird.default_block_size(length)
  num_blocks = -(-length // size)
  rand = np.asarray(sown["random_blocks"][0])
  np.testing.assert_array_equal(rand, bigbird.random_blocks(num_blocks, 3, heads, [7, 0], causal=causal))
  allowed = closed_form_mask(length, size, rand)[None] & key_and_causal_mask(mask, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], dense_masked_attention(q, k, v, allowed)[mask],
                             rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_blocks", [3, 5, 8, 16, 33])
def test_sampler_invariants(num_blocks, causal):
  r, heads = 3, 4
  rand = bigbird.random_blocks(num_blocks, r, heads, 11, causal=causal)
  assert rand.shape == (heads, num_blocks, r)
  assert np.all(rand[:, [0, -1]] == -1)  # global rows draw nothing
  for h in range(heads):
    for b in range(1, num_blocks - 1):
      drawn = rand[h, b][rand[h, b] >= 0]
      top = b - 2 if causal else num_blocks - 2
      candidates = [j for j in range(1, top + 1) if abs(j - b) > 1]
      assert len(drawn) == min(r, len(candidates)) and np.all(rand[h, b][len(drawn):] == -1)
      assert len(set(drawn)) == len(drawn)                      # distinct
      assert set(drawn) <= set(candidates)                       # not window, not global, past if causal
  np.testing.assert_array_equal(rand, bigbird.random_blocks(num_blocks, r, heads, 11, causal=causal))
  if num_blocks >= 16:
    assert any(not np.array_equal(rand[0], rand[h]) for h in range(1, heads))   # heads differ
    assert not np.array_equal(rand, bigbird.random_blocks(num_blocks, r, heads, 12, causal=causal))


def test_random_block_span_cap():
  rand = bigbird.random_blocks(40, 3, 2, 0, last_block=15)  # the original's 1024-token cap at S = 64
  assert rand.max() <= 15
  assert np.all((rand[:, 1:-1] >= 1).sum(-1) == 3)


def test_key_blocks_of_a_middle_query_block_are_never_duplicated():
  rand = bigbird.random_blocks(12, 3, 3, 5)
  index, valid, _ = bigbird._local_layout(rand, False, 4)
  for h in range(3):
    for row in range(index.shape[1]):
      block = row + 1
      local = np.concatenate([[block - 1, block, block + 1], index[h, row]])[valid[h, row]]
      chosen = [0, 11, *local]                              # the two global blocks, then the local ones
      assert len(set(chosen)) == len(chosen)
      assert {0, 11, block - 1, block, block + 1} <= set(chosen)


def test_causal_slot_pattern():
  rand = bigbird.random_blocks(12, 2, 1, 5, causal=True)
  _, _, slots = bigbird._local_layout(rand, True, 3)          # [S, K·S], K = 3 + 2
  slots = slots.reshape(3, 5, 3)
  np.testing.assert_array_equal(slots[:, 0], np.ones((3, 3), bool))        # block b−1: past
  np.testing.assert_array_equal(slots[:, 1], np.tril(np.ones((3, 3), bool)))
  np.testing.assert_array_equal(slots[:, 2], np.zeros((3, 3), bool))       # block b+1: future
  assert slots[:, 3:].all()                                                # random blocks ≤ b−2
