"""scripts/compare_kernels.py: the kernel comparison runs end to end and refuses bad arguments."""

from __future__ import annotations

import pytest

from scripts import compare_kernels


def test_prints_one_row_per_core_with_ratios(capsys):
  """dpa and naive ratios for every core; the "own" column only where a core has its own reference."""
  assert compare_kernels.main(["--lengths", "256", "--batch_sizes", "1", "--attentions", "vanilla,bigbird",
                               "--repeats", "1"]) == 0
  out = capsys.readouterr().out.splitlines()
  rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
          for line in out if line.startswith(("| vanilla", "| bigbird"))}
  assert set(rows) == {"vanilla", "bigbird"}
  for cells in rows.values():
    assert len(cells) == 10  # attention, B, L, ms, then (ms, ratio) for dpa, naive, own
    assert all(float(c) > 0 for c in cells[3:8])
  assert rows["vanilla"][8:] == ["-", "-"]
  assert all(float(c) > 0 for c in rows["bigbird"][8:])


def test_dpa_reference_equals_naive_softmax():
  import jax
  import numpy as np

  q, k, v = (jax.random.normal(jax.random.key(i), (2, 17, 2, 8)) for i in range(3))
  np.testing.assert_allclose(compare_kernels.dpa_attention(q, k, v), compare_kernels.naive_attention(q, k, v),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("argv", [["--attentions", "nope"], ["--references", "nope"], ["--repeats", "0"]])
def test_bad_arguments_are_errors(argv):
  with pytest.raises(ValueError):
    compare_kernels.main(argv)


def test_a_reference_that_does_not_fit_the_shape_is_left_out(capsys):
  assert compare_kernels.main(["--lengths", "64", "--batch_sizes", "1", "--attentions", "bigbird",
                               "--repeats", "1"]) == 0
  row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| bigbird")][0]
  assert [c.strip() for c in row.strip("|").split("|")][8:] == ["-", "-"]


def test_performer_rows_are_timed_against_favor_and_the_relu_kernel(capsys):
  assert compare_kernels.main(["--lengths", "128", "--batch_sizes", "1", "--attentions",
                               "performer,performer_relu", "--references", "dpa", "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "performer: favor_reference" in out and "performer_relu: relu_kernel_reference" in out
  rows = [line for line in out.splitlines() if line.startswith("| performer")]
  assert len(rows) == 2
  for row in rows:
    assert all(float(c) > 0 for c in [c.strip() for c in row.strip("|").split("|")][3:])


@pytest.mark.parametrize("name", ["performer", "performer_relu"])
def test_performer_references_compute_the_core(name):
  """The FAVOR+ reference, given the core's fixed features, and the relu-kernel reference compute what
  the core computes (bidirectional, no padding); stabilisers differ but cancel up to ε."""
  import functools

  import jax
  import numpy as np

  q, k, v = (0.5 * jax.random.normal(jax.random.key(i), (2, 48, 2, 16)) for i in range(3))
  reference, overrides = compare_kernels.OWN_REFERENCES[name]
  core, sown = compare_kernels.core_fn(compare_kernels.VARIANTS.get(name, name), q, **overrides)
  if name == "performer":
    assert set(sown) == {"projection"}
    reference = functools.partial(reference, projection=sown["projection"])
  np.testing.assert_allclose(core(q, k, v), reference(q, k, v), rtol=2e-4, atol=2e-5)
  grads = [compare_kernels.grad_fn(f)(q, k, v) for f in (core, reference)]
  for ours, theirs in zip(*grads):
    np.testing.assert_allclose(ours, theirs, rtol=2e-3, atol=2e-4)


def test_causal_prefix_products_and_their_gradient_equal_the_masked_quadratic_form():
  import jax
  import jax.numpy as jnp
  import numpy as np

  q, k, v = (jax.random.uniform(jax.random.key(i), (2, 13, 2, 5 if i < 2 else 3)) for i in range(3))

  def dense(q, k, v):
    scores = jnp.einsum("bqhm,bkhm->bhqk", q, k) * jnp.tril(jnp.ones((13, 13)))
    return jnp.einsum("bhqk,bkhv->bqhv", scores, v)

  np.testing.assert_allclose(compare_kernels._prefix_products(q, k, v), dense(q, k, v), rtol=1e-5)
  weights = jax.random.normal(jax.random.key(5), (2, 13, 2, 3))
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * weights)
  for ours, expected in zip(jax.grad(loss(compare_kernels._prefix_products), (0, 1, 2))(q, k, v),
                            jax.grad(loss(dense), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["performer", "performer_relu"])
def test_causal_performer_references_compute_the_causal_core(name):
  import functools

  import jax
  import numpy as np

  q, k, v = (0.5 * jax.random.normal(jax.random.key(i), (1, 40, 2, 16)) for i in range(3))
  reference, overrides = compare_kernels.OWN_REFERENCES[name]
  core, sown = compare_kernels.core_fn("performer", q, **overrides, causal=True, causal_chunk=16)
  reference = functools.partial(reference, causal=True, **({"projection": sown["projection"]} if sown else {}))
  np.testing.assert_allclose(core(q, k, v), reference(q, k, v), rtol=2e-4, atol=2e-5)


def test_causal_run_times_causal_cores_and_leaves_out_non_causal_own_references(capsys):
  assert compare_kernels.main(["--lengths", "128", "--batch_sizes", "1", "--attentions", "performer,bigbird",
                               "--references", "dpa", "--repeats", "1", "--causal"]) == 0
  out = capsys.readouterr().out
  assert "causal" in out.splitlines()[0]
  rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
          for line in out.splitlines() if line.startswith(("| performer", "| bigbird"))}
  assert all(float(c) > 0 for c in rows["performer"][3:])
  assert all(float(c) > 0 for c in rows["bigbird"][3:6]) and rows["bigbird"][6:] == ["-", "-"]
