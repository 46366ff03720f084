"""Issue 30: what a run that goes wrong says. One line that is true and names the fix, as the last thing
the user sees; a record when one can be written.

- item 13: the missing-data fix prepares exactly the data the run reads; a NaN loss at step 1 blames
  the core (before any update), not the learning rate;
- item 11: Ctrl-C says the step and that the same command resumes (exit 130), no tf.data traceback.
"""

import dataclasses
import json
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
  # the core is registered by this test module, so the command loads it as a plugin
  assert error.endswith("check the attention core 'test_nan_core' with: lra-bench check test_nan_core "
                        f"--plugin {__name__}")
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
  # INFO lines: "step 12: loss ..." comes after the checkpoint of step 8 and before the evaluation and
  # checkpoint of step 16 (a SIGINT inside an orbax save once hung this test under load)
  for line in proc.stderr:
    lines.append(line)
    if "] step 12: loss" in line:
      break
  proc.send_signal(signal.SIGINT)
  lines += proc.stderr.readlines()
  proc.wait(timeout=120)
  err = "".join(lines)
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err
  last = re.fullmatch(r"error: interrupted at step (\d+); rerun the same command to resume \(from the last "
                      r"checkpoint, step (\d+) or later\)", lines[-1].strip())
  assert last and int(last.group(1)) >= 12 and int(last.group(2)) >= 8, err[-3000:]


# ----------------------------------------------------------------------------------------------------
# Item 8: a full disk during a checkpoint save; a corrupt checkpoint


REAL_WRITE = os.write


def _enospc_save(self, step, state):
  """orbax's error for a full disk (TensorStore reports ENOSPC as RESOURCE_EXHAUSTED), best step 8."""
  path = os.path.join(self.root, "best", f"{step}.orbax-checkpoint-tmp", "default", "_sharding")
  raise ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{path}": Failed writing: "{path}" '
                   "[OS error 28: No space left on device]")


def _train_argv(listops_dir, workdir):
  return ["lra-bench", "train", "--task=listops", "--protocol=smoke", f"--workdir={workdir}",
          f"--data_dir={listops_dir}", *[f"--set={o}" for o in tiny_overrides()]]


@pytest.mark.parametrize("record_writable", [True, False], ids=["record_written", "disk_stays_full"])
def test_full_disk_during_a_checkpoint_save_is_one_line(listops_dir, tmp_path, monkeypatch, capsys,
                                                        record_writable):
  from lra_bench.training import checkpoints

  workdir = tmp_path / "run"
  monkeypatch.setattr(checkpoints.Checkpoints, "save_best", _enospc_save)
  if not record_writable:  # every later write under the workdir fails too: error.log, result.json
    def write(fd, data):
      if os.readlink(f"/proc/self/fd/{fd}").startswith(str(workdir)):
        raise OSError(28, os.strerror(28))
      return REAL_WRITE(fd, data)
    monkeypatch.setattr(os, "write", write)
  code = cli_lib.main(cli_lib.parse(_train_argv(listops_dir, workdir)))
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 1 and len(err) == 1, err
  full = (f"disk full (ENOSPC: No space left on device) while writing {workdir}/checkpoints/best/8.orbax-"
          f"checkpoint-tmp/default/_sharding; free space on that filesystem (df -h {workdir}) or give the run "
          "another --workdir, then rerun the same command: it resumes from the last complete checkpoint")
  if record_writable:
    assert err == [f"error: run failed: {full}"]
    with open(workdir / "result.json") as f:
      record = json.load(f)
    assert record["status"] == "failed" and record["error"] == full
    assert "ValueError: RESOURCE_EXHAUSTED" in (workdir / "error.log").read_text()
  else:
    assert err[0].startswith(f"error: run failed: {full}; and no 'failed' record: could not write the "
                             f"record to {workdir}/result.json (No space left on device)"), err
    assert sorted(os.listdir(workdir)) == [".lock", "checkpoints", "tensorboard"]  # nothing partial


def test_the_noise_filter_drops_only_loop_closed_tracebacks():
  """TensorStore's threads print these from C++ after orbax closed its loop, in fragments, interleaved."""
  import io
  import threading

  from lra_bench.training import checkpoints

  out = io.StringIO()
  stream = checkpoints._LoopClosedNoiseFilter(out)
  noise = ['Traceback (most recent call last):\n',
           '  File "/usr/lib/python3.11/asyncio/base_events.py", line 806, in call_soon_threadsafe\n',
           "    self._check_closed()\n",
           '  File "/usr/lib/python3.11/asyncio/base_events.py", line 519, in _check_closed\n',
           "    raise RuntimeError('Event loop is closed')\n", "RuntimeError", ": Event loop is closed", "\n"]

  def spam():
    for _ in range(50):
      for piece in noise:
        stream.write(piece)

  threads = [threading.Thread(target=spam) for _ in range(4)]
  for thread in threads:
    thread.start()
  stream.write("\rprogress 3/10")  # a progress bar's partial line goes through at once
  assert out.getvalue().endswith("\rprogress 3/10")
  for thread in threads:
    thread.join()
  real = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    main()\n"
          "ValueError: real\nerror: the message\n")
  stream.write(real)
  assert out.getvalue() == "\rprogress 3/10" + real


@pytest.mark.timeout(300)  # two subprocesses
def test_a_corrupt_checkpoint_ends_with_its_one_line_message(listops_dir, tmp_path):
  workdir = tmp_path / "run"
  argv = [sys.executable, "-m", *_train_argv(listops_dir, workdir)]
  argv[2] = "lra_bench"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  first = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, timeout=280)
  assert first.returncode == 0, first.stderr[-2000:]
  os.remove(workdir / "result.json")  # the run is to resume from its last checkpoint ...
  with open(workdir / "checkpoints" / "last" / "24" / "state" / "manifest.ocdbt", "r+b") as f:
    f.write(b"\x00corrupt\xff" * 4)  # ... which is damaged
  proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, timeout=280)
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith(f"error: run failed: cannot read the checkpoint {workdir}/checkpoints/last/24 ")
  assert lines[-1].endswith(f"Rerun with --force to train this run from scratch, or delete {workdir}/checkpoints")
  assert "Event loop is closed" not in proc.stderr and "Traceback" not in proc.stderr
  assert len(lines) <= 6, proc.stderr[-3000:]  # the INFO lines of a run and the message


def test_ctrl_c_while_the_run_sets_up_is_kept_even_if_a_library_swallows_it(listops_dir, tmp_path, monkeypatch):
  """A SIGINT during set-up (here: while the train step compiles) that a library would swallow (the
  patched compile catches KeyboardInterrupt, as some did) still stops the run before its first step."""
  from lra_bench.training import loop

  real_compile = loop.compile_train_step

  def compile_then_sigint(*args, **kwargs):
    out = real_compile(*args, **kwargs)
    try:
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(100):  # the handler runs between bytecodes; give it some
        sum(range(1000))
    except KeyboardInterrupt:
      pass  # swallowed, as by a library
    return out

  monkeypatch.setattr(loop, "compile_train_step", compile_then_sigint)
  config = config_lib.load_config("smoke", "listops", tiny_overrides(num_train_steps=50))
  before = signal.getsignal(signal.SIGINT)  # Python's default; SIG_IGN in a pytest-xdist worker
  with pytest.raises(loop.Interrupted, match=r"interrupted at step 0; rerun the same command"):
    loop.train_and_evaluate(config, str(tmp_path / "run"), listops_dir)
  assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
