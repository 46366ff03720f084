"""scripts/gpu_train.sh in its CPU smoke form: cells trained side by side through the numpy pipeline
(as on an accelerator image without TensorFlow), each leaving an ok record that names the pipeline; a
cell cut by the budget is packed, and the packed run directory continues from its checkpoint."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(tmp_path, **env):
  environ = dict(os.environ, PYTHON=sys.executable, GPU_TRAIN_SMOKE="1", JAX_PLATFORMS="cpu",
                 GPU_TRAIN_OUT=str(tmp_path / "out"), GPU_TRAIN_DATA_DIR=str(tmp_path / "data"),
                 GPU_TRAIN_WORK=str(tmp_path / "work"), **env)
  proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_train.sh")], env=environ, capture_output=True,
                        text=True, timeout=400, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return proc.stdout


@pytest.mark.timeout(450)
def test_two_cells_side_by_side_leave_two_numpy_pipeline_records(tmp_path):
  out = _run(tmp_path)
  assert "done in" in out and "2 ok record(s)" in out, out
  with open(tmp_path / "out" / "results" / "results.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert sorted(r["attention"] for r in records) == ["local", "vanilla"]
  assert all(r["status"] == "ok" and r["config"]["data"]["pipeline"] == "numpy" for r in records)
  assert not (tmp_path / "out" / "unfinished.tar.gz").exists()


@pytest.mark.timeout(450)
def test_a_cell_cut_by_the_budget_is_packed_and_continues_from_its_checkpoint(tmp_path):
  sets = dict(GPU_TRAIN_CELLS="smoke:listops:vanilla", GPU_TRAIN_SETS="num_train_steps=1000000 checkpoint_every=20")
  # 30 s minus start-up and data (~5 s): the first checkpoint (step 20) comes ~10 s in, idle, here
  out = _run(tmp_path / "first", GPU_TRAIN_BUDGET_S="30", **sets)
  packed = tmp_path / "first" / "out" / "unfinished.tar.gz"
  assert "not finished (error: interrupted at step" in out and packed.exists(), out
  # the second run only has to restore (~7 s in); it is cut by its budget too
  _run(tmp_path / "second", GPU_TRAIN_RESUME=str(packed), GPU_TRAIN_BUDGET_S="20", **sets)
  log = (tmp_path / "second" / "work" / "smoke_listops_vanilla_s0.log").read_text()
  assert "resumed from step" in log, log[-2000:]
