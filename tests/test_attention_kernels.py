"""The fast building blocks of the cores against their plain definitions, values AND gradients
(float64): the scan-based exclusive running max (hand-written VJP), the line pools built on it, the
deferred-normalization softmax-attention helpers, and end-to-end gradients of the cores using them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from attention_zoo import _combiner_common as combiner_common
from attention_zoo import _common as common
from tests.attention_probe import create, random_qkv


def _reference_exclusive_max(x, reverse):
  """Entry t = max of x[u] over u < t (u > t when reverse) along axis 0; the lowest float if none."""
  low = jnp.finfo(x.dtype).min
  x = jnp.flip(x, 0) if reverse else x
  inclusive = jax.lax.cummax(x, 0)
  out = jnp.concatenate([jnp.full_like(x[:1], low), inclusive[:-1]])
  return jnp.flip(out, 0) if reverse else out


@pytest.mark.parametrize("reverse", [False, True])
def test_exclusive_cummax_values_and_gradients(x64, reverse):
  x = jax.random.normal(jax.random.key(0), (9, 2, 3, 4), jnp.float64)   # continuous: no ties
  weights = jax.random.normal(jax.random.key(1), x.shape, jnp.float64)
  low = jnp.finfo(x.dtype).min
  (ours,) = combiner_common.exclusive_cummax((x,), reverse)
  expected = _reference_exclusive_max(x, reverse)
  np.testing.assert_array_equal(ours, expected)
  real = expected > low                              # the empty max has no gradient to compare
  loss = lambda f: lambda x: jnp.sum(jnp.where(real, f(x), 0) * weights)
  np.testing.assert_allclose(jax.grad(loss(lambda x: combiner_common.exclusive_cummax((x,), reverse)[0]))(x),
                             jax.grad(loss(lambda x: _reference_exclusive_max(x, reverse)))(x),
                             rtol=0, atol=1e-15)


def test_exclusive_cummax_tie_gradient_goes_to_first_maximum(x64):
  x = jnp.array([1.0, 3.0, 3.0, 2.0, 5.0])
  (out,) = combiner_common.exclusive_cummax((x,))
  np.testing.assert_array_equal(out[1:], [1.0, 3.0, 3.0, 3.0])
  grad = jax.grad(lambda x: jnp.sum(combiner_common.exclusive_cummax((x,))[0][1:]))(x)
  np.testing.assert_array_equal(grad, [1.0, 3.0, 0.0, 0.0, 0.0])   # out[2:5] all credit x[1], not x[2]
  (suffix,) = combiner_common.exclusive_cummax((x,), True)
  np.testing.assert_array_equal(suffix[:-1], [5.0, 5.0, 5.0, 5.0])
  grad = jax.grad(lambda x: jnp.sum(combiner_common.exclusive_cummax((x,), True)[0][:-1]))(x)
  np.testing.assert_array_equal(grad, [0.0, 0.0, 0.0, 0.0, 4.0])


@pytest.mark.parametrize("kind", ["max", "mean"])
@pytest.mark.parametrize("reverse", [False, True])
def test_exclusive_line_pools_equal_pool_of_each_prefix(x64, kind, reverse):
  n = 7
  # Layout of the cores: x [N, B, H, M, D] (line position N leading), valid [N, B, 1, M].
  xs = [jax.random.normal(jax.random.key(s), (n, 2, 3, 4, 5), jnp.float64) for s in (2, 3)]
  valid = np.array(jax.random.bernoulli(jax.random.key(4), 0.6, (n, 2, 1, 4)))
  valid[:, 0, 0, 1] = False                                               # a line with nothing valid
  summaries, nonempty = combiner_common.exclusive_line_pools(xs, jnp.asarray(valid), kind, reverse)
  for t in range(n):
    span = np.zeros((n,) + valid.shape[1:], bool)
    if reverse:
      span[t + 1:] = valid[t + 1:]
    else:
      span[:t] = valid[:t]
    for x, summary in zip(xs, summaries):
      expected, expected_nonempty = combiner_common.pool(jnp.moveaxis(x, 0, -2),
                                                         jnp.moveaxis(jnp.asarray(span), 0, -1), 3, kind)
      np.testing.assert_allclose(summary[t], expected, rtol=1e-13, atol=1e-15)
      np.testing.assert_array_equal(nonempty[t], expected_nonempty)


def _softmax_attention(logits, allowed, value, spec):
  return jnp.einsum(spec, common.masked_softmax(logits, allowed), value)


def test_masked_attention_equals_normalized_form(x64):
  keys = jax.random.split(jax.random.key(5), 3)
  logits = jax.random.normal(keys[0], (2, 3, 5, 6), jnp.float64)
  value = jax.random.normal(keys[1], (2, 3, 6, 4), jnp.float64)
  allowed = jax.random.bernoulli(keys[2], 0.5, (2, 1, 5, 6)).at[0, 0, 0].set(False)  # an empty row
  spec = "bhqk,bhkv->bhqv"
  ours = common.masked_attention(logits, allowed, value, spec)
  np.testing.assert_allclose(ours, _softmax_attention(logits, allowed, value, spec), rtol=1e-13,
                             atol=1e-15)
  np.testing.assert_array_equal(ours[0, :, 0], 0.0)
  check_grads(lambda l, v: common.masked_attention(l, allowed, v, spec), (logits, value), order=1,
              modes=["rev"])


def test_grid_masked_attention_is_one_softmax_over_both_layouts(x64):
  """Row-major and column-major key families give the same output as one softmax over their concatenation."""
  b, h, r, c, v = 2, 2, 3, 4, 5
  keys = jax.random.split(jax.random.key(6), 6)
  row_logits = jax.random.normal(keys[0], (b, h, r, c, 7), jnp.float64)
  col_logits = jax.random.normal(keys[1], (b, h, c, r, 6), jnp.float64)
  row_values = jax.random.normal(keys[2], (b, h, r, 7, v), jnp.float64)
  col_values = jax.random.normal(keys[3], (b, h, c, 6, v), jnp.float64)
  row_ok = jax.random.bernoulli(keys[4], 0.5, (b, 1, r, c, 7))
  col_ok = jax.random.bernoulli(keys[5], 0.5, (b, 1, c, r, 6))
  row_ok, col_ok = row_ok.at[0, 0, 1, 2].set(False), col_ok.at[0, 0, 2, 1].set(False)  # empty query
  ours = common.grid_masked_attention([(row_logits, row_ok, row_values)],
                                      [(col_logits, col_ok, col_values)])
  swap = lambda x: jnp.swapaxes(x, 2, 3)
  logits = jnp.concatenate([row_logits, swap(col_logits)], -1)                 # [B, H, R, C, 13]
  allowed = jnp.concatenate([jnp.broadcast_to(row_ok, row_logits.shape),
                             jnp.broadcast_to(swap(col_ok), swap(col_logits).shape)], -1)
  p = common.masked_softmax(logits, allowed)
  expected = (jnp.einsum("bhrck,bhrkv->bhrcv", p[..., :7], row_values)
              + jnp.einsum("bhrck,bhckv->bhrcv", p[..., 7:], col_values))
  np.testing.assert_allclose(ours, expected, rtol=1e-13, atol=1e-15)
  np.testing.assert_array_equal(ours[0, :, 1, 2], 0.0)
  check_grads(lambda a, bb, cc, d: common.grid_masked_attention([(a, row_ok, cc)], [(bb, col_ok, d)]),
              (row_logits, col_logits, row_values, col_values), order=1, modes=["rev"])


@pytest.mark.parametrize("name, overrides", [
    ("axial", {}),
    ("axial", {"mode": "alternating", "causal": True}),
    ("combiner_axial_vertical", {}),
    ("combiner_axial_vertical", {"causal": True}),
    ("combiner_axial_horizontal", {"abstraction": "mean"}),
    ("combiner_mixture", {"mixture": "average"}),
    ("combiner_axial_rowmajor", {"causal": True}),
    ("combiner_axial_rowmajor", {"row_summary": "pool"}),
    ("vanilla", {"causal": True}),
    ("sparse_fixed", {}),
    ("bigbird", {}),
    ("combiner_fixed", {"causal": True}),
    ("combiner_logsparse", {}),
])
def test_core_gradients_match_finite_differences(x64, name, overrides):
  """The whole core's reverse-mode gradient (custom running-max VJP, deferred normalization, layout
  transposes) against finite differences, with padding."""
  q, k, v = random_qkv(7, 2, 19, 2, 3, 2, dtype=jnp.float64)
  mask = jnp.asarray(np.arange(19)[None, :] < np.array([[19], [15]]))
  core = create(name, **overrides)
  variables = core.init(jax.random.key(8), q, k, v, mask)
  # Learned parameters (e.g. the rowmajor summary projection, zero at init) made non-zero.
  variables = jax.tree.map(lambda x: 0.3 * jax.random.normal(jax.random.key(9), x.shape, x.dtype),
                           variables)
  check_grads(lambda q, k, v: core.apply(variables, q, k, v, mask), (q, k, v), order=1, modes=["rev"],
              atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["bigbird", "combiner_axial_rowmajor"])
def test_compare_kernels_own_references_compute_the_core(name):
  """The plain references timed by scripts/compare_kernels.py compute exactly what the core computes."""
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).parent.parent / "scripts" / "compare_kernels.py"
  spec = importlib.util.spec_from_file_location("compare_kernels", path)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  reference, overrides = script.OWN_REFERENCES[name]
  q, k, v = random_qkv(0, 2, 64, 2, 8, 8)                # bigbird: 8 blocks of 8 (derived); rowmajor: 8 x 8
  core = create(name, **overrides)
  variables = core.init(jax.random.key(0), q, k, v)
  ours = core.apply(variables, q, k, v)
  expected = reference(q, k, v, size=8) if name == "bigbird" else reference(q, k, v)
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
