"""scripts/compare_kernels.py: the kernel comparison runs end to end and refuses bad arguments."""

from __future__ import annotations

import pytest

from scripts import compare_kernels


def test_prints_one_row_per_core_with_ratios(capsys):
  assert compare_kernels.main(["--lengths", "32", "--batch_sizes", "1", "--attentions", "vanilla,linear_transformer",
                               "--repeats", "1"]) == 0
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| vanilla")
          or line.startswith("| linear_transformer")]
  assert len(rows) == 2
  for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 8 and all(float(c) > 0 for c in cells[3:])


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
