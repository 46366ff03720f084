"""Poolingformer: the blockwise core equals a dense float64 reference written from the two-level
definition (window softmax + softmax over pooled slots inside the wider window, summed), for mean and max
pooling, with padding at the end and in the middle; pooled slots of all-padding windows are masked; the
paper's first-level query option; causal is refused."""

import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import poolingformer
from tests.attention_probe import create, init_and_apply, random_qkv
from tests.dense_reference import dense_masked_attention, run_core


def holes_mask(batch, length):
  mask = np.ones((batch, length), bool)
  mask[0, length - 6:] = False
  mask[1, 12:20] = False      # covers whole pooled slots (stride 2, kernel 3 -> slot 6 is all padding)
  return mask


def pooled_reference(q, k, v, mask, window, pooled_window, kernel, stride, how, second_q=None):
  """Dense definition: y = softmax over |i − j| ≤ w1/2; z = softmax over slots p whose span
  [p·ξ, p·ξ + κ) lies in [i − w2/2, i + w2/2] and holds a real position, of pooled k, v; y + z."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, length, heads, dim = q.shape
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  half, pooled_half = min(window // 2, length), min(pooled_window // 2, length)
  y = dense_masked_attention(q, k, v, (np.abs(i - j) <= half) & mask[:, None, None, :])
  starts = np.arange(0, length, stride)
  pk = np.zeros((batch, len(starts), heads, dim))
  pv = np.zeros((batch, len(starts), heads, v.shape[-1]))
  real = np.zeros((batch, len(starts)), bool)
  for b in range(batch):
    for p, s in enumerate(starts):
      members = [t for t in range(s, min(s + kernel, length)) if mask[b, t]]
      if members:
        real[b, p] = True
        reduce = np.max if how == "max" else np.mean
        pk[b, p], pv[b, p] = reduce(k[b, members], axis=0), reduce(v[b, members], axis=0)
  second_q = q if second_q is None else np.asarray(second_q, np.float64)
  logits = np.einsum("bihd,bphd->bhip", second_q, pk) / np.sqrt(dim)
  inside = (starts[None, :] >= i - pooled_half) & (starts[None, :] + kernel - 1 <= i + pooled_half)
  allowed = inside[None, None] & real[:, None, None, :]
  logits = np.where(allowed, logits, -np.inf)
  weights = np.where(allowed, np.exp(logits - logits.max(-1, keepdims=True)), 0.0)
  z = np.einsum("bhip,bphv->bihv", weights / weights.sum(-1, keepdims=True), pv)
  return y + z, y


SIZES = {"window": 6, "pooled_window": 16, "kernel": 3, "stride": 2}


@pytest.mark.parametrize("how", ["mean", "max"])
def test_matches_dense_reference(x64, how):
  length = 41
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = holes_mask(2, length)
  out = run_core(create("poolingformer", pooling=how, **SIZES), q, k, v, mask)
  ref, _ = pooled_reference(q, k, v, mask, *SIZES.values(), how)
  np.testing.assert_allclose(np.asarray(out)[mask], ref[mask], rtol=1e-10, atol=1e-12)


def test_first_level_query_option(x64):
  """The paper's form: q' = y W (W the core's [H, V, D] parameter)."""
  length = 29
  q, k, v = random_qkv(1, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = holes_mask(2, length)
  core = create("poolingformer", second_query="first_level", **SIZES)
  out, variables = init_and_apply(core, q, k, v, jnp.asarray(mask))
  _, y = pooled_reference(q, k, v, mask, *SIZES.values(), "mean")
  weight = np.asarray(variables["params"]["second_query"], np.float64)           # [H, V, D]
  ref, _ = pooled_reference(q, k, v, mask, *SIZES.values(), "mean",
                            second_q=np.einsum("bihv,hvd->bihd", y, weight))
  np.testing.assert_allclose(np.asarray(out)[mask], ref[mask], rtol=1e-9, atol=1e-11)


def test_declared_support_and_rows_sum_to_two(x64):
  length = 33
  q, k, _ = random_qkv(2, 1, length, 1, 4, 1, dtype=jnp.float64)
  eye = jnp.eye(length, dtype=jnp.float64)[None, :, None, :]
  p = np.asarray(run_core(create("poolingformer", **SIZES), q, k, eye))[0, :, 0, :]
  np.testing.assert_allclose(p.sum(-1), 2.0, rtol=1e-12)
  support = poolingformer.PoolingformerConfig(**SIZES).support(length)
  assert np.all(p[~support] == 0) and not support.all()


def test_table_size_is_independent_of_length():
  """Pooled slots per query block stay fixed as L grows (linear cost)."""
  widths = [poolingformer.slot_tables(n, 64, 256, 5, 4)[1].shape[1] for n in (1024, 4096)]
  assert widths[0] == widths[1] <= (64 + 512) // 4 + 1


def test_causal_is_refused():
  q, k, v = random_qkv(3, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="encoder"):
    run_core(create("poolingformer", causal=True), q, k, v)
