"""The stages' progress display (``tasks.progress``) and what the suite and the benchmark count with it: off a
terminal, one line per finished unit; a heartbeat line while a long unit runs; the suite's cells that train
counted apart from the cells without data (known before they run, or learnt from a sibling), its time left
from the trained cells only; the benchmark's time left from the measured points of each length."""

import io
import time

import pytest

from lra_bench.experiments import bench, suite
from tasks import progress


def test_lines_per_finished_unit_off_a_terminal():
  out = io.StringIO()
  bar = progress.Progress(3, "stage", "things", stream=out, remaining=lambda: 65.0, heartbeat_s=3600)
  bar.advance(note="first ok")
  bar.set_extra("no data 1/4")
  bar.advance(note="second ok")
  bar.write("a message")
  bar.advance(note="third ok")
  bar.close()
  lines = out.getvalue().splitlines()
  assert lines[0].startswith("stage: 1/3 things: first ok; ~1:05 left; ")
  assert lines[1].startswith("stage: 2/3 things: second ok; no data 1/4; ~1:05 left; ")
  assert lines[2] == "a message"
  assert lines[3].startswith("stage: 3/3 things: third ok; no data 1/4; ") and "left" not in lines[3]
  assert len(lines) == 4  # nothing but the units and the message: no bar, no carriage returns


def test_every_n_units_and_the_last():
  out = io.StringIO()
  with progress.Progress(25, "gen", "examples", stream=out, every=10, heartbeat_s=3600) as bar:
    for _ in range(25):
      bar.advance()
  assert [line.split(":")[1].strip() for line in out.getvalue().splitlines()] == \
      ["10/25 examples", "20/25 examples", "25/25 examples"]


def test_a_heartbeat_line_while_a_unit_runs():
  """Off a terminal, a line says what still runs when nothing was printed for ``heartbeat_s``."""
  out = io.StringIO()
  bar = progress.Progress(2, "stage", "cells", stream=out, heartbeat_s=0.05)
  bar.set_status("listops/vanilla/seed0")
  deadline = time.monotonic() + 30  # a bound on waiting, not a timing check
  while "running listops/vanilla/seed0" not in out.getvalue() and time.monotonic() < deadline:
    time.sleep(0.05)
  bar.close()
  assert out.getvalue().startswith("stage: 0/2 cells: running listops/vanilla/seed0 (")


def test_clock():
  assert [progress.clock(s) for s in (None, 0, 65, 3725)] == ["?", "0:00", "1:05", "1:02:05"]


@pytest.fixture
def grid(tmp_path, monkeypatch):
  """Smoke cells of ListOps (its file exists) and Text (no TFDS dataset anywhere), three attentions each."""
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  data_dir = tmp_path / "data"
  (data_dir / "listops-1000").mkdir(parents=True)
  (data_dir / "listops-1000" / "smoke_train.tsv").write_text("Source\tTarget\n")
  cells, _ = suite.plan("smoke", ["listops", "text"], ["vanilla", "local", "performer"], [0],
                        str(tmp_path / "results"))
  suite._missing_reason.cache_clear()
  return cells, str(data_dir), str(tmp_path / "results")


def test_the_suite_counts_cells_without_data_apart(grid, capsys):
  cells, data_dir, _ = grid
  display = suite.GridProgress(cells, data_dir, "suite smoke", workers=1)
  assert display.counts() == (0, 3, 0, 3)  # the text cells are known to lack their data before they run
  assert display.seconds_left() is None  # nothing trained yet: no estimate
  display.finished("text/vanilla/seed0", "no_data", 1.0)
  display.finished("listops/vanilla/seed0", "ok", 40.0)
  display.finished("text/local/seed0", "no_data", 1.0)
  assert display.counts() == (1, 2, 2, 1)
  assert display.seconds_left() == pytest.approx(80.0)  # 2 cells to train x 40 s; the no_data cells cost 0
  # a cell expected to train that ends no_data: the rest of its task (same data options) count as skipped
  display.finished("listops/local/seed0", "no_data", 1.0)
  assert display.counts() == (1, 0, 3, 2)
  display.close()
  lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("suite smoke:")]
  assert len(lines) == 1 and lines[0].startswith("suite smoke: 1/3 cells trained: listops/vanilla/seed0 ok in "
                                                 "0:40; no data 1/3; ~1:20 left;")


def test_the_suite_display_from_a_launchs_records(grid, capsys):
  """``poll``: the cells with a record since the launch was planned, their time from the record."""
  from lra_bench.experiments import launcher, results

  cells, data_dir, results_dir = grid
  launch = launcher.Grid(cells, results_dir, data_dir, [], False, ("no_data", "failed"),
                         suite.record_counts(cells, []), suite.work)
  display = suite.GridProgress(cells, data_dir, "suite smoke", workers=2)
  record = results.train_record(cells[0].config, "ok", workdir=cells[0].workdir, data_dir=data_dir,
                                wall_seconds=30.0)
  results.append_record(results_dir, record)
  display.poll(launch)
  assert display.counts() == (1, 2, 0, 3) and display.seconds_left() == pytest.approx(30.0)  # 2 x 30 s / 2
  display.close()
  assert "suite smoke: 1/3 cells trained: listops/vanilla/seed0 ok in 0:30" in capsys.readouterr().err


def test_the_benchmark_estimates_each_length_from_its_measured_points():
  class Config:
    def __init__(self, name, length):
      self.model = type("M", (), {"attention": name})
      self.data = type("D", (), {"max_length": length})

  queues = [[bench.Point(Config(a, n), (a, n)) for n in (256, 512)] for a in ("vanilla", "performer")]
  display = bench.SweepProgress(queues, "bench core", enabled=False)
  display.measured(("vanilla", 256), "ok", 10.0)
  display.measured(("performer", 256), "ok", 20.0)
  # no 512 point measured yet: each costs the mean of all (15 s); the workers run side by side
  assert display.seconds_left() == pytest.approx(15.0, abs=0.5)
  display.measured(("vanilla", 512), "ok", 40.0)
  assert display.seconds_left() == pytest.approx(40.0, abs=0.5)  # performer's 512 point: 512's mean
  display.close()
