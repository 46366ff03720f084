"""Informer ProbSparse attention: the selection is the top-u of the sparsity measurement recomputed in
float64 from the sown samples; active rows equal dense softmax, lazy rows the mean of the real values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import informer
from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, padded_mask, run_core


def test_sample_and_top_counts():
  assert [informer.top_count(n, 5) for n in (16, 37, 1000, 4096)] == [15, 20, 35, 45]
  assert informer.top_count(37, 1) == 4


@pytest.mark.parametrize("heads", [1, 2])
def test_matches_definition_with_padding_at_end_and_in_middle(x64, heads):
  length = 37
  q, k, v = random_qkv(heads, 2, length, heads, 4, 3, dtype=jnp.float64, scale=1.5)
  mask = padded_mask(2, length, 6)
  mask[1, 8:17] = False
  out, sown = run_core(create("informer"), q, k, v, mask, intermediates=True)
  samples, active = np.asarray(sown["sampled_keys"][0]), np.asarray(sown["active_queries"][0])
  top = informer.top_count(length, 5)
  assert samples.shape == (2, length, top) and active.shape == (2, heads, top)
  q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
  dense = dense_masked_attention(q, k, v, key_and_causal_mask(mask, False))
  for b in range(2):
    assert np.all(mask[b][samples[b]])                               # only real keys are sampled
    lazy = v64[b][mask[b]].mean(0)                                     # [H, V]
    for h in range(heads):
      s = np.einsum("ld,lud->lu", q64[b, :, h], k64[b][samples[b], h]) / 2.0   # √D = 2
      measure = np.where(mask[b], s.max(-1) - s.sum(-1) / mask[b].sum(), -np.inf)
      assert set(active[b, h]) == set(np.argsort(-measure)[:top])      # top-u by M, real queries
      rows = np.zeros(length, bool)
      rows[active[b, h]] = True
      expected = np.where(rows[:, None], dense[b, :, h], lazy[h][None])
      np.testing.assert_allclose(np.asarray(out)[b, :, h][mask[b]], expected[mask[b]], rtol=1e-10,
                                 atol=1e-12)


def test_draws_are_reproducible_and_follow_the_stream():
  q, k, v = random_qkv(4, 1, 48, 2, 4, 4)
  core = create("informer")
  sown = lambda out: out[1]["intermediates"]["sampled_keys"][0]
  draw = jax.jit(lambda key: sown(core.apply({}, q, k, v, rngs={"attention": key}, mutable=["intermediates"])))
  fixed = jax.jit(lambda: sown(core.apply({}, q, k, v, mutable=["intermediates"])))
  np.testing.assert_array_equal(draw(jax.random.key(0)), draw(jax.random.key(0)))
  assert not np.array_equal(draw(jax.random.key(0)), draw(jax.random.key(3)))
  np.testing.assert_array_equal(fixed(), fixed())        # no stream: the fixed per-layer draw


def test_spread_out_queries_are_selected():
  """M grows with the spread of a query's logits: queries scaled up 20x are the active ones."""
  length, top = 64, informer.top_count(64, 2)
  q, k, v = random_qkv(5, 1, length, 1, 8, 4)
  q = q.at[0, 7:7 + top].multiply(20.0)
  _, sown = run_core(create("informer", factor=2, redraw="fixed"), q, k, v, intermediates=True)
  assert set(np.asarray(sown["active_queries"][0])[0, 0]) == set(range(7, 7 + top))


def test_no_causal_form():
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="future"):
    create("informer", causal=True).apply({}, q, k, v)
