"""Issue 30, the suite side: an ``--isolate`` cell dies with its suite (SIGKILL) and gets its SIGTERM;
the exit status says when cells failed; a ``--set`` cannot merge cells; a per-task ``--set`` error names
the task; the summary counts every cell by status."""

import os
import signal
import subprocess
import sys
import time

import pytest

from attention_zoo import registry
from lra_bench import cli as cli_lib
from lra_bench.experiments import results, suite
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides
from tests.test_suite import Failing, FakeConfig  # a core that fails as soon as it is traced

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc (Linux)")


def _children(pid: int) -> list[int]:
  """The child processes of ``pid`` (Linux /proc)."""
  out = []
  for task in os.listdir(f"/proc/{pid}/task"):
    with open(f"/proc/{pid}/task/{task}/children") as f:
      out += [int(p) for p in f.read().split()]
  return out


def _alive(pid: int) -> bool:
  """Whether any thread of ``pid`` runs (a zombie nobody reaped yet has exited). Every thread counts: a
  killed JAX process's main thread shows ``Z`` while its other threads still tear down and still hold the
  process's open files (its claim's flock among them)."""
  try:
    for task in os.listdir(f"/proc/{pid}/task"):
      with open(f"/proc/{pid}/task/{task}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
          return True
  except FileNotFoundError:
    return False
  return False


def _open_files(pid: int) -> list[str]:
  """The paths of ``pid``'s open descriptors. A starting process opens and closes files (imports, TF's
  and JAX's start-up) while this reads them: a descriptor gone between the listing and its readlink was
  not the claim, which the process holds from its first instruction to its exit."""
  paths = []
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
      paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    except FileNotFoundError:
      continue
  return paths


def _wait(condition, seconds: float) -> bool:
  """Polls ``condition`` until it holds or ``seconds`` pass (a bound on waiting, not a timing check)."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if condition():
      return True
    time.sleep(0.2)
  return condition()


def _start_isolated_suite(listops_dir, results_dir):
  """``suite --isolate`` of one long cell; returns (the suite process, its trainer child's pid)."""
  overrides = tiny_overrides(num_train_steps=10**6, eval_every=10**6, checkpoint_every=10**6)
  cmd = [sys.executable, "-m", "lra_bench", "suite", "--isolate", "--protocol=smoke", "--tasks=listops",
         "--attentions=vanilla", "--seeds=0", f"--results_dir={results_dir}", f"--data_dir={listops_dir}",
         *[f"--set={o}" for o in overrides]]
  env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="1")
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert _wait(lambda: proc.poll() is not None or _children(proc.pid), 300), "the suite started no cell"
  assert proc.poll() is None, proc.communicate()
  (child,) = _children(proc.pid)
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], results_dir, overrides)
  return proc, child, cells[0]


def _free(results_dir, cell) -> bool:
  with suite.claim(results_dir, cell) as mine:
    return bool(mine)


@linux_only
@pytest.mark.timeout(600)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_isolated_cell_dies_with_its_suite(listops_dir, tmp_path, signum):
  results_dir = str(tmp_path / "results")
  proc, child, cell = _start_isolated_suite(listops_dir, results_dir)
  try:
    assert not _free(results_dir, cell)  # the running cell is claimed, by its trainer too:
    assert suite.lock_path(results_dir, cell) in _open_files(child)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=300)
    assert _wait(lambda: not _alive(child), 120), "the cell's trainer outlived its suite"
    # the trainer is gone, so is the claim: a rerun races nothing (the kernel drops the flock when the
    # last thread closes the files, a moment after the process shows as exited; the wait only bounds it)
    assert _wait(lambda: _free(results_dir, cell), 60)
    if signum == signal.SIGTERM:  # forwarded: the suite waits for its cell, then exits 128 + 15
      assert proc.returncode == 143, err
      assert ("suite: terminated (SIGTERM) during cell listops/vanilla/seed0; rerun the same command to "
              "resume it") in err
    # neither signal leaves a spurious `failed` record
    assert results.load_records(results_dir) == []
  finally:
    for pid in (proc.pid, child):
      if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    proc.wait()


CLAIM_AND_DIE = """
import subprocess, sys
from lra_bench.experiments import suite
cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], sys.argv[1])
with suite.claim(sys.argv[1], cells[0]) as mine:
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=(mine.fd,),
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  print(child.pid, flush=True)
  import os; os._exit(0)  # dies holding the claim, as a killed suite does
"""


@linux_only
@pytest.mark.timeout(300)
def test_a_child_given_the_claim_holds_it_after_the_suite_died(tmp_path):
  """A claim is a flock of an open file: a child given its descriptor holds it until it exits, so no rerun
  can claim the cell while an isolated cell's process is still ending."""
  results_dir = str(tmp_path)
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], results_dir)
  parent = subprocess.run([sys.executable, "-c", CLAIM_AND_DIE, results_dir], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  child = int(parent.stdout.split()[0])
  try:
    assert _alive(child) and not _free(results_dir, cells[0])
  finally:
    os.kill(child, signal.SIGKILL)
  assert _wait(lambda: not _alive(child), 60) and _wait(lambda: _free(results_dir, cells[0]), 60)


def _suite_cli(*flags: str) -> int:
  return cli_lib.main(cli_lib.parse(["lra-bench", "suite", "--protocol=smoke", "--tasks=listops", *flags]))


@pytest.mark.timeout(600)
def test_exit_status_is_1_when_a_cell_failed(listops_dir, tmp_path, capsys, fast_compile):
  tiny = [f"--set={o}" for o in tiny_overrides(num_train_steps=2, eval_every=2, checkpoint_every=2)]
  results_dir = f"--results_dir={tmp_path / 'results'}"
  with registry.temporary({"test_fails": (Failing, FakeConfig)}):
    assert _suite_cli("--attentions=test_fails", results_dir, f"--data_dir={listops_dir}", *tiny) == 1
    out = capsys.readouterr().out
    assert "1 cell: 1 failed (ran now 1, already done 0)" in out and "failed: listops/test_fails/seed0" in out
    # still 1 when the failed cell is left alone: the grid has a failed cell
    assert _suite_cli("--attentions=test_fails", "--noretry_failed", results_dir, *tiny) == 1
    assert "1 cell: 1 failed (ran now 0, already done 1)" in capsys.readouterr().out
  # no data is an outcome with its fix (run_all.sh's smoke grid without downloads), not a failure
  assert _suite_cli("--attentions=vanilla", f"--results_dir={tmp_path / 'other'}",
                    f"--data_dir={tmp_path / 'no_data'}", *tiny) == 0
  assert "1 cell: 1 no_data (ran now 1, already done 0)" in capsys.readouterr().out


def test_summary_counts_every_cell_by_status(tmp_path):
  """The issue's "suite finished in 0 s: ; 16 already done": a rerun of a finished grid."""
  results_dir = str(tmp_path)
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla", "performer"], [0, 1], results_dir)
  for cell, status in zip(cells, ["ok", "ok", "ok", "oom"]):
    config = cell.config
    results.append_record(results_dir, {
        "kind": "train", "task": cell.task, "attention": cell.attention, "protocol": "smoke",
        "seed": cell.seed, "status": status, "config": config.to_dict(),
        "config_hash": config_lib.config_hash(config), "max_length": config.data.max_length})
  summary = suite.run_suite("smoke", "listops", "vanilla,performer", "0,1", results_dir=results_dir,
                            data_dir=str(tmp_path / "data"), progress=False)
  lines = summary.lines()
  assert lines[0] == "suite finished in 0 s: 4 cells: 3 ok, 1 oom (ran now 0, already done 4)"
  assert lines[1:] == ["oom: listops/performer/seed1"] and summary.exit_code() == 0
  # a cell running elsewhere when passed and recorded by the end is one cell, not two
  both = suite.Summary(final={"ok": ["a", "b"]}, claimed_elsewhere=["b", "c"])
  # ... and one still without a record at the end is counted as still running (the counts add up to the
  # total: "184 cells: 45 ok, 138 no_data" left one cell out)
  assert both.lines()[0] == ("suite finished in 0 s: 3 cells: 2 ok, 1 still running in another worker (ran "
                             "now 0, already done 0, running elsewhere 2)")


@pytest.mark.parametrize("override, flag", [("model.attention=performer", "--attentions"),
                                            ("seed=5", "--seeds")])
def test_a_set_that_merges_cells_is_refused(tmp_path, override, flag):
  """``--attentions vanilla,performer --set model.attention=performer`` made two cells one run."""
  with pytest.raises(config_lib.ConfigError, match=f"--set {override.split('=')[0]}=.*use {flag} instead"):
    suite.run_suite("smoke", "listops", "vanilla,performer", "0,1", results_dir=str(tmp_path),
                    data_dir=str(tmp_path / "no_data"), overrides=[override], progress=False)
  assert results.load_records(str(tmp_path)) == []


def test_names_given_twice_are_one_cell(tmp_path):
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla", "vanilla"], [0, 0], str(tmp_path))
  assert [c.name for c in cells] == ["listops/vanilla/seed0"]


def test_a_per_task_set_error_names_the_task(tmp_path):
  # data.options.limit exists for text, not for listops
  with pytest.raises(config_lib.ConfigError, match=r"^task listops \(each --set applies to every task\): "
                                                   r"unknown config key data\.options\.limit"):
    suite.plan("smoke", ["text", "listops"], ["vanilla"], [0], str(tmp_path), ["data.options.limit=5"])
