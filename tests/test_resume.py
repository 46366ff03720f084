"""Resume that always resumes: a run killed at any instant of its checkpointing (between a ``best`` and
the next ``last`` save, during either save, after a ``last`` commit) finishes on rerun with the numbers
of an uninterrupted run; a corrupted checkpoint gives one message naming the directory and ``--force``;
and a workdir holding another config's run is refused (or, with ``--force``, trained from scratch),
never mixed."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from lra_bench.experiments import cell
from lra_bench.training import checkpoints, loop
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Events in order: best 4, best 8, last 8, best 12, best 16, last 16 (every evaluation improves: see
# ``rising_validation``).
OVERRIDES = tiny_overrides(num_train_steps=16, eval_every=4, checkpoint_every=8, log_every=4)
COMPARED = ("test_accuracy", "test_accuracy_last", "best_val_accuracy", "best_step", "train_steps")


def rising_validation(evaluate=loop.Run.evaluate):
  """``Run.evaluate`` whose validation accuracy gains the step number, so every evaluation saves a best
  checkpoint (the events above happen whatever the tiny data's real accuracies are). Test accuracies
  are the real ones."""
  def patched(self, split, *args, **kwargs):
    out = evaluate(self, split, *args, **kwargs)
    return dict(out, accuracy=out["accuracy"] + int(self.state.step)) if split == "validation" else out
  return patched


def killed_run(kill: str, step: int, workdir: str, data_dir: str) -> None:
  """Runs the test config in ``workdir`` and exits the process (``os._exit(9)``, like a SIGKILL: no
  cleanup runs) at ``kill`` of ``step``. Called in a subprocess."""
  from orbax.checkpoint._src.path import atomicity

  loop.Run.evaluate = rising_validation()
  die = lambda: os._exit(9)
  if kill == "after_best":
    save_best = checkpoints.Checkpoints.save_best
    checkpoints.Checkpoints.save_best = lambda self, s, state: (save_best(self, s, state), s == step and die())
  elif kill == "after_last_commit":
    committed = checkpoints.Checkpoints._committed
    checkpoints.Checkpoints._committed = lambda self, s, p: die() if s == step else committed(self, s, p)
  else:  # "best_rename" / "last_rename": inside orbax's save, the step written but not yet renamed
    finalize, kind = atomicity.AtomicRenameTemporaryPath.finalize, kill.split("_")[0]

    async def dying_finalize(self):
      if (self._final_path.name, self._final_path.parent.name) == (str(step), kind):
        die()
      return await finalize(self)
    atomicity.AtomicRenameTemporaryPath.finalize = dying_finalize
  cell.train_cell(config_lib.load_config("smoke", "listops", OVERRIDES), workdir, data_dir)
  sys.exit(0)


def _params(workdir: str, name: str, step: int):
  import orbax.checkpoint as ocp

  with ocp.CheckpointManager(os.path.join(workdir, "checkpoints", name)) as mngr:
    args = ocp.args.Composite(state=ocp.args.StandardRestore()) if name == "last" else ocp.args.StandardRestore()
    restored = mngr.restore(step, args=args)
  return jax.tree.leaves((restored["state"] if name == "last" else restored)["params"])


def _steps(workdir: str, name: str) -> list[int]:
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints", name)) if d.isdigit())


@pytest.fixture(scope="module")
def reference(listops_dir, tmp_path_factory):
  """The uninterrupted run (with ``rising_validation``)."""
  workdir = str(tmp_path_factory.mktemp("straight"))
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(loop.Run, "evaluate", rising_validation())
    record = cell.train_cell(config_lib.load_config("smoke", "listops", OVERRIDES), workdir, listops_dir)
  assert record["status"] == "ok", record["error"]
  assert record["best_step"] == 16 and _steps(workdir, "best") == [16] and _steps(workdir, "last") == [16]
  return record


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kill, step, left", [
    ("after_best", 8, {"best": [8], "last": []}),            # between the two saves of one step
    ("after_best", 12, {"best": [8, 12], "last": [8]}),      # a best newer than the last checkpoint
    ("best_rename", 12, {"best": [8], "last": [8]}),         # inside the best save
    ("last_rename", 16, {"best": [8, 16], "last": [8]}),     # inside the last save
    ("after_last_commit", 8, {"best": [8], "last": [8]}),    # after a commit, before its cleanup
])
def test_killed_at_any_point_resumes_to_the_same_numbers(kill, step, left, reference, listops_dir, tmp_path,
                                                         monkeypatch, caplog):
  caplog.set_level(logging.INFO)
  workdir = str(tmp_path / "run")
  code = f"from tests.test_resume import killed_run; killed_run({kill!r}, {step}, {workdir!r}, {listops_dir!r})"
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 9, f"the run was not killed at {kill} {step}:\n{proc.stderr[-3000:]}"
  assert {name: _steps(workdir, name) for name in left} == left
  assert not os.path.exists(os.path.join(workdir, "result.json"))

  monkeypatch.setattr(loop.Run, "evaluate", rising_validation())
  resumed = cell.train_cell(config_lib.load_config("smoke", "listops", OVERRIDES), workdir, listops_dir)
  assert resumed["status"] == "ok", resumed["error"]
  assert {k: resumed[k] for k in COMPARED} == {k: reference[k] for k in COMPARED}
  shown = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # shown by default
  if left["last"]:
    assert f"resumed from step {left['last'][-1]} of the checkpoint in {workdir}/checkpoints" in shown
  assert f"ok record written to {workdir}/result.json" in [r.getMessage() for r in caplog.records]
  assert _steps(workdir, "best") == [16] and _steps(workdir, "last") == [16]
  for name in ("best", "last"):
    for a, b in zip(_params(workdir, name, 16), _params(reference["workdir"], name, 16)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _small(**extra) -> ml_collections.ConfigDict:
  return config_lib.load_config("smoke", "listops", tiny_overrides(
      **{"num_train_steps": 8, "eval_every": 4, "checkpoint_every": 4, **extra}))


def _finished_run(listops_dir: str, workdir: str, **extra) -> dict:
  config = _small(**extra)
  record = cell.train_cell(config, workdir, listops_dir)
  assert record["status"] == "ok", record["error"]
  return record


def _corrupt(step_dir: str) -> None:
  """Overwrites every file of a checkpoint step with garbage (what a bad disk or copy leaves)."""
  for root, _, files in os.walk(step_dir):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"\x00garbage")


@pytest.mark.parametrize("which", ["last", "best"])
def test_corrupted_checkpoint_is_one_message_with_the_fix(which, listops_dir, tmp_path, fast_compile):
  workdir = str(tmp_path / "run")
  finished = _finished_run(listops_dir, workdir)
  os.remove(os.path.join(workdir, "result.json"))  # as if killed before its record: the rerun resumes
  step = finished["train_steps"] if which == "last" else finished["best_step"]
  step_dir = os.path.join(workdir, "checkpoints", which, str(step))
  _corrupt(step_dir)
  config = _small()
  record = cell.train_cell(config, workdir, listops_dir)
  assert record["status"] == "failed"
  error = record["error"]
  assert error.startswith(f"cannot read the checkpoint {step_dir} (") and "\n" not in error, error
  assert "--force" in error and os.path.join(workdir, "checkpoints") in error and len(error) < 700
  again = cell.train_cell(config, workdir, listops_dir, force=True)
  assert again["status"] == "ok" and again["test_accuracy"] == finished["test_accuracy"]


def test_another_config_in_a_used_workdir_is_refused_never_mixed(listops_dir, tmp_path, fast_compile):
  workdir = str(tmp_path / "run")
  first = _finished_run(listops_dir, workdir)
  other = _small(**{"optimizer.learning_rate": 0.5})
  with pytest.raises(config_lib.ConfigError) as err:
    cell.train_cell(other, workdir, listops_dir)
  message = str(err.value)
  assert "optimizer.learning_rate:" in message and "-> 0.5" in message and "--force" in message
  assert "\n" not in message and "num_train_steps" not in message
  with open(os.path.join(workdir, "result.json")) as f:
    assert json.load(f) == json.loads(json.dumps(first))  # the earlier run's record is untouched

  # Keys that do not change results may differ: the same run, so its record stands (nothing is trained again)
  # and, without a record (killed before it), the run resumes from its checkpoint with the new cadence.
  cadence = _small(log_every=2, checkpoint_every=2)
  assert config_lib.config_hash(cadence) == first["config_hash"]
  assert cell.train_cell(cadence, workdir, listops_dir) == json.loads(json.dumps(first))
  os.remove(os.path.join(workdir, "result.json"))
  resumed = _finished_run(listops_dir, workdir, log_every=2, checkpoint_every=2)
  assert {k: resumed[k] for k in COMPARED} == {k: first[k] for k in COMPARED}
  assert resumed["config"]["log_every"] == 2 and resumed["config_hash"] == first["config_hash"]

  # --force: trained from scratch with the new config.
  forced = cell.train_cell(other, workdir, listops_dir, force=True)
  assert forced["status"] == "ok" and forced["config"]["optimizer"]["learning_rate"] == 0.5
  assert forced["config_hash"] == config_lib.config_hash(other)
