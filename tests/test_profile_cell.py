"""scripts/profile_cell.py: the projected cell time adds up what the loop runs, bad flags give one
``error:`` line and exit 2, and the JSON file is written whole or not at all."""

import json
import os
import sys
import types

import ml_collections
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import profile_cell


def fake_run(num_test: int):
  examples = {"test": types.SimpleNamespace(num_examples=num_test)}
  return types.SimpleNamespace(data=types.SimpleNamespace(examples=examples))


def config(steps=5000, eval_every=50, log_every=50, checkpoint_every=500):
  return ml_collections.ConfigDict({"num_train_steps": steps, "eval_every": eval_every,
                                    "log_every": log_every, "checkpoint_every": checkpoint_every})


MEASURED = {"step_s": 2.0, "eval_s": 40.0, "eval_examples": 2000, "best_s": 0.5, "log_s": 0.1,
            "checkpoint_s": 3.0, "compile_s": 10.0, "eval_compile_s": 5.0}


def test_projection_adds_steps_evals_logs_checkpoints_compile_and_tests():
  out = profile_cell.projection(config(), fake_run(2000), MEASURED)
  assert out["train_steps_total_s"] == 5000 * 2.0
  assert out["evals_total_s"] == 100 * (40.0 + 0.5)       # every 50 steps, each with a best save
  assert out["logs_total_s"] == 100 * 0.1
  assert out["checkpoints_total_s"] == 10 * 3.0
  assert out["test_total_s"] == 2 * 40.0                   # best and last parameters, 2000 examples each
  assert out["projected_s"] == 10_000 + 4050 + 10 + 30 + 80 + 10 + 5


def test_projection_counts_the_last_step_and_a_small_test_split_as_lra_size():
  out = profile_cell.projection(config(steps=120, eval_every=50, checkpoint_every=100), fake_run(200),
                                MEASURED)
  assert out["evals_total_s"] == 3 * 40.5                  # steps 50, 100 and the last one (120)
  assert out["checkpoints_total_s"] == 2 * 3.0
  assert out["test_total_s"] == 2 * 40.0                   # a 200-example test split costed as 2000


@pytest.mark.parametrize("argv,message", [
    (["--attention", "no_such_core", "--threads", "0"], "no_such_core"),
    (["--attention", "vanilla", "--protocol", "no_such_protocol", "--threads", "0"], "no_such_protocol"),
    (["--attention", "vanilla", "--steps", "0", "--threads", "0"], "--steps 0"),
])
def test_bad_input_is_one_error_line_and_exit_2(argv, message, capsys, tmp_path):
  path = tmp_path / "out.json"
  with pytest.raises(SystemExit) as exit_info:
    sys.exit(profile_cell.main([*argv, "--json", str(path), "--data_dir", str(tmp_path)]))
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("error:") and message in err[-1]
  assert "Traceback" not in "\n".join(err)
  assert not path.exists()


def test_json_is_written_atomically(tmp_path, monkeypatch):
  path = tmp_path / "sub" / "m.json"
  profile_cell.write_json(str(path), {"step_s": 1.5})
  assert json.loads(path.read_text()) == {"step_s": 1.5}

  def fail(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(profile_cell.json, "dump", fail)
  with pytest.raises(OSError):
    profile_cell.write_json(str(path), {"step_s": 9.0})
  assert json.loads(path.read_text()) == {"step_s": 1.5}   # the old file, whole
  assert os.listdir(path.parent) == ["m.json"]              # no temporary left behind
