"""Longformer / global_local: banded-block output equals dense attention under the closed-form window
(odd and even windows, window longer than the input, causal), global rows with the core's own
projections, every key counted once, causal+global rejected."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import longformer
from tests.attention_probe import create, effective_matrix, init_and_apply, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, run_core


def end_and_middle_mask(batch, length):
  """bool [B, L]: example 0 padded at the end, example 1 in the middle."""
  mask = np.ones((batch, length), bool)
  mask[0, length - 6:] = False
  mask[1, 11:15] = False
  return mask


def window_mask(length, window, causal=False):
  """bool [L, L] built like LRA: ⌈w/2⌉ diagonals to the left including the main one, ⌊w/2⌋ right."""
  right = window // 2
  left = window - right
  allowed = sum(np.eye(length, k=-i) for i in range(left))
  allowed = (allowed + sum(np.eye(length, k=i) for i in range(1, right + 1))).astype(bool)
  return allowed & np.tril(np.ones((length, length), bool)) if causal else allowed


@pytest.mark.parametrize("length, window, causal", [
    (37, 7, False),    # odd window: 4 left (with self), 3 right
    (37, 8, True),     # even window, causal: 4 left (S = 3, two key blocks)
    (29, 100, False),  # window longer than the input: dense
])
def test_window_matches_dense_reference(x64, length, window, causal):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(2, length)
  out = run_core(create("longformer", window=window, causal=causal), q, k, v, mask)
  allowed = window_mask(length, window, causal) & key_and_causal_mask(mask, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], dense_masked_attention(q, k, v, allowed)[mask],
                             rtol=1e-10, atol=1e-12)


def test_global_tokens_match_dense_reference(x64):
  """Global rows: softmax(q W_q (k W_k)ᵀ/√d) v over all real keys; other rows: window ∪ global keys."""
  length, window, num_global = 37, 6, 2
  q, k, v = random_qkv(1, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(2, length)
  core = create("longformer", window=window, num_global=num_global)
  variables = core.init(jax.random.key(0), q, k, v, mask)
  params = jax.tree.map(lambda w: w + 0.3 * jax.random.normal(jax.random.key(5), w.shape, w.dtype),
                        variables)  # away from the identity initialisation
  out, _ = init_and_apply(core, q, k, v, mask, variables=params)
  glob = np.arange(length) < num_global
  rows = window_mask(length, window) | glob[None, :]
  expected = dense_masked_attention(q, k, v, rows & key_and_causal_mask(mask, False))
  w_q, w_k = (np.asarray(params["params"][name]) for name in ("global_query", "global_key"))
  g_q, g_k = np.einsum("blhd,hde->blhe", q, w_q), np.einsum("blhd,hde->blhe", k, w_k)
  expected[:, glob] = dense_masked_attention(g_q, g_k, v, key_and_causal_mask(mask, False))[:, glob]
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, overrides", [("longformer", {"window": 5}),
                                             ("longformer", {"window": 6, "num_global": 3}),
                                             ("global_local", {"window": 8})])
def test_support_is_filled_and_each_key_counted_once(x64, name, overrides):
  """q = k = 0 (identity global maps): the probe is uniform over the declared support, so a global key
  inside a window counted twice would get double weight."""
  length = 23
  support = longformer.LongformerConfig(**{"num_global": 1, **overrides} if name == "global_local"
                                         else overrides).support(length)
  zeros = jnp.zeros((1, length, 1, 4), jnp.float64)
  p = effective_matrix(create(name, **overrides), zeros, zeros)[0]
  np.testing.assert_allclose(p, support / support.sum(-1, keepdims=True), rtol=1e-12, atol=1e-15)


def test_presets_and_block_size():
  config = longformer.GlobalLocalConfig()
  assert (config.window, config.num_global, config.paper_name) == (128, 1, None)
  assert longformer.LongformerConfig().paper_name == "Longformer"
  assert longformer.window_sides(512) == (256, 256) and longformer.window_sides(7) == (4, 3)
  assert longformer.band_block_size(4096, 512) == 256 and longformer.band_block_size(37, 512) == 37


def test_causal_with_global_tokens_is_rejected():
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="global"):
    init_and_apply(create("global_local", causal=True), q, k, v)
