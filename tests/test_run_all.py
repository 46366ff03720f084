"""``run_all.sh`` as a person runs it, on a tiny grid (smoke ListOps, two attentions, a few steps; the
benchmark times the two cores at three lengths on two workers), its output not a terminal:

- each stage says what it does, one line per finished unit (data, suite cells, benchmark points, report
  steps), then the report's summary (the very text index.md opens with), the paths and the time per stage;
- a ``kill -TERM`` of the script alone during the benchmark stops every process it started (none is left,
  no lock is held), and the same command then completes the grid with each cell and point recorded once.

``lra-bench suite --launcher local`` on its own: tests/test_launcher.py."""

import collections
import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from lra_bench.experiments import results
from lra_bench.report import summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["num_train_steps=4", "eval_every=2", "checkpoint_every=2", "log_every=2", "model.num_layers=1",
        "optimizer.warmup_steps=1"]
ATTENTIONS = ("vanilla", "local")
LENGTHS = (32, 64, 128)


def _marked(marker: str) -> list[int]:
  """Running (not zombie) processes whose environment holds ``marker``: everything run_all.sh started."""
  pids = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/environ", "rb") as f:
        if marker.encode() not in f.read():
          continue
      with open(f"/proc/{entry}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
          continue
    except OSError:
      continue
    pids.append(int(entry))
  return pids


def _start(root, marker):
  """run_all.sh in the background, its stdout and stderr (one pipe: not a terminal) collected in a list."""
  env = dict(os.environ, LRA_BENCH_NO_SETUP="1", LRA_BENCH=f"{sys.executable} -m lra_bench", RUN_ALL_TEST=marker,
             JAX_DISABLE_MOST_OPTIMIZATIONS="1",
             PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
  cmd = ["bash", os.path.join(REPO, "run_all.sh"), "--protocol", "smoke", "--tasks", "listops", "--attentions",
         ",".join(ATTENTIONS), "--data_dir", str(root / "data"), "--results_dir", str(root / "results"),
         "--lengths", ",".join(map(str, LENGTHS)), "--bench_mode", "core", "--workers", "2",
         *[arg for item in TINY for arg in ("--set", item)]]
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines: list[str] = []
  reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
  reader.start()
  return proc, lines, reader


def _bench_records(results_dir):
  return [r for r in results.load_records(results_dir) if r.get("kind") == "bench"]


def _wait(condition, seconds, poll_s=0.2):
  """Polls ``condition`` until it holds or ``seconds`` pass (a bound on waiting, not a timing check)."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline and not condition():
    time.sleep(poll_s)
  return condition()


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="finds the processes in /proc (Linux)")
@pytest.mark.timeout(1500)
def test_run_all_progress_summary_and_a_kill_during_the_benchmark(tmp_path):
  marker = uuid.uuid4().hex
  results_dir = str(tmp_path / "results")
  proc, lines, reader = _start(tmp_path, marker)
  try:
    # a point recorded, then at once a SIGTERM (the records, not the progress line: the line follows the
    # records by up to bench.POLL_S, and a fast machine measured all six points in that time)
    assert _wait(lambda: proc.poll() is not None or _bench_records(results_dir), 900, poll_s=0.05), \
        "".join(lines)
    assert proc.poll() is None, "run_all.sh ended before its benchmark measured a point:\n" + "".join(lines)
    started = _marked(marker)
    assert len(started) > 3  # the script, the bench process, its two workers (at least)
    os.kill(proc.pid, signal.SIGTERM)  # the script alone, not its process group
    proc.wait(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  reader.join(timeout=60)
  first = "".join(lines)
  assert proc.returncode == 128 + signal.SIGTERM, first
  assert "got SIGTERM; stopping every process it started" in first and "Rerun the same command" in first
  assert _marked(marker) == [], f"left running after the kill: {_marked(marker)}"
  with open(os.path.join(results_dir, ".lock"), "a") as f:  # the records' lock is free
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)

  # Progress of the stages so far, one line per finished unit (not a terminal: no bars).
  assert "\r" not in first
  assert re.search(r"^ListOps: generating: 2400/2400 examples: ", first, re.M), first
  trained = re.findall(r"^suite smoke: (\d)/2 cells trained: listops/(\w+)/seed0 ok in ", first, re.M)
  assert [n for n, _ in trained] == ["1", "2"] and {a for _, a in trained} == set(ATTENTIONS), first
  measured = re.findall(r"^bench core: (\d)/6 points: (\w+) L=(\d+) ok in ", first, re.M)
  assert [int(n) for n, _, _ in measured] == list(range(1, len(measured) + 1)), first
  done_before = {(r["attention"], r["max_length"]) for r in _bench_records(results_dir)}
  assert {(a, int(n)) for _, a, n in measured} <= done_before
  assert 1 <= len(done_before) < len(ATTENTIONS) * len(LENGTHS), done_before  # killed during the benchmark

  # The same command again: it resumes and completes the grid.
  proc, lines, reader = _start(tmp_path, marker)
  try:
    proc.wait(timeout=1200)
  finally:
    if proc.poll() is None:
      proc.kill()
  reader.join(timeout=60)
  second = "".join(lines)
  assert proc.returncode == 0, second
  train = collections.Counter((r["task"], r["attention"], r["seed"]) for r in results.load_records(results_dir)
                              if r.get("kind", "train") == "train")
  assert train == {("listops", a, 0): 1 for a in ATTENTIONS}
  points = collections.Counter((r["attention"], r["max_length"]) for r in _bench_records(results_dir))
  assert points == {(a, n): 1 for a in ATTENTIONS for n in LENGTHS}  # every point once: none lost or doubled
  assert "suite finished in" in second and "already done 2" in second  # nothing retrained
  left = len(ATTENTIONS) * len(LENGTHS) - len(done_before)
  assert re.search(rf"^bench core: {left}/{left} points: \w+ L=\d+ ok in ", second, re.M), second
  assert f"{len(done_before)} already measured" in second
  assert re.search(r"^report: 6/6 steps: summary and index\.md; ", second, re.M), second

  # The headline: the report's summary, then the paths and the time per stage.
  report = os.path.join(results_dir, "report")
  with open(os.path.join(report, summary.FILE)) as f:
    headline = f.read().rstrip("\n")
  with open(os.path.join(report, "index.md")) as f:
    assert headline in f.read()
  assert headline in second and "- Accuracy, protocol smoke, ListOps: vanilla " in headline
  assert "- Efficiency, core, batch 1, cpu: time slope over 32–128" in headline
  tail = second[second.index(headline) + len(headline):]
  assert f"records: {results_dir}/results.jsonl; report: {report}/index.md" in tail
  assert re.search(r"^wall time: setup \d+ s, data \d+ s, suite \d+ s, bench \d+ s, report \d+ s; total \d+ s$",
                   tail, re.M), tail
