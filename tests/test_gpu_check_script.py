"""scripts/gpu_check.sh: the order of its phases and the order in which it times attentions.

One lease, one script: the kit (one layer per family, matmul precision highest), then the LRA Table 2 bench
in bfloat16 with the check that flash ran fused, then one ListOps cell of vanilla if time remains; a second
run continues where the first stopped (``test_the_smoke_runs_the_phases_in_order_and_resumes``, on the CPU).

A device lease is 15 minutes, so the order decides what gets measured. With the default ("all") the
baselines and LRA Table 1's models go first; a list given in GPU_CHECK_ATTENTIONS must be timed in the
order given (a lease once spent its time re-timing Table 1's models that a list had put last). With a
timing budget of 0 nothing is timed and the script's last line names every attention not measured, in
the order it would have timed them; the kit, the training and the report are skipped, so this costs one
JAX start and, for "all", one `lra-bench list`.
"""

import json

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _not_measured(tmp_path, attentions):
  env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_SMOKE="1", GPU_CHECK_SKIP_TESTS="1",
             GPU_CHECK_SKIP_REPORT="1", GPU_CHECK_SKIP_TRAIN="1", GPU_CHECK_BENCH_BUDGET_S="0",
             GPU_CHECK_OUT=str(tmp_path / "out"),
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu",
             GPU_CHECK_ATTENTIONS=attentions)
  proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  match = re.search(r"not measured within the budget \(rerun the same command to continue\): (.*)$",
                    proc.stdout, re.M)
  assert match, proc.stdout + proc.stderr
  return match.group(1).split()


def test_a_given_list_is_timed_in_its_own_order(tmp_path):
  assert _not_measured(tmp_path, "nystromformer,cosformer,vanilla,local") == [
      "nystromformer", "cosformer", "vanilla", "local"]


def test_all_puts_the_baselines_and_lra_table_1_first(tmp_path):
  names = _not_measured(tmp_path, "all")
  assert names[:12] == ["vanilla", "flash", "local", "sparse_fixed", "longformer", "linformer", "reformer",
                        "sinkhorn", "synthesizer", "bigbird", "linear_transformer", "performer"]
  assert len(names) == len(set(names)) and {"nystromformer", "cosformer"} <= set(names[12:])


def _smoke(tmp_path):
  env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_SMOKE="1", GPU_CHECK_SKIP_REPORT="1",
             GPU_CHECK_TRAIN_MIN_S="0", GPU_CHECK_OUT=str(tmp_path / "out"), GPU_CHECK_DATA_DIR=str(tmp_path / "data"),
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
  proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True,
                        text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc.stdout


def _line(log, pattern):
  match = re.search(pattern, log, re.M)
  assert match, f"{pattern!r} not in:\n{log}"
  return match.start()


def test_the_smoke_runs_the_phases_in_order_and_resumes(tmp_path):
  log = _smoke(tmp_path)
  kit = _line(log, r"phase 1: conformance kit, one layer per family, matmul precision highest")
  bench = _line(log, r"phase 2: LRA Table 2 bench, precision bfloat16")
  fused = _line(log, r"!!!!!!!! flash: NOT FUSED: ")  # the CPU has no fused kernel: said loudly
  core = _line(log, r"phase 2b: exact attention alone, modes core and core_forward")
  train = _line(log, r"phase 3: one smoke ListOps cell of vanilla to completion")
  assert kit < _line(log, r"vanilla \(exact\): 15/15 passed") < bench < fused < core < train
  assert _line(log, r"training: done") > train
  results = tmp_path / "out" / "results"
  (kit_line,) = [json.loads(line) for line in (results / "kit.jsonl").read_text().splitlines()]
  assert kit_line["layer"] == "vanilla" and kit_line["matmul_precision"] == "highest"
  records = [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines()]
  bench_records = [r for r in records if r.get("kind") == "bench"]
  # the Table 2 bench (train) and exact attention alone (core, core_forward), every point in bfloat16
  assert sorted((r["mode"], r["attention"]) for r in bench_records) == [
      ("core", "flash"), ("core", "vanilla"), ("core_forward", "flash"), ("core_forward", "vanilla"),
      ("train", "flash"), ("train", "vanilla")]
  assert {r["config"]["precision"] for r in bench_records} == {"bfloat16"}
  trained = [(r["protocol"], r["task"], r["attention"], r["status"]) for r in records
             if r.get("kind", "train") == "train"]
  assert trained == [("smoke", "listops", "vanilla", "ok")]
  # the next lease continues where this one stopped: nothing finished is run again
  again = _smoke(tmp_path)
  assert _line(again, r"done by an earlier run: vanilla") < _line(again, r"phase 2")
  assert again.count("nothing to run; 1 already measured") == 2     # the Table 2 bench: one attention a call
  assert again.count("nothing to run; 2 already measured") == 2     # phase 2b: vanilla and flash, two modes
  assert "(ran now 0, already done 1)" in again
  assert len((results / "kit.jsonl").read_text().splitlines()) == 1
