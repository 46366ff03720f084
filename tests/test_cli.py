"""The CLI: one clear line for bad input, no traceback; list; data prepare; train."""

import os
import subprocess
import sys

import pytest

from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, **kwargs):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", "lra_bench", *args], cwd=REPO, capture_output=True,
                        text=True, env=env, timeout=600, **kwargs)


@pytest.mark.timeout(300)  # subprocess(es)
def test_list():
  proc = cli("list")
  assert proc.returncode == 0
  assert "vanilla" in proc.stdout and "listops" in proc.stdout and "smoke" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["train", "--task=nope"], "unknown task 'nope'"),
    (["train", "--task=listops", "--attention=nope"], "unknown attention 'nope'; known attentions:"),
    (["train", "--task=listops", "--protocol=nope"], "unknown protocol 'nope'"),
    (["train", "--task=listops", "--set=nope=1"], "unknown config key 'nope'"),
    (["data", "prepare", "nope"], "unknown task 'nope'"),
    (["frobnicate"], "unknown command 'frobnicate'"),
])
@pytest.mark.timeout(300)  # subprocess(es)
def test_bad_input_is_one_clear_line(args, message):
  proc = cli(*args)
  assert proc.returncode == 2
  assert message in proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.timeout(600)  # subprocess(es)
def test_prepare_then_train(tmp_path):
  data_dir = str(tmp_path / "data")
  proc = cli("data", "prepare", "listops", f"--data_dir={data_dir}", "--name=tiny", "--num_train=64",
             "--num_val=16", "--num_test=16", "--min_length=10", "--max_length=64")
  assert proc.returncode == 0, proc.stderr
  assert os.path.exists(os.path.join(data_dir, "listops-1000", "tiny_train.tsv"))
  proc = cli("train", "--task=listops", "--protocol=smoke", f"--data_dir={data_dir}",
             f"--workdir={tmp_path / 'run'}", *[f"--set={o}" for o in tiny_overrides(num_train_steps=8)])
  assert proc.returncode == 0, proc.stderr
  assert "test accuracy" in proc.stdout
  assert os.path.exists(tmp_path / "run" / "result.json")
