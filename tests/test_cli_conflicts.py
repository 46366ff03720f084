"""Issue 30, the CLI's contradictions and unchecked inputs: one ``error:`` line, exit 2, nothing run.

- item 2: ``protocol`` / ``task`` cannot be relabelled through ``--set`` (nor through ``load_config``);
- item 11: ``$LRA_DATA_DIR`` gets the ``--data_dir`` check (a file is refused, ``~`` is expanded),
  ``--coordinator_address`` is ``host:port``, ``--process_id`` needs ``--num_processes``;
- item 12: a ``--set`` of a key that has its own flag names the flag; ``--compile_only`` with
  ``--compile_only_from`` is an error.
"""

import os

import pytest

from lra_bench import cli as cli_lib
from lra_bench.training import config as config_lib


def run_main(capsys, *argv):
  """(exit code, stderr lines) of ``lra-bench ARGV`` run in this process."""
  code = cli_lib.main(cli_lib.parse(["lra-bench", *argv]))
  return code, capsys.readouterr().err.splitlines()


@pytest.fixture
def no_training(monkeypatch):
  """Fails the test if a command gets as far as training or benchmarking anything."""
  from lra_bench.experiments import bench, cell, suite

  def ran(*args, **kwargs):
    pytest.fail("the command ran although its flags contradict each other")

  monkeypatch.setattr(cell, "train_cell", ran)
  monkeypatch.setattr(suite, "run_suite", ran)
  monkeypatch.setattr(bench, "run_bench", ran)


def test_protocol_and_task_are_not_overridable_in_load_config():
  with pytest.raises(config_lib.ConfigError, match="'protocol' cannot be overridden.*--protocol"):
    config_lib.load_config("smoke", "listops", ["protocol=lra"])
  with pytest.raises(config_lib.ConfigError, match="'task' cannot be overridden.*--task"):
    config_lib.load_config("smoke", "listops", ["task = text"])


@pytest.mark.parametrize("argv, message", [
    # item 2: a 60-step smoke run relabelled as LRA
    (["train", "--task=listops", "--protocol=smoke", "--set", "protocol=lra"],
     "--set protocol=lra: protocol has its own flag; use --protocol instead of --set"),
    (["train", "--task=listops", "--set=task=text"], "use --task instead of --set"),
    # item 12: the command, performer seed 5 filed as vanilla_seed3
    (["train", "--task=listops", "--attention=vanilla", "--set=model.attention=performer", "--seed=3",
      "--set=seed=5"], "--set model.attention=performer: model.attention has its own flag; use --attention"),
    (["train", "--task=listops", "--set", " seed =5"], "use --seed instead of --set"),
    (["suite", "--results_dir={tmp}", "--set=model.attention=performer"], "use --attentions instead"),
    (["suite", "--results_dir={tmp}", "--set=seed=1"], "use --seeds instead"),
    (["suite", "--results_dir={tmp}", "--set=protocol=lra"], "use --protocol instead"),
    (["bench", "--results_dir={tmp}", "--lengths=64", "--set=data.max_length=128"], "use --lengths instead"),
    (["bench", "--results_dir={tmp}", "--batch_size=2", "--set=batch_size=8"], "use --batch_size instead"),
    (["bench", "--results_dir={tmp}", "--set=bench.mode=inference"], "use --mode instead"),
    (["bench", "--results_dir={tmp}", "--compile_only", "--compile_only_from=2048"],
     "--compile_only compiles every length and --compile_only_from 2048 only the lengths from there on"),
])
def test_contradicting_flags_are_one_error_line(capsys, tmp_path, no_training, argv, message):
  code, err = run_main(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith("error: ") and message in err[0], err


def test_a_set_of_an_unflagged_key_still_runs(capsys, tmp_path, monkeypatch):
  """Keys below a flagged one (model.attention_kwargs.*) are not the flag's."""
  from lra_bench.experiments import cell

  seen = []
  monkeypatch.setattr(cell, "train_cell", lambda config, *a, **k: seen.append(config) or {
      "status": "failed", "error": "stopped by the test"})
  code, _ = run_main(capsys, "train", "--task=listops", "--protocol=smoke", "--attention=local",
                     "--set=model.attention_kwargs.block_size=16", f"--workdir={tmp_path}",
                     f"--data_dir={tmp_path}")
  assert code == 1 and seen[0].model.attention_kwargs.block_size == 16


def test_lra_data_dir_that_is_a_file_is_refused(capsys, tmp_path, monkeypatch, no_training):
  not_a_dir = tmp_path / "data.txt"
  not_a_dir.write_text("x")
  monkeypatch.setenv("LRA_DATA_DIR", str(not_a_dir))
  code, err = run_main(capsys, "train", "--task=listops", "--protocol=smoke", f"--workdir={tmp_path}/run")
  assert code == 2 and err == [f"error: $LRA_DATA_DIR: {not_a_dir} is not a directory; point LRA_DATA_DIR "
                               "at a directory or pass --data_dir DIR"]
  assert not (tmp_path / "run").exists()
  with pytest.raises(SystemExit) as exit_:  # the flag: the same check, at parse time
    cli_lib.parse(["lra-bench", "train", "--task=listops", f"--data_dir={not_a_dir}"])
  assert exit_.value.code == 2
  assert capsys.readouterr().err.startswith(f"error: --data_dir: {not_a_dir} is not a directory")


def test_lra_data_dir_with_a_tilde_is_expanded(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("LRA_DATA_DIR", "~/lra_x")
  monkeypatch.chdir(tmp_path)
  for argv in (["data", "prepare", "listops"], ["train", "--task=listops"], ["check", "vanilla"]):
    assert cli_lib._data_dir(cli_lib.parse(["lra-bench", *argv])) == str(tmp_path / "lra_x"), argv
  assert not os.path.exists(tmp_path / "~")


@pytest.mark.parametrize("address", ["nonsense", "host:", ":1234", "host:0", "host:70000", "a b:1"])
def test_coordinator_address_must_be_host_port(capsys, address):
  with pytest.raises(SystemExit) as exit_:
    cli_lib.parse(["lra-bench", "train", "--task=listops", f"--coordinator_address={address}"])
  assert exit_.value.code == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and "is not of the form host:port" in err[0], err


@pytest.mark.parametrize("address", ["10.0.0.1:1234", "node-7.cluster:8476", "[::1]:1234"])
def test_coordinator_address_accepts_host_port(address):
  args = cli_lib.parse(["lra-bench", "train", "--task=listops", f"--coordinator_address={address}"])
  assert args.coordinator_address == address


def test_process_id_needs_num_processes(capsys, tmp_path, no_training):
  code, err = run_main(capsys, "train", "--task=listops", "--process_id=1", f"--data_dir={tmp_path}")
  assert code == 2 and err == ["error: --process_id 1 needs --num_processes (the number of processes of "
                               "the run)"]
