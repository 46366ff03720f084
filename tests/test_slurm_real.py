"""The cluster path against a real SLURM: the one-node cluster of ``scripts/slurm_local.sh start``.

1. a grid through ``lra-bench suite --launcher slurm`` (a job array capped by ``--workers``) ends with
   every cell's record, each naming its SLURM job; a rerun submits nothing;
2. a worker signalled as at its time limit (USR2) is requeued and its cell resumes from its checkpoint to
   the numbers of an uninterrupted run;
3. ``srun -n 2 lra-bench train`` trains as 2 processes into one record;
4. a worker killed without warning releases its lock; the rerun names the dead job's state and log, and
   finishes the cell from its checkpoint;
5. a cell whose worker recorded a failure: the rerun names the failure, the job's state and its log.
These (marker ``slurm``) are skipped (one line: why) when ``sinfo`` reaches no controller;
``LRA_REQUIRE_SLURM=1`` (CI) makes that a failure. The tests do not start the cluster; when ``SLURM_CONF`` is
unset they use the cluster of ``scripts/slurm_local.sh`` (its state directory: ``$LRA_SLURM_DIR`` or the
script's default) if it runs. The script's usage errors and its ``stop`` (only its own daemons) are tested
without a cluster.
"""

import fcntl
import functools
import getpass
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from lra_bench.experiments import results, suite
from tests.conftest import tiny_overrides
from tests.test_launcher import (REPO, _records_per_cell, _resumed, _wait_for_checkpointed_cell,  # noqa: F401
                                 worker_env)

STATE_DIR = os.environ.get("LRA_SLURM_DIR") or os.path.join(tempfile.gettempdir(),
                                                            f"lra-bench-slurm-{getpass.getuser()}")
QUERY_TIMEOUT_S = 15
# One cell long enough that a signal sent after its step-8 checkpoint lands mid-training: 88 more steps
# and 11 checkpoints (0.2-1 s each here) against ~0.1 s from scancel to the worker; evaluations rare.
LONG_CELL = tiny_overrides(num_train_steps=96, eval_every=48, log_every=48)
COMPARED = ("test_accuracy", "test_accuracy_last", "best_val_accuracy", "best_step", "train_steps")


@functools.lru_cache
def _cluster_problem(slurm_conf):
  """Why the tests cannot use the SLURM of ``slurm_conf`` (one line), or None when a node answers. Once
  per session: a controller that is down costs ``sinfo`` its message timeout."""
  try:
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
  except FileNotFoundError:
    return "no SLURM here: sinfo is not installed (scripts/slurm_local.sh start installs and starts one)"
  except subprocess.TimeoutExpired:
    return f"sinfo did not answer in {QUERY_TIMEOUT_S} s"
  if proc.returncode != 0:
    why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"sinfo reaches no SLURM controller ({why}); scripts/slurm_local.sh start starts one"
  states = proc.stdout.split()
  if not any(s.rstrip("*~#") in ("idle", "mixed", "allocated") for s in states):
    return f"no SLURM node is up (sinfo: {' '.join(states) or 'no nodes'})"
  return None


def _daemon_alive(pid_file):
  try:
    with open(pid_file) as f:
      return os.path.exists(f"/proc/{int(f.read().strip())}")
  except (OSError, ValueError):
    return False


@pytest.fixture
def slurm(monkeypatch, tmp_path, worker_env):  # noqa: F811 - the fixture imported above
  """A reachable SLURM (else skip, or fail under ``LRA_REQUIRE_SLURM=1``); jobs inherit this env. On
  teardown, the test's jobs still queued (their batch scripts are under its ``tmp_path``) are cancelled."""
  conf = os.path.join(STATE_DIR, "slurm.conf")
  problem = None
  if "SLURM_CONF" not in os.environ and os.path.exists(conf):
    if _daemon_alive(os.path.join(STATE_DIR, "slurmctld.pid")):
      monkeypatch.setenv("SLURM_CONF", conf)
    else:  # the script's cluster, stopped: no need to wait for sinfo's timeout to say so
      problem = f"the SLURM of {STATE_DIR} is not running (scripts/slurm_local.sh start)"
  problem = problem or _cluster_problem(os.environ.get("SLURM_CONF"))
  if problem:
    if os.environ.get("LRA_REQUIRE_SLURM") == "1":
      pytest.fail(f"LRA_REQUIRE_SLURM=1 but {problem}")
    pytest.skip(problem)
  yield
  queued = subprocess.run(["squeue", "-h", "-o", "%A %o"], capture_output=True, text=True,
                          timeout=QUERY_TIMEOUT_S).stdout.split("\n")
  mine = sorted({line.split()[0] for line in queued if f" {tmp_path}{os.sep}" in line})
  if mine:
    subprocess.run(["scancel", *mine], timeout=QUERY_TIMEOUT_S)


def _squeue(job):
  """``[(job id, state, reason)]`` of the job's queued or running parts (empty once it has ended)."""
  proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i %T %r"], capture_output=True, text=True,
                        timeout=QUERY_TIMEOUT_S)
  return [tuple(line.split(" ", 2)) for line in proc.stdout.splitlines() if line.strip()]


def _wait_until_gone(job, timeout_s, each=None):
  """Polls the queue until ``job`` has left it; ``each(rows)`` sees every poll."""
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    rows = _squeue(job)
    if not rows:
      return
    if each is not None:
      each(rows)
    time.sleep(0.5)
  raise AssertionError(f"SLURM job {job} still queued after {timeout_s} s: {rows}")


def _array(summary):
  assert summary.jobs, summary.lines()
  return summary.jobs[0].split("_")[0]


def _suite(results_dir, data_dir, overrides, seeds="0", **options):
  return suite.run_suite("smoke", "listops", "vanilla", seeds, results_dir=results_dir, data_dir=data_dir,
                         overrides=overrides, progress=False, launcher="slurm",
                         launcher_options={"time_limit_min": 10, **options})


def _only_record(results_dir):
  """The one record of ``results_dir``; without it, the failure shows the workers' logs (the submitit
  folder) and what slurmctld said about their jobs, which is where the cause is."""
  records = results.load_records(results_dir)
  assert len(records) == 1, f"{len(records)} records in {results_dir}\n{_worker_logs(results_dir)}"
  return records[0]


def _worker_logs(results_dir):
  log_dir = os.path.join(results_dir, "submitit")
  names, lines = sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else [], []
  for name in names:
    if name.endswith(("_log.out", "_log.err")):
      with open(os.path.join(log_dir, name), errors="replace") as f:
        lines += [f"== {name}", *f.read().splitlines()[-30:]]
  jobs = sorted({name.split("_")[0] for name in names})
  ctld = os.path.join(STATE_DIR, "log", "slurmctld.log")
  if jobs and os.path.exists(ctld):
    about = re.compile(rf"\b(JobId=|job )({'|'.join(jobs)})\b")
    with open(ctld, errors="replace") as f:
      lines += ["== slurmctld.log", *[line.rstrip() for line in f if about.search(line)]]
  return "\n".join(lines)


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_grid_as_a_job_array_every_cell_once_then_a_rerun_submits_nothing(listops_dir, tmp_path, slurm):
  results_dir = str(tmp_path / "results")
  flags = [f"--set={o}" for o in tiny_overrides()]
  command = [sys.executable, "-m", "lra_bench", "suite", "--protocol=smoke", "--tasks=listops",
             "--attentions=vanilla", "--seeds=0,1,2", f"--results_dir={results_dir}",
             f"--data_dir={listops_dir}", "--launcher=slurm", "--workers=2", "--time_limit=10", *flags]
  proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  array = re.search(r"as SLURM job array (\d+) \(at most 2 at once", proc.stdout).group(1)
  running = []
  _wait_until_gone(array, 500, each=lambda rows: running.append(sum(r[1] == "RUNNING" for r in rows)))
  names = [f"listops/vanilla/seed{k}" for k in range(3)]
  assert _records_per_cell(results_dir) == {name: 1 for name in names}
  records = results.load_records(results_dir)
  assert {r["status"] for r in records} == {"ok"}
  assert {r["slurm_job"] for r in records} <= {f"{array}_{task}" for task in range(3)}, records
  assert max(running) <= 2  # the --workers cap, as SLURM applied it
  log_dir = os.path.join(results_dir, "submitit")
  with open(os.path.join(log_dir, f"{array}_submission.sh")) as f:
    assert "#SBATCH --array=0-2%2" in f.read().splitlines()

  again = _suite(results_dir, listops_dir, tiny_overrides(), seeds="0,1,2", workers=2)
  assert again.jobs == [] and sorted(again.done_before) == names and not again.queued
  assert [n for n in os.listdir(log_dir) if n.endswith("_submission.sh")] == [f"{array}_submission.sh"]


def _wait_then_set_begin_now(job, timeout_s):
  """A requeued job waits for its begin time (SLURM adds a delay); move it to now, once it is pending.

  Not at once: SLURM's delay is there because slurmd revokes the killed job's credential with a
  one-second clock and refuses a credential of the same job issued in that second or before ("Killing
  non-startable batch JobId=N: Job credential revoked" in slurmctld's log, the job then ends without
  running). Two seconds after the requeue is past it."""
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    rows = _squeue(job)
    if rows and rows[0][1] == "PENDING":
      time.sleep(2)
      subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=QUERY_TIMEOUT_S)
      return
    time.sleep(0.2)
  raise AssertionError(f"SLURM job {job} was not requeued within {timeout_s} s: {_squeue(job)}")


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_worker_at_its_time_limit_is_requeued_and_resumes_to_the_same_numbers(listops_dir, tmp_path, slurm):
  """USR2 is what SLURM sends ``--signal`` seconds before the time limit: the worker requeues itself
  (submitit), the requeued job resumes the cell from its checkpoint. A second suite runs the same cell
  uninterrupted at the same time, for the numbers."""
  reference_dir, results_dir = str(tmp_path / "reference"), str(tmp_path / "results")
  reference = _suite(reference_dir, listops_dir, LONG_CELL)
  victim = _suite(results_dir, listops_dir, LONG_CELL)
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], results_dir, LONG_CELL)
  job = _array(victim)
  cell, holder = _wait_for_checkpointed_cell(results_dir, cells, 8, time.time() + 300,
                                             lambda: bool(_squeue(job)))
  assert holder["job"] == job
  subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=QUERY_TIMEOUT_S)
  _wait_then_set_begin_now(job, 120)
  _wait_until_gone(job, 400)
  _wait_until_gone(_array(reference), 200)

  record, uninterrupted = _only_record(results_dir), _only_record(reference_dir)
  assert record["status"] == "ok" and record["slurm_job"] == job, record["error"]
  assert _resumed(cell) and min(_resumed(cell)) >= 8  # from its checkpoint, not from scratch
  for key in COMPARED:
    assert record[key] == uninterrupted[key], key
  with open(os.path.join(results_dir, "submitit", f"{job}_0_log.out")) as f:
    log = f.read()
  assert "preempted or out of time; requeued" in log and f"worker 0: ok: {cell.name}" in log


@pytest.mark.slurm
@pytest.mark.timeout(400)
def test_srun_two_tasks_train_as_two_processes_into_one_record(listops_dir, tmp_path, slurm):
  workdir, results_dir = str(tmp_path / "run"), str(tmp_path / "results")
  command = ["srun", "-n", "2", "--time=10", sys.executable, "-m", "lra_bench", "train", "--task=listops",
             "--attention=vanilla", "--protocol=smoke", f"--workdir={workdir}", f"--data_dir={listops_dir}",
             f"--results_dir={results_dir}",
             *[f"--set={o}" for o in tiny_overrides(num_train_steps=8, eval_every=8, log_every=8)]]
  proc = subprocess.run(command, capture_output=True, text=True, timeout=360, cwd=REPO)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  record = _only_record(results_dir)
  assert record["status"] == "ok" and record["num_processes"] == 2 and record["num_devices"] == 2
  assert record["slurm_job"] and record["slurm_job"].isdigit()
  with open(os.path.join(workdir, "result.json")) as f:
    assert json.load(f)["num_processes"] == 2


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_killed_worker_releases_its_lock_and_the_rerun_finishes_the_cell(listops_dir, tmp_path, slurm):
  results_dir = str(tmp_path / "results")
  first = _suite(results_dir, listops_dir, LONG_CELL)
  job = _array(first)
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], results_dir, LONG_CELL)
  cell, holder = _wait_for_checkpointed_cell(results_dir, cells, 8, time.time() + 300,
                                             lambda: bool(_squeue(job)))
  assert holder["job"] == job
  # SIGKILL to the worker's step (SLURM 22.05 turns a job-level `scancel --signal=KILL` into a cancel:
  # SIGTERM first, which submitit ignores, the SIGKILL seconds later; the cell may finish in between).
  subprocess.run(["scancel", "--signal=KILL", f"{job}.0"], check=True, timeout=QUERY_TIMEOUT_S)
  _wait_until_gone(job, 120)
  with open(suite.lock_path(results_dir, cell)) as lock:  # free (and still naming the dead job)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  assert suite.lock_holder(results_dir, cell)["job"] == job
  assert results.load_records(results_dir) == []

  rerun = _suite(results_dir, listops_dir, LONG_CELL)
  log = os.path.join(results_dir, "submitit", f"{job}_0_log.out")
  note = [line for line in rerun.lines() if line.startswith(f"{cell.name}: not finished by SLURM job {job} (")]
  assert len(note) == 1 and note[0].endswith(f"its log: {log}") and os.path.exists(log), rerun.lines()
  assert re.search(r"\((squeue|scontrol|sacct): [A-Z_]+", note[0]), note[0]
  _wait_until_gone(_array(rerun), 400)
  record = _only_record(results_dir)
  assert record["status"] == "ok" and record["slurm_job"] == _array(rerun)
  assert _resumed(cell) and min(_resumed(cell)) >= 8


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_rerun_names_the_failed_cells_job_and_worker_log(tmp_path, slurm):
  """A cell whose worker recorded a failure (here: no data) is retried by the rerun, whose summary names
  the failure, the worker's job and state, and its log."""
  results_dir, no_data = str(tmp_path / "results"), str(tmp_path / "empty")
  os.makedirs(no_data)
  first = _suite(results_dir, no_data, tiny_overrides())
  job = _array(first)
  _wait_until_gone(job, 200)
  assert _only_record(results_dir)["status"] == "no_data"

  rerun = _suite(results_dir, no_data, tiny_overrides())
  subprocess.run(["scancel", _array(rerun)], check=True, timeout=QUERY_TIMEOUT_S)  # not needed to run
  log = os.path.join(results_dir, "submitit", f"{job}_0_log.out")
  name = "listops/vanilla/seed0"
  note = [line for line in rerun.lines() if line.startswith(f"{name}: not finished by SLURM job {job} (")]
  assert len(note) == 1 and os.path.exists(log), rerun.lines()
  assert re.search(r"\((squeue|scontrol|sacct): COMPLETED", note[0]), note[0]  # the worker ended well
  assert "; recorded no_data: " in note[0] and note[0].endswith(f"its log: {log}"), note[0]


def test_slurm_local_sh_usage_and_stop_kills_only_its_own_daemons(tmp_path):
  """No cluster needed: a usage error is one line (exit 2); ``stop`` kills a process only when its pid
  file names a live daemon of that name, never another process that got the pid."""
  script = os.path.join(REPO, "scripts", "slurm_local.sh")
  env = dict(os.environ, LRA_SLURM_DIR=str(tmp_path))
  usage = subprocess.run(["bash", script, "restart"], capture_output=True, text=True, env=env, timeout=30)
  assert usage.returncode == 2 and usage.stdout == ""
  assert usage.stderr.splitlines() == ["error: slurm_local.sh: usage: scripts/slurm_local.sh "
                                       "start|stop|status|env (got: restart)"]
  shown = subprocess.run(["bash", script, "env"], capture_output=True, text=True, env=env, timeout=30)
  assert shown.stdout == f"export SLURM_CONF={tmp_path}/slurm.conf\n"

  other = subprocess.Popen(["sleep", "60"])  # not a daemon of the script, but its pid files name it
  try:
    for name in ("slurmd.pid", "slurmctld.pid"):
      (tmp_path / name).write_text(f"{other.pid}\n")
    stop = subprocess.run(["bash", script, "stop"], capture_output=True, text=True, env=env, timeout=90)
    assert stop.returncode == 0 and "nothing of" in stop.stdout, stop.stdout + stop.stderr
    assert other.poll() is None  # still running
  finally:
    other.kill()
    other.wait()
