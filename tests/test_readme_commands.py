"""The documented ``train`` command (docs/usage.md, "The first commands") works as written, from a fresh
working directory: relative paths (or none) are resolved by the training code itself, not only by the command
line."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from lra_bench.experiments import cell, results
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_command(prefix: str) -> list[str]:
  """The first line of docs/usage.md that starts with ``prefix``, as argv words (its ``#`` comment dropped)."""
  with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
    for line in f:
      if line.startswith(prefix):
        return shlex.split(line, comments=True)
  raise AssertionError(f"docs/usage.md has no line starting with {prefix!r}")


def _option(words: list[str], name: str) -> str:
  return words[words.index(name) + 1]


@pytest.mark.timeout(600)
def test_readme_train_command_from_a_fresh_directory(listops_dir, tmp_path, fast_compile):
  words = readme_command("lra-bench train ")
  workdir = _option(words, "--workdir")
  assert not os.path.isabs(workdir), "the documented train command should show a relative --workdir"
  cwd = tmp_path / "fresh"
  cwd.mkdir()
  # The documented command word for word, on the tiny ListOps data (and a tiny model: --set).
  argv = [sys.executable, "-m", "lra_bench", *words[1:], f"--data_dir={listops_dir}",
          *(f"--set={o}" for o in tiny_overrides(num_train_steps=8, eval_every=4, checkpoint_every=4))]
  proc = subprocess.run(argv, cwd=cwd, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                        text=True, timeout=540)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(cwd / workdir / "result.json") as f:
    record = json.load(f)
  assert record["status"] == "ok" and record["workdir"] == str(cwd / workdir)
  assert "test accuracy" in proc.stdout
  assert f"ok record written to {cwd / workdir / 'result.json'}" in proc.stderr  # shown by default


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
