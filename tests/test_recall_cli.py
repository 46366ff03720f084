"""``data prepare`` for the recall tasks: the flags of their options, and every data setting of a
protocol's sweep prepared by one command."""

from __future__ import annotations

import json
import os

import pytest

from lra_bench import cli


def _prepare(*argv) -> int:
  return cli.main(cli.parse(["lra-bench", "data", "prepare", *argv]))


def test_a_protocol_with_a_length_sweep_prepares_every_setting(tmp_path, capsys):
  data = tmp_path / "data"
  assert _prepare("mqar", "--protocol", "recall_cpu", f"--data_dir={data}", "--num_train", "40",
                  "--num_val", "8", "--num_test", "8") == 0
  folder = data / "recall"
  metas = sorted(p for p in os.listdir(folder) if p.endswith(".json"))
  assert metas == ["mqar-cpu_L128_kv8.json", "mqar-cpu_L64_kv4.json"]
  meta = json.loads((folder / "mqar-cpu_L128_kv8.json").read_text())
  assert json.dumps(meta).count("128") >= 1 and '"num_kv_pairs": 8' in json.dumps(meta)


def test_recall_flags_reach_the_generator(tmp_path):
  data = tmp_path / "data"
  assert _prepare("mqar", f"--data_dir={data}", "--name", "tiny", "--num_train", "20", "--num_val", "4",
                  "--num_test", "4", "--vocab_size", "64", "--seq_len", "32", "--num_kv_pairs", "2",
                  "--power_a", "0.5", "--random_non_queries", "True") == 0
  meta = json.loads((data / "recall" / "mqar-tiny.json").read_text())
  text = json.dumps(meta)
  for fragment in ('"vocab_size": 64', '"seq_len": 32', '"num_kv_pairs": 2', '"power_a": 0.5',
                   '"random_non_queries": true'):
    assert fragment in text, (fragment, text)


@pytest.mark.parametrize("argv, message", [
    (["--power_a", "0"], "power_a"), (["--random_non_queries", "maybe"], "random_non_queries"),
    (["--train_targets", "some"], "train_targets")])
def test_bad_recall_flags_are_one_line(tmp_path, capsys, argv, message):
  with pytest.raises(SystemExit) as exit_:
    cli.parse(["lra-bench", "data", "prepare", "mqar", f"--data_dir={tmp_path}", *argv])
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and message in err


def test_one_name_for_several_settings_of_a_sweep_is_refused_before_anything_is_written(tmp_path, capsys):
  data = tmp_path / "data"
  assert _prepare("mqar", "--protocol", "zoology", f"--data_dir={data}", "--name", "mine", "--num_train", "40",
                  "--num_val", "8", "--num_test", "8") != 0
  err = capsys.readouterr().err
  assert "--name mine would name 3 different data settings" in err and "num_kv_pairs, seq_len" in err
  assert not data.exists()


def test_the_no_data_fix_of_a_swept_protocol_prepares_exactly_the_runs_data(tmp_path):
  # zoology's `data prepare --protocol` makes every length of its sweep: the fix must pin the run's own
  # (seq_len and kv pairs spelled out even where they equal the first point's), or one name is given to all.
  import shlex

  import tasks
  from lra_bench.experiments import cell
  from lra_bench.training import config as config_lib

  data = tmp_path / "data"
  sets = ["data.prepare.num_train=40", "data.prepare.num_val=8", "data.prepare.num_test=8",
          "data.options.name=mine", "data.prepare.name=mine"]
  config = config_lib.load_config("zoology", "mqar", sets, attention="vanilla")
  message = cell.missing_data(tasks.base.MissingDataError("no mqar data"), config, str(data))
  command = shlex.split(message.splitlines()[-1])
  assert "--seq_len" in command and "--num_kv_pairs" in command
  assert cli.main(cli.parse(command)) == 0
  assert sorted(os.listdir(data / "recall")) == ["mqar-mine.json", "mqar-mine_test.npz", "mqar-mine_train.npz",
                                                 "mqar-mine_val.npz"]
  options = json.loads((data / "recall" / "mqar-mine.json").read_text())["options"]
  assert (options["seq_len"], options["num_kv_pairs"], options["num_train"]) == (64, 4, 40)
