"""Issue 30: what a run that goes wrong says. One line that is true and names the fix, as the last thing
the user sees; a record when one can be written.

- item 13: the missing-data fix prepares exactly the data the run reads; a NaN loss at step 1 blames
  the core (before any update), not the learning rate;
- item 11: Ctrl-C says the step and that the same command resumes (exit 130), no tf.data traceback.
"""

import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys

import flax.linen as nn
import jax.numpy as jnp
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench import cli as cli_lib
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _NanCore(nn.Module):
  """A core whose output is NaN whatever its inputs (a broken plugin)."""

  config: attention_zoo.AttentionConfig

  @nn.compact
  def __call__(self, query, key, value, mask=None, deterministic=True):
    return value * jnp.nan


@dataclasses.dataclass(frozen=True)
class _NanConfig(attention_zoo.AttentionConfig):
  pass


def test_nan_from_the_first_step_names_the_core_not_the_learning_rate(listops_dir, tmp_path):
  with registry.temporary({"test_nan_core": (_NanCore, _NanConfig)}):
    config = config_lib.load_config("smoke", "listops", tiny_overrides(), attention="test_nan_core")
    record = cell.train_cell(config, str(tmp_path / "run"), listops_dir)
  assert record["status"] == "failed"
  error = record["error"]
  assert "at step 1, before any parameter update" in error and "learning rate is not the cause" in error
  assert error.endswith("check the attention core 'test_nan_core' with: lra-bench check test_nan_core")
  assert "lower optimizer.learning_rate" not in error


def test_missing_data_fix_prepares_what_the_run_reads(tmp_path, capsys):
  """The run reads ``data.options.name=tiny`` files; the printed command makes exactly those."""
  data_dir = tmp_path / "data"
  overrides = tiny_overrides(**{"data.prepare.num_train": 40, "data.prepare.num_val": 8,
                                "data.prepare.num_test": 8})
  record = cell.train_cell(config_lib.load_config("smoke", "listops", overrides), str(tmp_path / "run"),
                           str(data_dir))
  assert record["status"] == "no_data"
  fix = record["error"].splitlines()[-1].strip()
  assert fix == (f"lra-bench data prepare listops --protocol smoke --data_dir {data_dir} --name tiny "
                 "--num_test 8 --num_train 40 --num_val 8")
  assert cli_lib.main(cli_lib.parse(shlex.split(fix))) == 0
  capsys.readouterr()
  again = cell.train_cell(config_lib.load_config("smoke", "listops", overrides), str(tmp_path / "run"),
                          str(data_dir), force=True)
  assert again["status"] == "ok", again["error"]
  assert again["data"]["train"]["num_examples"] == 40


@pytest.mark.timeout(300)  # a subprocess
def test_ctrl_c_says_the_step_and_how_to_resume(listops_dir, tmp_path):
  argv = [sys.executable, "-m", "lra_bench", "train", "--task=listops", "--protocol=smoke",
          f"--workdir={tmp_path / 'run'}", f"--data_dir={listops_dir}",
          *[f"--set={o}" for o in tiny_overrides(num_train_steps=100_000, log_every=4)]]
  proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  lines = []
  for line in proc.stderr:  # INFO lines: "step 16: loss ..." comes after the checkpoint of step 8
    lines.append(line)
    if "] step 16: loss" in line:
      break
  proc.send_signal(signal.SIGINT)
  lines += proc.stderr.readlines()
  proc.wait(timeout=120)
  err = "".join(lines)
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err
  last = re.fullmatch(r"error: interrupted at step (\d+); rerun the same command to resume \(from the last "
                      r"checkpoint, step (\d+) or later\)", lines[-1].strip())
  assert last and int(last.group(1)) >= 16 and int(last.group(2)) >= 8, err[-3000:]
