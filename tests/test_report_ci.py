"""Uncertainty in the accuracy report: a Wilson 95% interval per cell and a mark where a cell does not
differ significantly from vanilla (Newcombe's interval for the difference), in the Markdown, the LaTeX
and the CSV; records that do not say how many test examples they had get no interval and a note why.
"""

import io
import math

import pandas as pd
import pytest

from lra_bench.report import accuracy, reference

REFERENCE, _ = reference.load_reference()


def record(attention, task, seed, acc, n=None, protocol="smoke", status="ok", data_n=None):
  out = {"kind": "train", "task": task, "attention": attention, "protocol": protocol, "seed": seed,
         "status": status, "error": None, "test_accuracy": acc, "config_hash": "h", "max_length": 10}
  if n is not None:
    out["test_examples"] = n
  if data_n is not None:
    out["data"] = {"test": {"num_examples": data_n, "num_truncated": 0, "source": "x"}}
  return out


def cell(rep, attention, task="ListOps"):
  row = [r for r in rep.ours.rows if r[1] == attention][0]
  return row[rep.ours.columns.index(task)]


# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I (Wilson score),
# and "Interval estimation for the difference between independent proportions", Table II (method 10).
@pytest.mark.parametrize("k, n, low, high", [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605),
                                             (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)])
def test_wilson_interval_matches_published_values(k, n, low, high):
  lo, hi = accuracy.wilson_interval(k / n, n)
  assert (round(lo, 4), round(hi, 4)) == (low, high)


@pytest.mark.parametrize("p, n", [(0.37, 200), (0.9, 100), (0.5, 37)])
def test_wilson_bounds_are_where_the_score_test_rejects(p, n):
  """Each bound p0 solves (p - p0)^2 = z^2 p0 (1 - p0) / n, the score test at 5% two-sided."""
  for p0 in accuracy.wilson_interval(p, n):
    assert (p - p0) ** 2 == pytest.approx(accuracy.Z95 ** 2 * p0 * (1 - p0) / n, rel=1e-9)


def test_wilson_interval_without_count():
  assert accuracy.wilson_interval(0.5, None) is None
  assert accuracy.wilson_interval(0.5, 0) is None
  assert accuracy.wilson_interval(None, 100) is None
  assert accuracy.wilson_interval(0.5, float("nan")) is None


@pytest.mark.parametrize("a, b, c, d, low, high", [(56, 70, 48, 80, 0.0524, 0.3339),
                                                   (9, 10, 3, 10, 0.1705, 0.8090),
                                                   (5, 56, 0, 29, -0.0381, 0.1926)])
def test_newcombe_difference_matches_published_values(a, b, c, d, low, high):
  lo, hi = accuracy.newcombe_difference(a / b, b, c / d, d)
  assert (round(lo, 4), round(hi, 4)) == (low, high)


def test_test_examples_from_the_record_or_its_data_stats():
  assert accuracy.test_examples(record("vanilla", "listops", 0, 0.3, n=150)) == 150
  assert accuracy.test_examples(record("vanilla", "listops", 0, 0.3, data_n=120)) == 120
  assert accuracy.test_examples(record("vanilla", "listops", 0, 0.3)) is None
  assert accuracy.test_examples(dict(record("vanilla", "listops", 0, 0.3), test_examples=True)) is None


SMOKE = [record("vanilla", "listops", 0, 0.36, n=200), record("vanilla", "listops", 1, 0.38, n=200),
         record("performer", "listops", 0, 0.33, n=200),     # 4 points below vanilla on 200: noise
         record("linformer", "listops", 0, 0.17, n=200),     # 20 points below: real
         record("vanilla", "text", 0, 0.60, n=150), record("performer", "text", 0, 0.66, n=150)]


def test_cells_carry_interval_and_comparison_with_vanilla():
  rep = accuracy.accuracy_report(SMOKE, "smoke", REFERENCE)
  cells = rep.cells.set_index(["attention", "task"])
  lo, hi = accuracy.wilson_interval(0.37, 200)
  assert cells.loc[("vanilla", "listops"), "test_examples"] == 200
  assert cells.loc[("vanilla", "listops"), ["ci_low", "ci_high"]].tolist() == pytest.approx([100 * lo, 100 * hi])
  d_lo, d_hi = accuracy.newcombe_difference(0.33, 200, 0.37, 200)
  assert d_lo < 0 < d_hi
  assert cells.loc[("performer", "listops"), ["vs_vanilla_low", "vs_vanilla_high"]].tolist() == \
      pytest.approx([100 * d_lo, 100 * d_hi])
  assert cells.loc[("performer", "listops"), "vs_vanilla"] == "≈"
  assert cells.loc[("linformer", "listops"), "vs_vanilla"] == "lower"
  assert cells.loc[("performer", "text"), "vs_vanilla"] == "≈"
  assert pd.isna(cells.loc[("vanilla", "listops"), "vs_vanilla"])          # vanilla is the baseline
  assert pd.isna(cells.loc[("bigbird", "listops"), "ci_low"])              # no data, no interval
  # Markdown: "≈ mean [low, high]"; vanilla's mean ± std over its two seeds
  assert cell(rep, "vanilla") == f"37.00 ± 1.41 [{100 * lo:.1f}, {100 * hi:.1f}]"
  assert cell(rep, "performer").startswith("≈ 33.00 [") and cell(rep, "linformer").startswith("17.00 [")
  md, tex = rep.ours.to_markdown(), rep.ours.to_latex()
  assert "Wilson 95%" in md and "Newcombe" in md and "n: ListOps 200, Text 150" in md
  assert "$\\approx$ 33.00 [" in tex and "Newcombe" in tex and "\\footnotesize" in tex
  # CSV: the same numbers, one column each
  csv = pd.read_csv(io.StringIO(rep.cells.to_csv(index=False)))
  row = csv[(csv.attention == "performer") & (csv.task == "listops")].iloc[0]
  assert {"test_examples", "ci_low", "ci_high", "vs_vanilla_low", "vs_vanilla_high", "vs_vanilla"} <= set(csv)
  assert row.vs_vanilla == "≈" and row.test_examples == 200 and row.ci_low < 33 < row.ci_high


def test_the_same_gap_is_significant_with_more_test_examples():
  big = [dict(r, test_examples=100_000) for r in SMOKE]
  cells = accuracy.accuracy_report(big, "smoke", REFERENCE).cells.set_index(["attention", "task"])
  assert cells.loc[("performer", "listops"), "vs_vanilla"] == "lower"
  assert cells.loc[("performer", "text"), "vs_vanilla"] == "higher"


def test_seeds_with_different_counts_use_the_smallest():
  records = [record("vanilla", "listops", 0, 0.4, n=200), record("vanilla", "listops", 1, 0.4, n=180)]
  cells = accuracy.accuracy_cells(records, "smoke", attentions=["vanilla"], task_names=["listops"])
  assert cells["test_examples"].tolist() == [180]


def test_records_without_test_examples_show_no_interval_and_say_why():
  old = [{k: v for k, v in r.items() if k != "test_examples"} for r in SMOKE]
  rep = accuracy.accuracy_report(old, "smoke", REFERENCE)
  assert cell(rep, "vanilla") == "37.00 ± 1.41" and cell(rep, "performer") == "33.00"
  assert rep.cells["ci_low"].isna().all() and rep.cells["vs_vanilla"].isna().all()
  assert "[a, b]" not in rep.ours.caption
  md = rep.ours.to_markdown()
  assert "No confidence intervals" in md and "test_examples" in md


def test_one_cell_without_count_is_named():
  mixed = SMOKE + [record("linformer", "text", 0, 0.5)]
  rep = accuracy.accuracy_report(mixed, "smoke", REFERENCE)
  assert cell(rep, "linformer", "Text") == "50.00"
  assert "No interval (and no ≈ test) for 1 cell(s)" in rep.ours.to_markdown()
  assert "linformer / Text" in rep.ours.to_markdown()
  assert not math.isnan(rep.cells.set_index(["attention", "task"]).loc[("performer", "text"), "ci_low"])


def test_written_report_carries_the_intervals(tmp_path, fast_compile):
  import os

  from lra_bench.experiments import results
  from lra_bench.report import index as report_index

  results_dir, out = str(tmp_path / "results"), str(tmp_path / "report")
  for r in SMOKE:
    results.append_record(results_dir, r)
  report_index.write_report(results_dir, out, attention_names=["vanilla"])
  csv = pd.read_csv(os.path.join(out, "accuracy_smoke.csv"))
  row = csv[(csv.attention == "performer") & (csv.task == "listops")].iloc[0]
  assert row.test_examples == 200 and row.vs_vanilla == "≈" and row.ci_low < 33 < row.ci_high
  with open(os.path.join(out, "accuracy_smoke.md"), encoding="utf-8") as f:
    md = f.read()
  with open(os.path.join(out, "accuracy_smoke.tex"), encoding="utf-8") as f:
    tex = f.read()
  assert "≈ 33.00 [" in md and "Newcombe" in md
  assert "$\\approx$ 33.00 [" in tex and "Wilson 95" in tex
