"""The CLI: one clear line for bad input, no traceback; per-command help and flags; list; data prepare;
train; the hand-off to plugins, check, new attention and the suite launchers; quiet third-party logs."""

import json
import logging
import os
import subprocess
import sys
import types

import pytest

import attention_zoo
import lra_bench
from lra_bench import cli as cli_lib

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
    (["train", "--task=listops", "--repeats=3"], "lra-bench train: unrecognized arguments: --repeats=3"),
    (["bench", "--results_dir=/tmp/r", "--repeats=0"], "--repeats: 0 is not allowed; expected an integer >= 1"),
    (["report", "--results_dir=/nonexistent/results"], "--results_dir: /nonexistent/results does not exist"),
])
@pytest.mark.timeout(300)  # subprocess(es)
def test_bad_input_is_one_clear_line(args, message):
  proc = cli(*args)
  assert proc.returncode == 2
  assert message in proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.timeout(300)  # subprocess(es)
def test_help_lists_the_commands_and_what_to_run_first():
  proc = cli("--help")
  assert proc.returncode == 0, proc.stderr
  for command in ("list", "data", "train", "suite", "bench", "report", "viz", "check", "new"):
    assert f"\n    {command} " in proc.stdout, command
  assert "start with: ./run_all.sh" in proc.stdout and "lra-bench data prepare listops" in proc.stdout


# every command's flags: those it must show, and one of another command's it must not take
COMMAND_FLAGS = [
    (["list"], [], "--repeats"),
    (["data", "prepare", "listops"], ["--num_train", "--protocol", "--data_dir", "--overwrite, --nooverwrite"],
     "--workdir"),
    (["data", "download", "lra-release"], ["--url", "--sha256", "--data_dir"], "--protocol"),
    (["train", "--task=listops"], ["--task", "--attention ATTENTION", "(default: vanilla)", "--workdir",
                                   "--set KEY=VALUE", "--force, --noforce", "--coordinator_address"], "--repeats"),
    (["suite", "--results_dir=/tmp/r"], ["--seeds", "--launcher {inprocess,local,slurm}", "--workers",
                                         "--partition", "--gpus_per_task", "--time_limit", "--array_size",
                                         "--cpus_per_task", "--log_dir", "--retry_failed, --noretry_failed"],
     "--workdir"),
    (["bench", "--results_dir=/tmp/r"], ["--lengths", "--repeats", "(default: 10)", "--isolate, --noisolate",
                                         "--timeout", "--compile_only_from"], "--seeds"),
    (["report", "--results_dir=/tmp/r"], ["--results_dir", "--out", "--reference_dir", "--length", "--patterns"],
     "--repeats"),
    (["viz", "attention", "vanilla"], ["NAME", "--length", "(default: 64)", "--out"], "--results_dir"),
    (["check", "vanilla"], ["NAME", "--lengths", "(default: 256,512)", "--steps", "--quick"], "--workdir"),
    (["new", "attention", "mine"], ["NAME", "--dir"], "--lengths"),
]


@pytest.mark.parametrize("command, shown, foreign", COMMAND_FLAGS)
def test_each_command_has_only_its_own_flags(capsys, command, shown, foreign):
  """``<command> --help`` shows its flags (with defaults); another command's flag is an error."""
  with pytest.raises(SystemExit) as exit_:
    cli_lib.parse(["lra-bench", *command, "--help"])
  assert exit_.value.code == 0
  text = " ".join(capsys.readouterr().out.split())  # help wraps lines anywhere
  for flag in [*shown, "--plugin MODULE"]:
    assert flag in text, flag
  assert foreign not in text
  cli_lib.parse(["lra-bench", *command])  # valid as it is
  with pytest.raises(SystemExit):
    cli_lib.parse(["lra-bench", *command, f"{foreign}=1"])
  assert f"unrecognized arguments: {foreign}=1" in capsys.readouterr().err


@pytest.mark.timeout(300)  # subprocess(es)
def test_help_and_list_never_import_tensorflow():
  probe = ("import atexit, sys; atexit.register(lambda: print('TF' if 'tensorflow' in sys.modules else 'noTF'));"
           "sys.argv = ['lra-bench'] + sys.argv[1:]; from lra_bench import cli; cli.run()")
  for args in (["list"], ["list", "--help"], ["train", "--help"]):
    proc = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("noTF"), args


def test_boolean_flags_and_defaults():
  bench = cli_lib.parse(["lra-bench", "bench", "--results_dir=/tmp/r"])
  assert bench.isolate is True and bench.lengths == [1024, 2048, 3072, 4096, 8192, 16384] and bench.repeats == 10
  assert cli_lib.parse(["lra-bench", "bench", "--results_dir=/tmp/r", "--noisolate"]).isolate is False
  suite = cli_lib.parse(["lra-bench", "suite", "--results_dir=/tmp/r", "--seeds=0,1,2", "--noretry_failed"])
  assert (suite.isolate, suite.retry_failed, suite.seeds, suite.protocol) == (False, False, [0, 1, 2], "smoke")
  train = cli_lib.parse(["lra-bench", "train", "--task", "listops", "--distributed"])
  assert (train.distributed, train.force, train.protocol, train.seed) == (True, False, "lra", 0)
  assert cli_lib.parse(["lra-bench", "train", "--task=listops"]).distributed is None
  prepare = cli_lib.parse(["lra-bench", "data", "prepare", "listops", "--overwrite"])
  assert prepare.overwrite is True and prepare.seed is None


def test_suite_launcher_options_reach_run_suite():
  plain = cli_lib.parse(["lra-bench", "suite", "--results_dir=/tmp/r"])
  assert cli_lib._launcher_kwargs(plain) == {}
  slurm = cli_lib.parse(["lra-bench", "suite", "--results_dir=/tmp/r", "--launcher=slurm", "--partition=gpu",
                     "--gpus_per_task=1", "--time_limit=90", "--array_size=8", "--cpus_per_task=4",
                     "--log_dir=/tmp/r/logs", "--workers=3"])
  assert cli_lib._launcher_kwargs(slurm) == {"launcher": "slurm", "launcher_options": {
      "workers": 3, "partition": "gpu", "gpus_per_task": 1, "time_limit_min": 90, "array_size": 8,
      "cpus_per_task": 4, "log_dir": "/tmp/r/logs"}}
  local = cli_lib.parse(["lra-bench", "suite", "--results_dir=/tmp/r", "--launcher=local"])
  assert cli_lib._launcher_kwargs(local)["launcher_options"]["workers"] is None


def test_plugins_are_loaded_before_the_command(monkeypatch, capsys):
  loaded = []
  monkeypatch.setattr(attention_zoo, "load_plugins", loaded.extend)
  args = cli_lib.parse(["lra-bench", "--plugin", "a.b", "list", "tasks", "--plugin=c"])
  assert cli_lib.main(args) == 0
  assert loaded == ["a.b", "c"] and "listops" in capsys.readouterr().out

  def broken(modules):
    raise attention_zoo.PluginError("plugin 'a.b' failed to import: ModuleNotFoundError: No module named 'a'")

  monkeypatch.setattr(attention_zoo, "load_plugins", broken)
  assert cli_lib.main(cli_lib.parse(["lra-bench", "list", "--plugin=a.b"])) == 2
  assert capsys.readouterr().err == "error: plugin 'a.b' failed to import: ModuleNotFoundError: No module named 'a'\n"


def test_check_and_new_attention_call_their_modules(monkeypatch, tmp_path, capsys):
  calls = []
  check = types.SimpleNamespace(run_check=lambda name, **kw: calls.append((name, kw)) or 3)
  scaffold = types.SimpleNamespace(new_attention=lambda name, directory: f"wrote {name} in {directory}")
  for name, module in (("check", check), ("scaffold", scaffold)):
    monkeypatch.setitem(sys.modules, f"lra_bench.{name}", module)
    monkeypatch.setattr(lra_bench, name, module, raising=False)
  args = cli_lib.parse(["lra-bench", "check", "mine", "--lengths=128,256", f"--out={tmp_path}", "--steps=5",
                    f"--data_dir={tmp_path}", "--quick"])
  assert cli_lib.main(args) == 3
  assert calls == [("mine", dict(lengths=[128, 256], out=str(tmp_path), steps=5, data_dir=str(tmp_path),
                                 quick=True))]
  assert cli_lib.main(cli_lib.parse(["lra-bench", "new", "attention", "mine", f"--dir={tmp_path}"])) == 0
  assert capsys.readouterr().out == f"wrote mine in {tmp_path}\n"


def test_third_party_info_logs_are_off_unless_asked(monkeypatch):
  for name in cli_lib.CHATTY_LOGGERS:
    monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
  cli_lib.quiet_logs(verbose=True)
  assert logging.getLogger("orbax").level == logging.NOTSET
  cli_lib.quiet_logs(verbose=False)
  assert all(logging.getLogger(name).level == logging.WARNING for name in ("absl", "orbax", "tensorstore"))
  assert logging.getLogger("lra_bench").level == logging.NOTSET  # ours follow --verbosity


def readme_commands() -> list[str]:
  """The commands of the first block of docs/usage.md ("The first commands"), as written (comments cut)."""
  with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
    text = f.read()
  block = text.split("## The first commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
  return [line.split(" #", 1)[0].strip() for line in block.splitlines() if line.startswith("lra-bench ")]


@pytest.mark.timeout(900)  # subprocess(es)
def test_readme_commands_work_from_a_fresh_directory(tmp_path):
  """The first commands a newcomer types, verbatim, in an empty working directory (relative workdir).
  The LRA-size ListOps (96k examples) is left out: it is the smoke one with bigger counts."""
  commands = [c for c in readme_commands() if c != "lra-bench data prepare listops"]
  assert any(c.startswith("lra-bench train ") and "--workdir runs/" in c for c in commands), commands
  cwd = tmp_path / "fresh"
  cwd.mkdir()
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", LRA_DATA_DIR=str(tmp_path / "data"),
             PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
  for command in commands:
    argv = [sys.executable, "-m", "lra_bench", *command.split()[1:]]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=800)
    assert proc.returncode == 0, (command, proc.stderr[-3000:])
    if command.startswith("lra-bench train "):  # the relative workdir is resolved by the training code too
      workdir = cwd / command.split("--workdir ", 1)[1].split()[0]
      with open(workdir / "result.json") as f:
        record = json.load(f)
      assert record["status"] == "ok" and record["workdir"] == str(workdir)
      assert "test accuracy" in proc.stdout
      assert f"ok record written to {workdir / 'result.json'}" in proc.stderr  # shown by default
      assert "checkpoint_manager.py" not in proc.stderr  # orbax's INFO chatter is off by default
