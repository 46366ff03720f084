"""Issue 30 item 6: one process trains a workdir at a time.

The same ``train`` command started twice used to make the legitimate run fail (orbax's temporary
directory removed under it), overwrite its ``ok`` result.json with ``failed`` and advise ``--force``.
Now the second process exits 1 with one line naming the pid and host that hold the workdir, and leaves
every file there as it was.
"""

import os
import subprocess
import sys

import pytest

from lra_bench.experiments import cell, suite
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLD = ("import sys, time; from lra_bench.experiments import cell\n"
        "with cell.exclusive(sys.argv[1]) as holder:\n"
        "  assert holder is None\n  print('held', flush=True)\n  time.sleep(600)\n")


def snapshot(directory):
  """{relative path: (size, mtime_ns, bytes)} of every file below ``directory``."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory)] = (os.stat(path).st_size, os.stat(path).st_mtime_ns, f.read())
  return out


@pytest.fixture
def held_workdir(tmp_path):
  """A workdir with an ``ok`` result and a checkpoint file, locked by another process (the first run)."""
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "last" / "30").mkdir(parents=True)
  (workdir / "checkpoints" / "last" / "30" / "state").write_text("healthy")
  (workdir / "result.json").write_text('{"status": "ok"}\n')
  holder = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir / cell.LOCK_FILE)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    yield workdir, holder.pid
  finally:
    holder.kill()
    holder.wait()


@pytest.mark.timeout(300)  # a subprocess
def test_second_train_on_a_busy_workdir_names_the_holder_and_touches_nothing(held_workdir, listops_dir):
  workdir, pid = held_workdir
  before = snapshot(workdir)
  proc = subprocess.run([sys.executable, "-m", "lra_bench", "train", "--task=listops", "--protocol=smoke",
                         f"--workdir={workdir}", f"--data_dir={listops_dir}",
                         *[f"--set={o}" for o in tiny_overrides()]],
                        cwd=REPO, capture_output=True, text=True, timeout=280)
  assert proc.returncode == 1, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: {workdir} is being trained by pid {pid} on host "), \
      proc.stderr
  assert "--force" not in proc.stderr
  assert snapshot(workdir) == before


def test_train_cell_refuses_a_held_workdir_before_reading_it(tmp_path, monkeypatch):
  """In process: the lock is taken before the previous record, ``--force`` or the checkpoints are looked
  at (a forced second run must not delete the first one's checkpoints)."""
  workdir = tmp_path / "run"
  (workdir / "checkpoints").mkdir(parents=True)
  monkeypatch.setattr(cell, "previous_record", lambda *a: pytest.fail("read the workdir"))
  with cell.exclusive(str(workdir / cell.LOCK_FILE)) as holder:
    assert holder is None
    with pytest.raises(cell.WorkdirBusyError, match=f"pid {os.getpid()} on host"):
      cell.train_cell(None, str(workdir), str(tmp_path), force=True)
  assert (workdir / "checkpoints").is_dir()


def test_the_suite_claims_cells_with_the_same_lock(tmp_path):
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], str(tmp_path))
  with suite.claim(str(tmp_path), cells[0]) as mine:
    assert mine
    with cell.exclusive(suite.lock_path(str(tmp_path), cells[0])) as holder:
      assert holder["pid"] == os.getpid()
    assert suite.lock_holder(str(tmp_path), cells[0])["pid"] == os.getpid()
