"""Relative paths (or none) are resolved by the training code itself, not only by the command line. (The
documented ``train`` command, run verbatim from a fresh working directory with its relative workdir, is
tests/test_cli.py's ``test_readme_commands_work_from_a_fresh_directory``.)"""

from __future__ import annotations

import os

from lra_bench.experiments import cell, results
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides


def test_relative_paths_are_resolved_by_the_training_code(listops_dir, tmp_path, monkeypatch, fast_compile):
  """``train_cell`` with relative workdir, data dir and results dir (no command line to resolve them)."""
  monkeypatch.chdir(tmp_path)
  os.symlink(listops_dir, tmp_path / "data")
  config = config_lib.load_config("smoke", "listops", tiny_overrides(num_train_steps=8, eval_every=4,
                                                                      checkpoint_every=4))
  record = cell.train_cell(config, "runs/rel", "data", "results")
  assert record["status"] == "ok", record["error"]
  assert record["workdir"] == str(tmp_path / "runs" / "rel") and record["data_dir"] == str(tmp_path / "data")
  monkeypatch.chdir("/")  # readers elsewhere see the same files
  assert os.path.exists(tmp_path / "runs" / "rel" / "checkpoints" / "best")
  assert [r["test_accuracy"] for r in results.load_records(str(tmp_path / "results"))] == [record["test_accuracy"]]
