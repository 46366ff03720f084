"""scripts/gpu_check.sh: the order in which it times attentions.

A device lease is 15 minutes, so the order decides what gets measured. With the default ("all") the
baselines and LRA Table 1's models go first; a list given in GPU_CHECK_ATTENTIONS must be timed in the
order given (a lease once spent its time re-timing Table 1's models that a list had put last). With a
timing budget of 0 nothing is timed and the script's last line names every attention not measured, in
the order it would have timed them; the core tests and the report are skipped, so this costs one JAX
start and, for "all", one `lra-bench list`.
"""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _not_measured(tmp_path, attentions):
  env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_SMOKE="1", GPU_CHECK_SKIP_TESTS="1",
             GPU_CHECK_SKIP_REPORT="1", GPU_CHECK_BENCH_BUDGET_S="0", GPU_CHECK_OUT=str(tmp_path / "out"),
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
