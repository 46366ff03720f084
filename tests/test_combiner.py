"""Combiner cores against the naive reference (tests/combiner_reference.py), exactly, in float64.

For every variant and option, bidirectional and causal, with a padding mask: the effective matrix
P = core(q, k, value = identity) equals the reference built from the partition definitions, rows sum to
1, every real key in the support has P > 0 and padded keys exactly 0, the partition covers each key
once (mixture: twice off-axis), spans shared by two queries give them the same within-span
distribution; degenerate configurations equal exact softmax attention.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import combiner_reference as ref
from tests.attention_probe import create, effective_matrix, init_and_apply, random_qkv

LENGTH = 33   # 2^5 + 1: the released logsparse code drops the last query's prefix here
PAD = 7       # trailing padded positions of example 0


def _mask(batch, length, pad):
  mask = np.ones((batch, length), bool)
  mask[0, length - pad:] = False
  mask[-1, 3] = False  # an interior padded position too
  return mask


# id -> (registered name, overrides, partition(length, causal, variables, q, k, mask), reference kwargs)
def _fixed(**kw):
  return lambda L, causal, *_: ref.fixed_partition(
      L, block=kw.get("block_size") or math.ceil(math.sqrt(L)), num_summary=kw.get("num_summary", 1),
      direct=kw.get("direct", "sparse"), causal=causal)


def _axial(family, width=None):
  return lambda L, causal, *_: ref.axial_partition(L, family=family, width=width, causal=causal)


def _learnable(chunk=None):
  def build(L, causal, variables, q, k, mask):
    means = np.asarray(variables["centroids"]["means"], np.float64)
    return ref.learnable_partition(np.asarray(q), np.asarray(k), mask, means,
                                   chunk or math.ceil(math.sqrt(L)))
  return build


CASES = {
    "fixed": ("combiner_fixed", {}, _fixed(), {}),
    "fixed-block": ("combiner_fixed", {"direct": "block"}, _fixed(direct="block"), {}),
    "fixed-s5-c2-mean": ("combiner_fixed", {"block_size": 5, "num_summary": 2, "abstraction": "mean"},
                         _fixed(block_size=5, num_summary=2), {"kind": "mean"}),
    "fixed-deepsets_max": ("combiner_fixed", {"abstraction": "deepsets_max"}, _fixed(), {"deepsets": True}),
    "logsparse": ("combiner_logsparse", {}, lambda L, causal, *_: ref.logsparse_partition(L, causal=causal), {}),
    "logsparse-deepsets_mean": ("combiner_logsparse", {"abstraction": "deepsets_mean"},
                                lambda L, causal, *_: ref.logsparse_partition(L, causal=causal),
                                {"kind": "mean", "deepsets": True}),
    "vertical": ("combiner_axial_vertical", {}, _axial("vertical"), {}),
    "vertical-w4-mean": ("combiner_axial_vertical", {"width": 4, "abstraction": "mean"},
                         _axial("vertical", 4), {"kind": "mean"}),
    "horizontal": ("combiner_axial_horizontal", {}, _axial("horizontal"), {}),
    "horizontal-w8-deepsets_max": ("combiner_axial_horizontal", {"width": 8, "abstraction": "deepsets_max"},
                                   _axial("horizontal", 8), {"deepsets": True}),
    "mixture": ("combiner_mixture", {}, _axial("both"), {}),
    "mixture-average": ("combiner_mixture", {"mixture": "average"}, None, {}),
    "rowmajor": ("combiner_axial_rowmajor", {}, _axial("row"), {"row_summary": "proj"}),
    "rowmajor-wsum-w4": ("combiner_axial_rowmajor", {"row_summary": "wsum", "width": 4}, _axial("row", 4),
                         {"row_summary": "wsum"}),
    "rowmajor-pool-mean": ("combiner_axial_rowmajor", {"row_summary": "pool", "abstraction": "mean"},
                           _axial("row"), {"row_summary": "pool", "kind": "mean"}),
    "learnable": ("combiner_learnable", {}, _learnable(), {}),
    "learnable-c4-mean": ("combiner_learnable", {"chunk_size": 4, "num_clusters": 3, "abstraction": "mean"},
                          _learnable(4), {"kind": "mean"}),
}
EXACT_PARTITION = {c for c in CASES if not c.startswith("mixture")}
# Base variants run bidirectional and causal; option variants bidirectional (they share the code paths).
BASE = ("fixed", "fixed-block", "logsparse", "vertical", "horizontal", "mixture", "rowmajor")
RUNS = [(c, False) for c in CASES] + [(c, True) for c in BASE + ("mixture-average",)]


def _params_for_reference(variables, rng):
  """Random values for zero-initialised learned summaries, so the reference checks them."""
  params = jax.tree_util.tree_map(np.asarray, dict(variables.get("params", {})))
  if "summary_proj" in params:
    params["summary_proj"] = 0.3 * rng.standard_normal(params["summary_proj"].shape)
  return {**variables, "params": params}


def _reference_matrix(case, variables, q, k, mask, causal, eye):
  name, overrides, build, kw = CASES[case]
  length = q.shape[1]
  params = variables.get("params", {})
  extra = {"kind": kw.get("kind", "max")}
  if kw.get("deepsets"):
    extra["phi_q"] = np.asarray(params["query_abstraction"]["phi"]["kernel"], np.float64)
    extra["phi_k"] = np.asarray(params["key_abstraction"]["phi"]["kernel"], np.float64)
  if "row_summary" in kw:
    extra["row_summary"] = kw["row_summary"]
    if kw["row_summary"] == "proj":
      extra["proj"] = np.asarray(params["summary_proj"], np.float64)
  if case == "mixture-average":
    return 0.5 * sum(ref.reference(q, k, eye, mask, ref.axial_partition(length, family=f, causal=causal))
                     for f in ("vertical", "horizontal"))
  return ref.reference(q, k, eye, mask, build(length, causal, variables, q, k, mask), **extra)


@pytest.mark.parametrize("case,causal", RUNS, ids=[f"{c}-{'causal' if m else 'bidir'}" for c, m in RUNS])
def test_effective_matrix_matches_reference(x64, case, causal):
  name, overrides, build, _ = CASES[case]
  length = LENGTH
  core = create(name, causal=causal, **overrides)
  q, k, _ = random_qkv(11, 2, length, 1, 6, 1, dtype=jnp.float64)
  mask = _mask(2, length, PAD)
  eye = np.broadcast_to(np.eye(length)[None, :, None, :], (2, length, 1, length))
  _, variables = init_and_apply(core, q, k, jnp.asarray(eye), jnp.asarray(mask))  # same shapes: one compile
  variables = _params_for_reference(variables, np.random.default_rng(0))
  p = effective_matrix(core, q, k, jnp.asarray(mask), variables=variables)       # [B, L, L]
  expected = _reference_matrix(case, variables, np.asarray(q), np.asarray(k), mask, causal, eye)[:, :, 0]

  allowed = np.tril(np.ones((length, length), bool)) if causal else np.ones((length, length), bool)
  for b in range(2):
    real = mask[b]
    rows = p[b][real]
    np.testing.assert_allclose(rows, expected[b][real], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rows.sum(-1), 1.0, atol=1e-12)
    support = allowed[real] & real[None, :]
    assert np.all(rows[support] > 1e-12), "every real key in the support must get weight (full attention)"
    assert np.all(rows[~support] == 0.0), "padded / future keys must get exactly zero"

    if build is None:  # mixture-average: no single partition
      continue
    part = build(length, causal, variables, np.asarray(q), np.asarray(k), mask)
    part = part[b, 0] if isinstance(part, dict) else part
    count = ref.multiplicity(part, length, real)[real]
    if case in EXACT_PARTITION:
      np.testing.assert_array_equal(count, support.astype(int))  # each key covered exactly once
    else:  # joint mixture: own row / column once, every other position twice
      m = ref.grid_width(length)
      pos = np.arange(length)
      on_axis = ((pos[:, None] // m) == (pos[None, :] // m)) | ((pos[:, None] % m) == (pos[None, :] % m))
      np.testing.assert_array_equal(count, support * np.where(on_axis, 1, 2)[real])
      continue
    # Span factorization: queries sharing a span see the same within-span distribution.
    seen = {}
    for i in np.flatnonzero(real):
      for span in part(i)[1]:
        members, anchor = span if isinstance(span, tuple) else (span, None)
        members = [j for j in members if real[j]]
        if len(members) < 2:
          continue
        local = p[b, i, members] / p[b, i, members].sum()
        first = seen.setdefault((tuple(members), anchor), local)
        np.testing.assert_allclose(local, first, rtol=1e-9)
    assert len(seen) > 0


@pytest.mark.parametrize("case,causal", [("fixed", True), ("logsparse", False), ("mixture", True),
                                         ("rowmajor", False), ("learnable", False)])
def test_multihead_outputs_match_reference(x64, case, causal):
  """Heads, value_dim != head_dim, batch: outputs against the reference."""
  name, overrides, _, _ = CASES[case]
  core = create(name, causal=causal, **overrides)
  q, k, v = random_qkv(3, 2, 21, 2, 4, 3, dtype=jnp.float64)
  mask = _mask(2, 21, 5)
  _, variables = init_and_apply(core, q, k, v, jnp.asarray(mask))
  variables = _params_for_reference(variables, np.random.default_rng(1))
  out, _ = init_and_apply(core, q, k, v, jnp.asarray(mask), variables=variables)
  expected = _reference_matrix(case, variables, np.asarray(q), np.asarray(k), mask, causal, np.asarray(v))
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-12)


def _softmax_matrix(q, k, mask, causal):
  logits = np.einsum("bid,bjd->bij", q[:, :, 0], k[:, :, 0]) / np.sqrt(q.shape[-1])
  allowed = mask[:, None, :] & (np.tril(np.ones(logits.shape[1:], bool)) if causal else True)
  w = np.where(allowed, np.exp(logits - logits.max(-1, keepdims=True)), 0.0)
  return w / w.sum(-1, keepdims=True)


DEGENERATE = [
    ("combiner_fixed", {"block_size": 1}),                         # every position a summary column
    ("combiner_fixed", {"block_size": 1, "direct": "block"}),      # singleton spans
    ("combiner_fixed", {"block_size": 16}),                        # a single block
    ("combiner_axial_vertical", {"width": 1}),                     # m = 1
    ("combiner_axial_horizontal", {"width": 16}),                  # n = 1
    ("combiner_mixture", {"width": 1}),
    ("combiner_axial_rowmajor", {"width": 16}),                    # n = 1
    ("combiner_axial_rowmajor", {"width": 1}),                     # singleton rows
]


@pytest.mark.parametrize("name,overrides,causal", [(n, o, i % 2 == 1) for i, (n, o) in enumerate(DEGENERATE)],
                         ids=lambda x: str(x) if not isinstance(x, dict) else
                         "-".join(f"{k}{v}" for k, v in x.items()))
def test_degenerate_configs_equal_exact_softmax(x64, name, overrides, causal):
  q, k, _ = random_qkv(5, 1, 16, 1, 4, 1, dtype=jnp.float64)
  mask = np.ones((1, 16), bool)
  mask[0, 13:] = False
  p = effective_matrix(create(name, causal=causal, **overrides), q, k, jnp.asarray(mask))
  expected = _softmax_matrix(np.asarray(q), np.asarray(k), mask, causal)
  np.testing.assert_allclose(p[mask], expected[mask], rtol=1e-10, atol=1e-13)


def test_logsparse_covers_every_prefix(x64):
  """L = 2^4 + 1 (33 is in the tests above): the last query attends to its whole prefix, which the
  released code's level count (ceil(log2(L - 1))) drops."""
  q, k, _ = random_qkv(6, 1, 17, 1, 4, 1, dtype=jnp.float64)
  p = effective_matrix(create("combiner_logsparse", causal=True), q, k)[0]
  lower = np.tril(np.ones(p.shape, bool))
  assert np.all(p[lower] > 0) and np.all(p[~lower] == 0)
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)
  assert ref.multiplicity(ref.logsparse_partition(17, causal=True), 17, np.ones(17, bool))[16, :16].min() == 1


def test_learnable_has_no_causal_form():
  with pytest.raises(NotImplementedError, match="causal"):
    init_and_apply(create("combiner_learnable", causal=True), *random_qkv(0, 1, 16, 1, 4, 4))


def test_learnable_centroids_update_only_when_mutable():
  core = create("combiner_learnable", num_clusters=4, decay=0.5)
  q, k, v = random_qkv(7, 2, 20, 2, 8, 8)
  mask = jnp.asarray(_mask(2, 20, 4))
  _, variables = init_and_apply(core, q, k, v, mask)
  means = np.asarray(variables["centroids"]["means"])
  assert means.shape == (2, 4, 8)
  np.testing.assert_allclose(np.linalg.norm(means, axis=-1), 1.0, rtol=1e-5)
  out, updates = core.apply(variables, q, k, v, mask, mutable=["centroids"])
  moved = np.asarray(updates["centroids"]["means"])
  assert not np.allclose(moved, means)
  np.testing.assert_allclose(np.linalg.norm(moved, axis=-1), 1.0, rtol=1e-5)
  frozen = core.apply(variables, q, k, v, mask)  # mutable=False: runs, same outputs, no update
  np.testing.assert_allclose(np.asarray(frozen), np.asarray(out), rtol=1e-6)


def test_unknown_options_are_rejected():
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  for name, overrides in [("combiner_fixed", {"abstraction": "median"}), ("combiner_fixed", {"direct": "x"}),
                          ("combiner_mixture", {"mixture": "x"}),
                          ("combiner_axial_rowmajor", {"row_summary": "x"})]:
    with pytest.raises(ValueError):
      init_and_apply(create(name, **overrides), q, k, v)
