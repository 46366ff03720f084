"""Sinkhorn attention: equals a float64 reference built from the definition (block summaries, sort net,
softmax / Sinkhorn permutation, P-mixed sorted block, one softmax over own + sorted block) with padding
at the end and in the middle, for contiguous and strided (LRA) grouping and the causal form; the sort
net is sized at init."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import sinkhorn
from tests.attention_probe import create, effective_matrix, random_qkv
from tests.dense_reference import padded_mask


def init_apply(core, q, k, v, mask=None, variables=None):
  rngs = {"params": jax.random.key(0)}
  if variables is None:
    variables = jax.jit(lambda *a: core.init(rngs, *a))(q, k, v, mask)
  return jax.jit(core.apply)(variables, q, k, v, mask), variables


def log_normalize(x, allowed, axis):
  x = np.where(allowed, x, -np.inf)
  lse = np.logaddexp.reduce(x, axis=axis, keepdims=True)
  return np.where(allowed, x - np.where(np.isfinite(lse), lse, 0), -np.inf)


def sinkhorn_reference(q, k, v, mask, kernel, bias, *, size, grouping="contiguous", causal=False,
                       activation="softmax", n_iters=1, temperature=1.0):
  """float64 numpy Sinkhorn attention: q, k [B, L, H, D], v [B, L, H, V] -> [B, L, H, V]."""
  q, k, v, kernel, bias = (np.asarray(x, np.float64) for x in (q, k, v, kernel, bias))
  batch, length, heads, dim = q.shape
  num = -(-length // size)
  pos = np.arange(num)[:, None] * size + np.arange(size)          # [N, S] position of (block, slot)
  if grouping == "strided":
    pos = np.arange(size)[None, :] * num + np.arange(num)[:, None]
  real = np.zeros((batch, num * size), bool)
  real[:, :length] = np.asarray(mask, bool)
  out = np.zeros((batch, length, heads, v.shape[-1]))
  for b in range(batch):
    for h in range(heads):
      key_at = lambda n, s: k[b, pos[n, s], h] if real[b, pos[n, s]] else np.zeros(dim)
      val_at = lambda n, s: v[b, pos[n, s], h] if real[b, pos[n, s]] else np.zeros(v.shape[-1])
      m = real[b][pos]                                                # [N, S]
      summary = np.array([key_at(n, 0) if causal else sum(key_at(n, s) for s in range(size))
                          for n in range(num)])
      logits = summary @ kernel[:, :num] + bias[:num]
      allowed = m.any(1)[:, None] & m.any(1)[None, :]
      if causal:
        allowed &= np.tril(np.ones((num, num), bool), -1)
      if activation == "softmax":
        perm = np.exp(log_normalize(logits, allowed, 1))
      else:
        x = logits / temperature
        for _ in range(n_iters):
          x = log_normalize(log_normalize(x, allowed, 1), allowed, 0)
        perm = np.where(allowed, np.exp(x), 0.0)
      for i in range(num):
        keys, vals = [], []
        for s in range(size):
          w = perm[i] * m[:, s]
          if w.sum() > 0:
            keys.append(sum(w[j] * key_at(j, s) for j in range(num)))  # P·K over real entries
            vals.append(sum(w[j] * val_at(j, s) for j in range(num)))
        for s in range(size):
          p = pos[i, s]
          if p >= length or not real[b, p]:
            continue
          own = [t for t in range(size) if m[i, t] and (not causal or pos[i, t] <= p)]
          all_k = np.array([key_at(i, t) for t in own] + keys)
          all_v = np.array([val_at(i, t) for t in own] + vals)
          z = all_k @ q[b, p, h] / np.sqrt(dim)
          w = np.exp(z - z.max())
          out[b, p, h] = w @ all_v / w.sum()
  return out


@pytest.mark.parametrize("length, overrides", [
    (37, {}),
    (45, {"block_size": 6, "grouping": "strided"}),                  # LRA's grouping
    (41, {"block_size": 5, "causal": True}),
    (40, {"block_size": 8, "sort_activation": "sinkhorn", "n_iters": 3, "temperature": 0.5}),
])
def test_matches_reference_from_the_definition(x64, length, overrides):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 7)
  mask[1, length // 2:length // 2 + 5] = False
  _, variables = init_apply(create("sinkhorn", **overrides), q, k, v, mask)
  params = variables["params"]
  size = overrides.get("block_size") or int(np.ceil(np.sqrt(length)))
  opts = {key: overrides[key] for key in ("grouping", "causal", "n_iters", "temperature")
          if key in overrides}
  bias = np.linspace(-1.0, 1.0, params["sort_bias"].shape[0])     # sharper, uneven P than at init
  params = {"sort_kernel": 3.0 * params["sort_kernel"], "sort_bias": params["sort_bias"] + bias}
  out, _ = init_apply(create("sinkhorn", **overrides), q, k, v, mask, {"params": params})
  expected = sinkhorn_reference(q, k, v, mask, params["sort_kernel"], params["sort_bias"], size=size,
                                activation=overrides.get("sort_activation", "softmax"), **opts)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-12)


def test_sort_net_changes_the_output():
  """LRA's einsum made every sorted block the sum of all blocks, so the sort net did nothing."""
  q, k, v = random_qkv(1, 1, 36, 2, 4, 3)
  core = create("sinkhorn")
  out, variables = init_apply(core, q, k, v)
  moved = {"params": {"sort_kernel": -variables["params"]["sort_kernel"],
                      "sort_bias": variables["params"]["sort_bias"]}}
  assert not np.allclose(out, init_apply(core, q, k, v, variables=moved)[0], atol=1e-4)


def test_sort_net_is_sized_at_init():
  q, k, v = random_qkv(2, 1, 36, 1, 4, 3)                  # 6 blocks of 6
  core = create("sinkhorn", block_size=6)
  _, variables = init_apply(core, q, k, v)
  assert variables["params"]["sort_kernel"].shape == (4, 6)
  short = [x[:, :20] for x in (q, k, v)]
  assert np.all(np.isfinite(init_apply(core, *short, variables=variables)[0]))
  long = random_qkv(2, 1, 50, 1, 4, 3)
  with pytest.raises(ValueError, match="sort net was built for 6"):
    init_apply(core, *long, variables=variables)
  assert init_apply(create("sinkhorn", max_num_blocks=25), q, k, v)[1]["params"]["sort_bias"].shape == (25,)


def test_grouping_and_unsupported_causal_forms():
  x = jnp.arange(12)[None]
  np.testing.assert_array_equal(sinkhorn.group(x, 4, "strided")[0], [[0, 3, 6, 9], [1, 4, 7, 10],
                                                                     [2, 5, 8, 11]])
  for grouping in ("contiguous", "strided"):
    np.testing.assert_array_equal(sinkhorn.ungroup(sinkhorn.group(x, 4, grouping), grouping), x)
  q, k, v = random_qkv(3, 1, 16, 1, 4, 3)
  for bad in ({"sort_activation": "sinkhorn"}, {"grouping": "strided"}):
    with pytest.raises(NotImplementedError):
      init_apply(create("sinkhorn", causal=True, **bad), q, k, v)
  with pytest.raises(ValueError):
    create("sinkhorn", grouping="diagonal")


def test_rows_sum_to_at_most_one_and_to_one_without_partial_blocks():
  """The sorted block is P·K over real keys (not renormalised): rows of the effective matrix sum to at
  most 1, and to exactly 1 when every mixed block is full (no padding, L a multiple of the block)."""
  q, k, _ = random_qkv(3, 2, 36, 1, 8, 1)
  mask = padded_mask(2, 36, 7)
  p = effective_matrix(create("sinkhorn", block_size=6), q, k, mask)
  real = np.asarray(mask)
  assert np.all(p.sum(-1)[real] <= 1.0 + 1e-5) and np.all(p >= -1e-7)
  assert np.any(p.sum(-1)[real] < 1.0 - 1e-3), "a partly padded block must leave some rows below 1"
  np.testing.assert_allclose(p[1].sum(-1), 1.0, atol=1e-5)  # example 1 has no padding: 6 full blocks


def lra_noop_reference(q, k, v, mask, *, size):
  """float64 transcription of LRA's Sinkhorn attention as it ran (``sinkhorn_attention.py``, softmax
  sort, strided reshape [B, S, N]): block n = positions n + N·s; every sorted block holds, at slot s,
  the sum of the keys (values) at slot s of all blocks (einsum 'bskhd,bnhl->bsnhd' times Σ_l P = 1);
  own-block softmax + sorted-block softmax, added. Padded keys are left out (masked, summed as 0)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, length, heads, dim = q.shape
  num = length // size
  real = np.asarray(mask, bool)
  out = np.zeros(v.shape)

  def softmax_attend(query, keys, vals):
    z = keys @ query / np.sqrt(dim)
    w = np.exp(z - z.max())
    return w @ vals / w.sum()

  for b in range(batch):
    for h in range(heads):
      km = k[b, :, h] * real[b, :, None]
      vm = v[b, :, h] * real[b, :, None]
      slots = [range(s * num, (s + 1) * num) for s in range(size)]        # slot s of every block
      sorted_k = np.array([km[list(r)].sum(0) for r in slots if real[b, list(r)].any()])
      sorted_v = np.array([vm[list(r)].sum(0) for r in slots if real[b, list(r)].any()])
      for p in range(length):
        if not real[b, p]:
          continue
        own = [t for t in range(p % num, length, num) if real[b, t]]
        out[b, p, h] = (softmax_attend(q[b, p, h], k[b, own, h], v[b, own, h])
                        + softmax_attend(q[b, p, h], sorted_k, sorted_v))
  return out


def test_lra_noop_sort_matches_lra_code_as_run(x64):
  """``lra_noop_sort=True`` (what the ``lra`` protocol runs) = the transcription above, whatever the
  sort net holds; the paper form differs from it."""
  length, size = 42, 6
  q, k, v = random_qkv(4, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 7)
  mask[1, 10:14] = False
  core = create("sinkhorn", block_size=size, grouping="strided", lra_noop_sort=True)
  out, variables = init_apply(core, q, k, v, mask)
  expected = lra_noop_reference(q, k, v, mask, size=size)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-12)
  moved = {"params": {"sort_kernel": 5.0 * variables["params"]["sort_kernel"],
                      "sort_bias": variables["params"]["sort_bias"] + 1.0}}
  np.testing.assert_allclose(np.asarray(init_apply(core, q, k, v, mask, moved)[0])[mask], expected[mask],
                             rtol=1e-9, atol=1e-12)
  paper, _ = init_apply(create("sinkhorn", block_size=size, grouping="strided"), q, k, v, mask)
  assert not np.allclose(np.asarray(paper)[mask], expected[mask], atol=1e-3)
  with pytest.raises(NotImplementedError):
    init_apply(create("sinkhorn", causal=True, lra_noop_sort=True), q, k, v)
