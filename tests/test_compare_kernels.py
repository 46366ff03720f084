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
  for name, cells in rows.items():
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
