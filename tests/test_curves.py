"""Learning curves: the record's ``val_curve`` (every validation of the run, read back from its TensorBoard
events, resumes included) and the report's figure drawn from it."""

from __future__ import annotations

import os

import pytest

from lra_bench.experiments import cell, results
from lra_bench.report import curves, index
from lra_bench.training import config as config_lib
from lra_bench.training import loop
from tests.conftest import tiny_overrides


def _write(workdir, points, writer_class=None):
  """Events as the loop writes them (``loop.ScalarWriter``), or with ``writer_class`` (flax's
  ``SummaryWriter``: tensor summaries, what runs wrote before 2026-11-28)."""
  writer = (writer_class or loop.ScalarWriter)(os.path.join(workdir, "tensorboard"))
  for step, value in points:
    writer.scalar("eval/accuracy", value, step)
    writer.scalar("train/loss", 9.0, step)           # other tags are not the curve
  writer.close()


def test_a_resumed_runs_curve_keeps_the_latest_value_of_each_step(tmp_path):
  workdir = str(tmp_path)
  _write(workdir, [(10, 0.1), (20, 0.2), (30, 0.3)])   # the first start: killed after step 30
  _write(workdir, [(30, 0.35), (40, 0.4)])             # the resume from step 20 evaluates 30 again
  with open(os.path.join(workdir, "tensorboard", "events.out.tfevents.0.broken"), "wb") as f:
    f.write(b"\x00garbage")                            # a damaged file costs nothing but itself
  assert loop.validation_curve(workdir) == [[10, 0.1], [20, 0.2], [30, 0.35], [40, 0.4]]
  assert loop.validation_curve(workdir, last_step=30) == [[10, 0.1], [20, 0.2], [30, 0.35]]
  assert loop.validation_curve(str(tmp_path / "nothing")) == []


def test_a_run_resumed_across_the_writer_change_keeps_both_parts_of_its_curve(tmp_path):
  """flax's tensor summaries (earlier starts) and the tensorboard package's scalars (later ones) in one
  run directory (time.sleep: the later start's value of step 100 is the later in time, as in a real resume)."""
  import time

  from flax.metrics import tensorboard

  _write(str(tmp_path), [(50, 0.087), (100, 0.071)], tensorboard.SummaryWriter)
  time.sleep(1.1)
  _write(str(tmp_path), [(100, 0.072), (150, 0.1605)])
  assert loop.validation_curve(str(tmp_path)) == [[50, 0.087], [100, 0.072], [150, 0.1605]]


def test_a_finished_runs_record_has_its_curve(listops_dir, tmp_path, fast_compile):
  config = config_lib.load_config("smoke", "listops", tiny_overrides(num_train_steps=8, eval_every=2,
                                                                      checkpoint_every=4))
  record = cell.train_cell(config, str(tmp_path / "run"), listops_dir, str(tmp_path / "results"))
  assert [step for step, _ in record["val_curve"]] == [2, 4, 6, 8]
  assert record["best_val_accuracy"] == pytest.approx(max(acc for _, acc in record["val_curve"]), abs=1e-6)
  # a forced rerun with fewer evaluations: its curve is its own, not merged with the first run's
  fewer = config_lib.load_config("smoke", "listops", tiny_overrides(num_train_steps=8, eval_every=4,
                                                                     checkpoint_every=4))
  rerun = cell.train_cell(fewer, str(tmp_path / "run"), listops_dir, str(tmp_path / "results"), force=True)
  assert [step for step, _ in rerun["val_curve"]] == [4, 8]


def _record(tmp_path, attention, curve, seed=0):
  config = config_lib.load_config("xiong", "listops", attention=attention, seed=seed)
  return results.train_record(config, "ok", workdir=str(tmp_path / attention), data_dir=str(tmp_path),
                              test_accuracy=0.3, test_examples=2000, val_curve=curve)


def test_the_report_draws_runs_with_two_evaluations_or_more(tmp_path):
  records = [_record(tmp_path, "vanilla", [[50, 0.1], [100, 0.2], [150, 0.35]]),
             _record(tmp_path, "performer", [[50, 0.1], [100, 0.12]]),
             _record(tmp_path, "linformer", [[100, 0.3]])]       # one evaluation: no line
  by_task = curves.curves(records, "xiong")
  assert [(a, len(c)) for a, _, c in by_task["listops"]] == [("vanilla", 3), ("performer", 2)]
  results_dir = tmp_path / "results"
  for r in records:
    results.append_record(str(results_dir), r)
  written = index.write_report(str(results_dir), str(tmp_path / "out"), attention_names=[])
  assert str(tmp_path / "out" / "learning_curves_xiong.png") in written
  text = (tmp_path / "out" / "index.md").read_text()
  assert "## Learning curves" in text and "learning_curves_xiong.png" in text
  assert "## Effective attention patterns" not in text   # attention_names=[] (the default): none drawn
  assert curves.learning_curves_figure([records[2]], "xiong", str(tmp_path / "none")) == []
