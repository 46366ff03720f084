"""The suite on submitit workers: local workers end to end (every cell once, a killed worker, a preempted
and requeued worker), the sbatch script of a GPU cluster's job array (a fake sbatch keeps it), and the
launcher flags' checks. The job array on a real SLURM: tests/test_slurm_real.py."""

import collections
import glob
import os
import pickle
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import types

import pytest

from lra_bench.experiments import launcher, processes, results, suite
from lra_bench.training import loop
from lra_bench.training.config import ConfigError
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _records_per_cell(results_dir):
  return collections.Counter(f"{r['task']}/{r['attention']}/seed{r['seed']}"
                             for r in results.load_records(results_dir))


def _worker_runs(log_dir):
  """cell name -> how many times a worker reports having run it (each worker's log lines)."""
  runs = collections.Counter()
  for path in glob.glob(os.path.join(log_dir, "*_log.out")):
    with open(path) as f:
      for match in re.finditer(r"^worker \d+: \w+: (.*)$", f.read(), re.M):
        runs.update(match.group(1).split(", "))
  return runs


@pytest.fixture
def worker_env(monkeypatch):
  """Worker processes import this checkout and compile fast (the env is what submitit passes on)."""
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


@pytest.mark.timeout(600)
def test_local_workers_run_every_cell_exactly_once(listops_dir, tmp_path, worker_env):
  results_dir = str(tmp_path / "results")
  summary = suite.run_suite("smoke", "listops", "vanilla", "0,1,2", results_dir=results_dir,
                            data_dir=listops_dir, overrides=tiny_overrides(), progress=False,
                            launcher="local", launcher_options={"workers": 2})
  names = [f"listops/vanilla/seed{k}" for k in range(3)]
  assert sorted(summary.ran["ok"]) == names and set(summary.ran) == {"ok"}
  assert len(summary.jobs) == 2 and not summary.unfinished
  assert _records_per_cell(results_dir) == {name: 1 for name in names}
  log_dir = os.path.join(results_dir, "submitit")
  assert _worker_runs(log_dir) == {name: 1 for name in names}
  assert any("local workers" in line and log_dir in line for line in summary.lines())

  # Rerun: nothing left, no worker submitted.
  again = suite.run_suite("smoke", "listops", "vanilla", "0,1,2", results_dir=results_dir,
                          data_dir=listops_dir, overrides=tiny_overrides(), progress=False,
                          launcher="local", launcher_options={"workers": 2})
  assert again.ran == {} and sorted(again.done_before) == names and again.jobs == []


def _wait_for_checkpointed_cell(results_dir, cells, step, deadline, running, skip_pids=()):
  """The first cell with a finished ``last`` checkpoint at ``step`` whose lock is held (by a process not
  in ``skip_pids``), and its holder. Fails at once when ``running()`` turns False (the workers are done:
  no cell will get there, e.g. because one was wrongly counted as finished), else at ``deadline``."""
  while time.time() < deadline:
    for cell in cells:
      if os.path.isdir(os.path.join(cell.workdir, "checkpoints", "last", str(step))):
        holder = suite.lock_holder(results_dir, cell)
        with suite.claim(results_dir, cell) as free:
          if not free and holder and holder["pid"] not in skip_pids:
            return cell, holder
    if not running():
      raise AssertionError(f"the workers finished while waiting for a running cell at a checkpoint at step "
                           f"{step} (a cell counted as finished without being run?)")
    time.sleep(0.05)
  raise AssertionError(f"no cell reached a checkpoint at step {step} in time")


def _resumed(cell):
  with open(os.path.join(cell.workdir, "train.log")) as f:
    return [int(step) for step in re.findall(r"resumed from step (\d+)", f.read())]


@pytest.mark.timeout(900)
def test_killed_workers_then_rerun_loses_and_duplicates_nothing(listops_dir, tmp_path, worker_env):
  """Both local workers are SIGKILLed mid-cell (after a checkpoint); the rerun finishes every cell from
  its checkpoint, and no cell is run to completion or recorded twice."""
  results_dir = str(tmp_path / "results")
  overrides = tiny_overrides(num_train_steps=48, checkpoint_every=8, eval_every=16)
  args = ("smoke", "listops", "vanilla", "0,1,2")
  kwargs = dict(results_dir=results_dir, data_dir=listops_dir, overrides=overrides, progress=False,
                launcher="local", launcher_options={"workers": 2})
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0, 1, 2], results_dir, overrides)
  first, victims = [], {}
  thread = threading.Thread(target=lambda: first.append(suite.run_suite(*args, **kwargs)))
  thread.start()
  try:
    while len(victims) < 2:
      cell, holder = _wait_for_checkpointed_cell(results_dir, cells, 8, time.time() + 400, thread.is_alive,
                                                 skip_pids=victims)
      os.kill(holder["pid"], signal.SIGKILL)
      victims[holder["pid"]] = cell
  finally:
    thread.join(timeout=500)
  assert not thread.is_alive() and first
  summary = first[0]
  names = sorted(c.name for c in cells)
  assert len([line for line in summary.notes if "worker job" in line and "died" in line]) == 2, summary.notes
  last_victim = list(victims.values())[-1]
  assert last_victim.name in summary.unfinished  # no worker was left to finish it
  assert sorted(summary.unfinished + [n for v in summary.ran.values() for n in v]) == names  # none lost
  assert all(count == 1 for count in _records_per_cell(results_dir).values())

  rerun = suite.run_suite(*args, **kwargs)
  assert sorted(rerun.ran["ok"]) == sorted(summary.unfinished) and not rerun.unfinished
  assert _records_per_cell(results_dir) == {name: 1 for name in names}
  assert {r["status"] for r in results.load_records(results_dir)} == {"ok"}
  assert _resumed(last_victim) and min(_resumed(last_victim)) >= 8  # resumed from its checkpoint, not restarted
  assert _worker_runs(os.path.join(results_dir, "submitit")) == {name: 1 for name in names}  # both launches


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc (Linux)")
@pytest.mark.timeout(900)
def test_sigterm_of_the_suite_stops_its_local_workers_and_the_rerun_finishes(listops_dir, tmp_path, worker_env):
  """``lra-bench suite --launcher local`` gets SIGTERM (alone, not its process group) while both workers train:
  it stops every worker and its submitit controller and waits for them, so that when it exits (143) nothing
  it started runs and no cell's lock is held; the same command then finishes every cell, each recorded once."""
  results_dir = str(tmp_path / "results")
  overrides = tiny_overrides(num_train_steps=48, checkpoint_every=8, eval_every=16)
  cmd = [sys.executable, "-m", "lra_bench", "suite", "--protocol=smoke", "--tasks=listops", "--attentions=vanilla",
         "--seeds=0,1", "--launcher=local", "--workers=2", f"--results_dir={results_dir}", f"--data_dir={listops_dir}",
         *[f"--set={o}" for o in overrides]]
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0, 1], results_dir, overrides)

  def training() -> bool:  # both cells held by a live worker (read from the lock files: no claim attempted)
    holders = [suite.lock_holder(results_dir, cell) or {} for cell in cells]
    return all(isinstance(h.get("pid"), int) and processes.running(h["pid"]) for h in holders)

  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + 400
    while not training() and proc.poll() is None and time.time() < deadline:
      time.sleep(0.2)
    assert training(), proc.communicate(timeout=60)[0] if proc.poll() is not None else "no worker started a cell"
    started = processes.descendants(proc.pid)
    assert len(started) >= 4  # two controllers, two workers
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 128 + signal.SIGTERM, out
  assert "got SIGTERM; stopping the 2 local workers" in out and "every worker stopped" in out
  assert [pid for pid in started if processes.running(pid)] == []
  for cell in cells:
    with suite.claim(results_dir, cell) as free:
      assert free, f"{cell.name}'s lock is still held"
  assert all(count <= 1 for count in _records_per_cell(results_dir).values())

  rerun = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert rerun.returncode == 0, rerun.stdout + rerun.stderr
  assert _records_per_cell(results_dir) == {cell.name: 1 for cell in cells}
  assert {r["status"] for r in results.load_records(results_dir)} == {"ok"}


@pytest.mark.timeout(600)
def test_preempted_worker_is_requeued_and_resumes_its_cell(listops_dir, tmp_path, worker_env):
  """submitit's checkpoint protocol for real: USR2 (what SLURM sends before preempting or at the time
  limit) -> ``Worker.checkpoint`` -> the job is requeued -> the cell resumes from its checkpoint."""
  results_dir = str(tmp_path / "results")
  overrides = tiny_overrides(num_train_steps=48, checkpoint_every=8, eval_every=16)
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], results_dir, overrides)
  grid = launcher.Grid(cells, results_dir, listops_dir, overrides, False, ("no_data", "failed"),
                       suite.record_counts(cells, []), suite.work)
  options = launcher.check_options("local", {"workers": 1})
  jobs, log_dir = launcher.submit("local", options, grid)
  assert len(jobs) == 1
  _, holder = _wait_for_checkpointed_cell(results_dir, cells, 8, time.time() + 300,
                                          lambda: not jobs[0].done())
  os.kill(holder["pid"], signal.SIGUSR2)  # what SLURM sends the job before preempting it or at its limit
  outputs, dead = launcher.wait(jobs)
  assert dead == [] and outputs[0]["ran"] == {cells[0].name: "ok"}
  assert _records_per_cell(results_dir) == {cells[0].name: 1}
  assert _resumed(cells[0]) and min(_resumed(cells[0])) >= 8
  with open(jobs[0].paths.stdout) as f:
    log = f.read()
  assert "preempted or out of time; requeued" in log and "Requeued job" in log
  # the signal only asked the loop to stop; the requeue came once it had (not from the grace alarm)
  assert "stops at its next step" in log and "no training loop stopped" not in log


def test_preemption_signal_landing_in_a_finaliser_is_not_lost(monkeypatch):
  """submitit's handler raises SystemExit from wherever the signal lands; inside a ``__del__`` Python
  swallows it (seen: TensorFlow's ``Executor.__del__``, the worker trained on, never requeued). Under
  ``_Preemption`` the signal only records the request and stops the loop; the requeue comes later."""
  monkeypatch.setattr(loop, "_PROCESS_STOP", threading.Event())
  calls = []

  def submitit_handler(signum, frame):  # as submitit's local requeue: checkpoint, then sys.exit(144)
    calls.append(signum)
    raise SystemExit(144)

  class Finalised:
    def __del__(self):
      os.kill(os.getpid(), signal.SIGUSR2)  # the handler runs inside os.kill, in this finaliser

  previous = signal.signal(signal.SIGUSR2, submitit_handler)
  try:
    preemption = launcher._Preemption()
    with preemption.installed():
      Finalised()
      assert preemption.pending == signal.SIGUSR2 and calls == []
      assert loop.Run.stop_requested.fget(types.SimpleNamespace(stop=loop.StopFlag()))  # every loop stops
      with pytest.raises(SystemExit) as exit_info:
        preemption.requeue()
      assert exit_info.value.code == 144 and calls == [signal.SIGUSR2]
    assert signal.getsignal(signal.SIGUSR2) is submitit_handler  # given back
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGUSR2, previous)


def _fake_slurm(tmp_path):
  """srun/sbatch stand-ins on PATH: sbatch keeps the script it is given and answers like SLURM."""
  bin_dir = tmp_path / "slurm_bin"
  bin_dir.mkdir()
  (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
  (bin_dir / "sbatch").write_text(f"#!/bin/sh\ncp \"$1\" {tmp_path}/sbatch_script.sh\n"
                                  "echo 'Submitted batch job 4242'\n")
  for name in ("srun", "sbatch"):
    (bin_dir / name).chmod(0o755 | stat.S_IEXEC)
  return bin_dir


def test_slurm_array_script_asks_for_what_a_gpu_cluster_has(listops_dir, tmp_path, monkeypatch):
  """The sbatch script of a GPU cluster's launch (partition, GPUs, 8 CPUs: what the one-node test
  cluster of tests/test_slurm_real.py does not have; the array running there is tested there)."""
  results_dir = str(tmp_path / "results")
  monkeypatch.setenv("PATH", f"{_fake_slurm(tmp_path)}{os.pathsep}{os.environ['PATH']}")
  options = {"partition": "gpu", "gpus_per_task": 1, "time_limit_min": 90, "cpus_per_task": 8,
             "array_size": 2, "workers": 1}
  summary = suite.run_suite("smoke", "listops", "vanilla", "0,1,2", results_dir=results_dir,
                            data_dir=listops_dir, overrides=tiny_overrides(), progress=False,
                            launcher="slurm", launcher_options=options)
  assert summary.jobs == ["4242_0", "4242_1"] and len(summary.queued) == 3 and summary.ran == {}
  lines = "\n".join(summary.lines())
  assert "job array 4242" in lines and "squeue -j 4242" in lines and "3 cells to run" in lines

  script = (tmp_path / "sbatch_script.sh").read_text()
  for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1", "#SBATCH --time=90",
               "#SBATCH --cpus-per-task=8", "#SBATCH --array=0-1%1", "#SBATCH --signal=USR2@120",
               "#SBATCH --ntasks-per-node=1", "#SBATCH --job-name=lra-bench-suite"):
    assert line in script.splitlines(), (line, script)
  assert f"export PYTHONPATH={REPO}" in script and "-m submitit.core._submit" in script
  for task in range(2):
    with open(os.path.join(results_dir, "submitit", f"4242_{task}_submitted.pkl"), "rb") as f:
      delayed = pickle.load(f)
    assert isinstance(delayed.function, launcher.Worker) and len(delayed.function.grid.cells) == 3


def test_slurm_without_slurm_is_a_clear_error(listops_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))  # no srun here
  with pytest.raises(ConfigError, match="--launcher slurm needs SLURM"):
    suite.run_suite("smoke", "listops", "vanilla", "0", results_dir=str(tmp_path / "r"), data_dir=listops_dir,
                    overrides=tiny_overrides(), progress=False, launcher="slurm")


@pytest.mark.parametrize("launcher_name, options, message", [
    ("cluster", {}, "--launcher 'cluster' is not known"),
    ("local", {"partition": "gpu"}, "--partition applies to --launcher slurm only"),
    ("inprocess", {"workers": 2}, "--workers applies to --launcher local or slurm only"),
    ("slurm", {"gpus_per_task": -1}, "--gpus_per_task must be an integer >= 0, got -1"),
    ("slurm", {"array_size": 0}, "--array_size must be an integer >= 1, got 0"),
    ("local", {"workers": "2"}, "--workers must be an integer >= 1, got '2'"),
    ("slurm", {"partition": " "}, "--partition must be a non-empty string"),
    ("slurm", {"nodes": 2}, "unknown launcher option"),
])
def test_bad_launcher_options(launcher_name, options, message, tmp_path):
  with pytest.raises(ConfigError, match=re.escape(message)):
    suite.run_suite("smoke", "listops", "vanilla", "0", results_dir=str(tmp_path), data_dir=str(tmp_path),
                    launcher=launcher_name, launcher_options=options)


def test_worker_count_and_defaults():
  local = launcher.check_options("local", {"workers": 3})
  assert launcher.worker_count("local", local, pending=2) == 2
  assert launcher.worker_count("local", local, pending=10) == 3
  slurm = launcher.check_options("slurm", None)
  assert set(slurm) == set(launcher.OPTION_KEYS) and all(v is None for v in slurm.values())
  assert launcher.worker_count("slurm", slurm, pending=150) == 150
  assert launcher.worker_count("slurm", launcher.check_options("slurm", {"array_size": 16}), pending=150) == 16
