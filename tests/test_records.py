"""Records are never lost without a word: a write that fails (a full disk, simulated by an ``os.write``
that writes part of its data and raises ``ENOSPC``, or returns short) raises and leaves the file as it
was; a line cut short by an older crash does not swallow the next record; readers name every line they
cannot read (stderr, and the report's index)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from lra_bench.experiments import cell, results
from lra_bench.report import index as report_index
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides

REAL_WRITE = os.write


def record(seed: int, **extra) -> dict:
  return results.make_record(status="ok", task="listops", attention="vanilla", protocol="smoke", seed=seed,
                             config_hash="abc", max_length=64, test_accuracy=0.5, **extra)


def full_disk(target: str, *, raise_error: bool = True):
  """An ``os.write`` that, for ``target``, writes the first half of the data and then fails (a full disk
  part-way through the line), or returns the short count without raising."""
  def write(fd, data):
    if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(target):
      written = REAL_WRITE(fd, bytes(data)[:len(data) // 2])
      if raise_error:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return written
    return REAL_WRITE(fd, data)
  return write


def _bytes(path) -> bytes:
  with open(path, "rb") as f:
    return f.read()


@pytest.mark.parametrize("raise_error", [True, False], ids=["ENOSPC", "short_write"])
def test_failed_append_raises_and_leaves_the_file_unchanged(tmp_path, monkeypatch, raise_error):
  assert results.append_record(str(tmp_path), record(0))
  before = _bytes(tmp_path / results.RESULTS_FILE)
  monkeypatch.setattr(os, "write", full_disk(results.RESULTS_FILE, raise_error=raise_error))
  with pytest.raises(results.RecordWriteError, match="could not write the record to .*results.jsonl"):
    results.append_record(str(tmp_path), record(1))
  assert _bytes(tmp_path / results.RESULTS_FILE) == before   # nothing partial left behind
  monkeypatch.setattr(os, "write", REAL_WRITE)               # space freed: the next append works
  assert results.append_record(str(tmp_path), record(1))
  assert [r["seed"] for r in results.load_records(str(tmp_path))] == [0, 1]


def test_failed_json_write_keeps_the_previous_file(tmp_path, monkeypatch):
  path = tmp_path / "run" / "result.json"
  results.write_json_atomic(str(path), record(0))
  before = _bytes(path)
  monkeypatch.setattr(os, "write", full_disk(".tmp-"))
  with pytest.raises(results.RecordWriteError, match="result.json"):
    results.write_json_atomic(str(path), record(1))
  assert _bytes(path) == before and os.listdir(path.parent) == ["result.json"]  # no temporary file left


def test_truncated_last_line_does_not_swallow_the_next_record(tmp_path, capsys):
  assert results.append_record(str(tmp_path), record(0))
  with open(tmp_path / results.RESULTS_FILE, "a") as f:
    f.write('{"task": "listops", "seed": 7, "stat')           # an older crash cut this line short
  assert results.append_record(str(tmp_path), record(1))
  assert [r["seed"] for r in results.load_records(str(tmp_path))] == [0, 1]
  assert f"{tmp_path / results.RESULTS_FILE}:2: not a JSON record" in capsys.readouterr().err


def test_unreadable_lines_are_named_on_stderr_once_and_in_the_report(tmp_path, capsys, fast_compile):
  results_dir = tmp_path / "results"
  assert results.append_record(str(results_dir), record(0))
  with open(results_dir / results.RESULTS_FILE, "a") as f:
    f.write('{"task": "listops", "seed": 7, "stat\n[1, 2]\n')
  assert results.append_record(str(results_dir), record(1))  # reads the file: warns
  assert len(results.load_records(str(results_dir))) == 2    # reads it again: no second warning
  err = capsys.readouterr().err
  path = results_dir / results.RESULTS_FILE
  assert err.count(f"warning: {path}:2:") == 1 and err.count(f"warning: {path}:3: not a JSON object") == 1
  report_index.write_report(str(results_dir), str(tmp_path / "report"), attention_names=["vanilla"])
  with open(tmp_path / "report" / "index.md") as f:
    index = f.read()
  assert "2 records, 2 unreadable lines" in index and "## Unreadable lines in the results file" in index
  assert f"`{path}:2: not a JSON record" in index and f"`{path}:3: not a JSON object" in index


def test_a_run_whose_record_cannot_be_appended_fails_loudly(listops_dir, tmp_path, monkeypatch, fast_compile):
  """``train`` on a full disk: an error (the command exits non-zero), not an accuracy; the file is as
  it was, and the rerun records the finished run without training it again."""
  config = config_lib.load_config("smoke", "listops", tiny_overrides(num_train_steps=4, eval_every=4,
                                                                      checkpoint_every=4))
  results_dir, workdir = tmp_path / "results", str(tmp_path / "run")
  assert results.append_record(str(results_dir), record(0))
  before = _bytes(results_dir / results.RESULTS_FILE)
  monkeypatch.setattr(os, "write", full_disk(results.RESULTS_FILE))
  with pytest.raises(results.RecordWriteError):
    cell.train_cell(config, workdir, listops_dir, str(results_dir))
  assert _bytes(results_dir / results.RESULTS_FILE) == before
  monkeypatch.setattr(os, "write", REAL_WRITE)
  with open(os.path.join(workdir, "result.json")) as f:
    finished = json.load(f)
  assert cell.train_cell(config, workdir, listops_dir, str(results_dir)) == finished
  assert [r.get("config_hash") for r in results.load_records(str(results_dir))] == ["abc", finished["config_hash"]]
