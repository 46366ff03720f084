"""The report and self-pretraining (SPT): SPT runs never enter the from-scratch accuracy tables, records
of the pretraining stage (kind "pretrain") enter no accuracy table, the SPT-vs-scratch table's numbers
(both sides, their difference with Newcombe's interval, the step budgets), and the published SPT rows.

Records are hand-written as ``results.train_record`` writes them: the protocol's full config (an SPT run's
with its ``pretrain`` section) and a config hash that includes the seed.
"""

import hashlib
import json
import os

import pandas as pd
import pytest

from lra_bench.experiments import results
from lra_bench.report import accuracy, pretraining, reference
from lra_bench.report import index as report_index
from lra_bench.training import config as config_lib

REFERENCE, _ = reference.load_reference()


def record(task, attention, seed, acc, objective="none", protocol="smoke", steps=None, pretrain_steps=1000,
           mask_rate=0.5, pretrain_val=0.5, examples=2000, kind="train", status="ok", **config_changes):
  """A train record of a from-scratch run (``objective="none"``) or of a run fine-tuned after SPT."""
  config = config_lib.load_config(protocol, task, attention=attention, seed=seed).to_dict()
  config.update(config_changes)
  if steps is not None:
    config["num_train_steps"] = steps
  out = {"kind": kind, "task": task, "attention": attention, "protocol": protocol, "seed": seed, "status": status,
         "error": None, "test_accuracy": acc, "test_examples": examples, "train_steps": config["num_train_steps"],
         "max_length": config["data"]["max_length"], "backend": "cpu", "device_kind": "cpu", "num_devices": 1}
  if objective != "none":
    config["pretrain"] = {"objective": objective, "mask_rate": mask_rate, "num_train_steps": pretrain_steps}
    out["pretrain"] = {"objective": objective, "mask_rate": mask_rate, "train_steps": pretrain_steps,
                       "workdir": "/tmp/pre", "config_hash": "p", "status": "ok", "best_val_accuracy": pretrain_val,
                       "test_accuracy": pretrain_val - 0.01, "best_step": pretrain_steps}
  out["config"] = config
  out["config_hash"] = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
  assert results.record_problem(out) is None
  return out


def pretrain_stage(task, attention, seed, acc, protocol="smoke"):
  """The record the pretraining stage writes (kind "pretrain": its accuracy is on masked positions)."""
  out = record(task, attention, seed, acc, objective="masked", protocol=protocol, kind="pretrain")
  del out["pretrain"]
  return out


def cell(cells, attention, task="listops"):
  return cells.set_index(["attention", "task"]).loc[(attention, task)]


def test_spt_runs_never_enter_the_scratch_accuracy_cells():
  scratch = [record("listops", "vanilla", 0, 0.30)]
  before = cell(accuracy.accuracy_cells(scratch, "smoke"), "vanilla")
  assert before["n"] == 1 and before["mean"] == pytest.approx(30.0)
  spt = record("listops", "vanilla", 0, 0.40, objective="masked")  # the same cell, seed and protocol
  assert results.pretrain_objective(spt) == "masked" and results.pretrain_objective(scratch[0]) == "none"
  for records in (scratch + [spt], [spt] + scratch):
    cells = accuracy.accuracy_cells(records, "smoke")
    after = cell(cells, "vanilla")
    assert after["n"] == 1 and after["seeds"] == "0" and after["mean"] == pytest.approx(30.0)
    assert after["ignored"] == 0 and cells.attrs["spt_records"] == 1
  # A cell with SPT runs only is empty in the scratch table (with the command that runs it from scratch).
  only_spt = cell(accuracy.accuracy_cells([spt], "smoke"), "vanilla")
  assert only_spt["n"] == 0 and only_spt["status"] == "missing" and "lra-bench suite" in only_spt["fix"]
  rep = accuracy.accuracy_report(scratch + [spt], "smoke", REFERENCE)
  assert any("1 run(s) fine-tuned after self-pretraining" in n for n in rep.ours.notes)
  assert not any("other configs" in n for n in rep.ours.notes)


def test_spt_table_numbers_difference_and_budgets():
  records = [record("listops", "vanilla", 0, 0.30, steps=2000),
             record("listops", "vanilla", 0, 0.40, objective="masked", steps=1000, pretrain_steps=1000,
                    pretrain_val=0.712),
             # a second SPT cell: a small difference (≈) and an unequal budget
             record("text", "vanilla", 0, 0.60, steps=500),
             record("text", "vanilla", 0, 0.61, objective="masked", steps=500, pretrain_steps=1000)]
  cells = pretraining.spt_cells(records, "smoke")
  assert list(cells.task) == ["listops", "text"] and set(cells.objective) == {"masked"}
  c = cell(cells, "vanilla")
  assert c["scratch_mean"] == pytest.approx(30.0) and c["spt_mean"] == pytest.approx(40.0)
  assert c["scratch_n"] == 1 and c["spt_n"] == 1 and c["scratch_test_examples"] == 2000
  low, high = accuracy.wilson_interval(0.40, 2000)
  assert (c["spt_ci_low"], c["spt_ci_high"]) == pytest.approx((100 * low, 100 * high))
  assert c["diff"] == pytest.approx(10.0) and c["verdict"] == "higher"
  low, high = accuracy.newcombe_difference(0.40, 2000, 0.30, 2000)
  assert (c["diff_low"], c["diff_high"]) == pytest.approx((100 * low, 100 * high))
  assert 7.0 < c["diff_low"] < 10.0 < c["diff_high"] < 13.0
  assert (c["scratch_steps"], c["pretrain_steps"], c["finetune_steps"]) == (2000, 1000, 1000)
  assert c["spt_total_steps"] == 2000 and c["budget"] == "equal"
  assert c["pretrain_val_accuracy"] == pytest.approx(71.2) and c["mask_rate"] == 0.5
  t = cell(cells, "vanilla", "text")
  assert t["diff"] == pytest.approx(1.0) and t["verdict"] == "≈" and t["diff_low"] < 0 < t["diff_high"]
  assert t["budget"] == "SPT +1000 steps"
  table = pretraining.spt_table(cells, "smoke")
  row = dict(zip(table.columns, table.rows[0]))
  assert row["Attention"] == "vanilla" and row["SPT objective"] == "masked (0.5)"
  assert row["ListOps scratch"] == "30.00 [28.0, 32.0]" and row["ListOps SPT"].startswith("40.00 [")
  assert row["ListOps Δ SPT − scratch"] == f"+10.00 [+{100 * low:.1f}, +{100 * high:.1f}] higher"
  assert row["ListOps steps (scratch vs pre + fine)"] == "2000 vs 1000 + 1000 (equal)"
  assert row["ListOps pretrain val"] == "71.20"
  assert row["Text Δ SPT − scratch"].startswith("≈ +1.00 [−")
  assert row["Text steps (scratch vs pre + fine)"] == "500 vs 1000 + 500 (SPT +1000 steps)"
  assert any("1 cell(s) compare unequal step budgets" in f for f in table.footnotes)


def test_scratch_side_prefers_the_spt_config_without_pretraining():
  spt = record("listops", "vanilla", 0, 0.40, objective="masked", steps=1000, pretrain_steps=1000)
  same = [record("listops", "vanilla", s, 0.30, steps=2000) for s in (0,)]
  other = [record("listops", "vanilla", s, 0.20, steps=2000, batch_size=4) for s in (0, 1)]  # more ok seeds
  c = cell(pretraining.spt_cells(other + same + [spt], "smoke"), "vanilla")
  assert c["scratch_mean"] == pytest.approx(30.0) and c["scratch_n"] == 1
  assert "2 from-scratch configs; used the one equal to the SPT config" in c["scratch_note"]
  assert "the SPT total budget" in c["scratch_note"]
  # No scratch config equals it: the one with most ok seeds, and the note names what differs.
  c = cell(pretraining.spt_cells(other + [spt], "smoke"), "vanilla")
  assert c["scratch_mean"] == pytest.approx(20.0) and c["scratch_n"] == 2
  assert "batch_size=4 (SPT 8)" in c["scratch_note"] or "batch_size=4 (SPT" in c["scratch_note"]
  # No scratch run at all: the SPT side alone, said in a note.
  cells = pretraining.spt_cells([spt], "smoke")
  assert cell(cells, "vanilla")["scratch_n"] == 0 and pd.isna(cell(cells, "vanilla")["diff"])
  assert any("no from-scratch run" in n for n in pretraining.spt_table(cells, "smoke").notes)


def test_pretrain_stage_records_enter_no_accuracy_table(tmp_path, fast_compile):
  stage = pretrain_stage("listops", "vanilla", 0, 0.93)
  # Its kind alone keeps it out, whatever its config says (here none of a pretrain section).
  bare = pretrain_stage("listops", "vanilla", 1, 0.93)
  del bare["config"]["pretrain"]
  scratch = record("listops", "vanilla", 0, 0.30)
  spt = record("listops", "vanilla", 0, 0.40, objective="masked")
  records = [stage, bare, scratch, spt]
  scratch_cell = cell(accuracy.accuracy_cells(records, "smoke"), "vanilla")
  assert scratch_cell["mean"] == pytest.approx(30.0) and scratch_cell["n"] == 1
  assert cell(accuracy.accuracy_cells([stage, bare], "smoke"), "vanilla")["n"] == 0
  spt_cell = cell(pretraining.spt_cells(records, "smoke"), "vanilla")
  assert spt_cell["spt_mean"] == pytest.approx(40.0) and spt_cell["spt_n"] == 1
  assert spt_cell["scratch_mean"] == pytest.approx(30.0) and spt_cell["scratch_n"] == 1
  assert not pretraining.has_spt([stage, bare, scratch], "smoke")
  # The whole report: 93.00 appears nowhere.
  results_dir, out = str(tmp_path / "results"), str(tmp_path / "report")
  for r in records:
    assert results.append_record(results_dir, r)
  paths = report_index.write_report(results_dir, out, attention_names=["vanilla"])
  names = {os.path.basename(p) for p in paths}
  assert {"accuracy_smoke.csv", "pretraining_smoke.md", "pretraining_smoke.csv", "pretraining_smoke.tex"} <= names
  for name in names:
    if name.endswith((".md", ".csv", ".tex")):
      with open(os.path.join(out, name)) as f:
        assert "93.0" not in f.read(), name
  with open(os.path.join(out, "index.md")) as f:
    index = f.read()
  assert "- pretrain records: 2" in index
  assert index.index("## Accuracy — protocol `smoke`") < index.index("## Self-pretraining (SPT) vs from scratch")
  saved = pd.read_csv(os.path.join(out, "pretraining_smoke.csv"))
  assert saved.loc[0, "diff"] == pytest.approx(10.0) and saved.loc[0, "verdict"] == "higher"


def test_no_spt_section_without_spt_records(tmp_path, fast_compile):
  results_dir, out = str(tmp_path / "results"), str(tmp_path / "report")
  results.append_record(results_dir, record("listops", "vanilla", 0, 0.30))
  paths = report_index.write_report(results_dir, out, attention_names=["vanilla"])
  assert not any(os.path.basename(p).startswith("pretraining_") for p in paths)
  with open(os.path.join(out, "index.md")) as f:
    index = f.read()
  assert "Self-pretraining" not in index and "fine-tuned after self-pretraining" not in index


def test_published_spt_rows_load_and_show(tmp_path):
  published = reference.load_spt_reference()
  rows = published.set_index("pretraining")
  assert list(published.columns) == reference.SPT_COLUMNS
  assert rows.loc["masked", "avg"] == "86.21" and rows.loc["none", "avg"] == "54.39"
  masked = [float(rows.loc["masked", c]) for c in ("listops", "text", "retrieval", "image", "pathfinder", "path_x")]
  assert sum(masked) / 6 == pytest.approx(86.21, abs=0.005)  # the paper's average is over the six tasks
  assert rows.loc["none", "source"] == "lra_paper_table1" and "86.21 − 54.39 = 31.8" in rows.loc["none", "note"]
  table = pretraining.published_table(published)
  by = {r[1]: dict(zip(table.columns, r)) for r in table.rows}
  assert by["masked"]["ListOps"] == "61.49" and by["masked"]["Path-X"] == "92.98" and by["masked"]["Avg"] == "86.21"
  assert by["none"]["ListOps"] == "36.37" and by["masked"]["Source"] == "amos_2024_table1"
  assert "published under the paper's own protocol" in table.caption and "not comparable with ours" in table.caption
  assert "amos_2024 (Transformer + rotary" in table.caption and by["masked"]["Protocol"].startswith("amos_2024")
  # In the SPT section of a report; a folder without the file has none (and no error).
  rep = pretraining.spt_report([record("listops", "vanilla", 0, 0.40, objective="masked")], "smoke", published)
  assert "61.49" in rep.published.to_markdown() and rep.published.to_latex()
  empty = reference.load_spt_reference(str(tmp_path))
  assert empty.empty and pretraining.published_table(empty) is None
