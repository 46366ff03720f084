"""Checkpoints of a run: orbax ``last`` and ``best`` states plus the tf.data iterator state beside ``last``.

Exact resume: the ``last`` checkpoint holds params, optimizer state, step and the base PRNG key (per-step
keys are ``fold_in(key, step)``), and the tf.data iterator state (position and shuffle buffer) is saved
beside it, so a killed run continued with the same command ends with the same numbers as an
uninterrupted one.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from lra_bench.training.steps import TrainState


class Checkpoints:
  """``<workdir>/checkpoints/{last,best}`` (orbax) + the tf.data iterator state beside ``last``."""

  def __init__(self, workdir: str):
    self.root = os.path.join(workdir, "checkpoints")
    # orbax coordinates the processes of a multi-host run; the tf.data iterator state is per process.
    options = lambda: ocp.CheckpointManagerOptions(max_to_keep=1, create=True,
                                                   enable_async_checkpointing=False,
                                                   cleanup_tmp_directories=True)
    self.last = ocp.CheckpointManager(os.path.join(self.root, "last"), options=options())
    self.best = ocp.CheckpointManager(os.path.join(self.root, "best"), options=options())
    self.data_dir = os.path.join(self.root, "data")
    if jax.process_count() > 1:
      self.data_dir = os.path.join(self.data_dir, f"process_{jax.process_index()}")

  def save_last(self, step: int, state: TrainState, progress: dict, iterator_ckpt) -> None:
    data_prefix = iterator_ckpt.write(os.path.join(self.data_dir, f"iter-{step}"))
    progress = dict(progress, data_checkpoint=os.path.relpath(data_prefix, self.root))
    # The orbax save is the commit point: a crash before it leaves the previous checkpoint in force.
    self.last.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 progress=ocp.args.JsonSave(progress)), force=True)
    self.last.wait_until_finished()
    for name in os.listdir(self.data_dir):  # drop iterator states no checkpoint refers to
      if not name.startswith(f"iter-{step}") and name != "checkpoint":
        os.remove(os.path.join(self.data_dir, name))

  def restore_last(self, target: TrainState, iterator_ckpt):
    step = self.last.latest_step()
    if step is None:
      return None
    restored = self.last.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), progress=ocp.args.JsonRestore()))
    progress = dict(restored["progress"])
    # progress (written by process 0) names process 0's file; each process reads its own of that step.
    data_prefix = os.path.join(self.data_dir, os.path.basename(progress["data_checkpoint"]))
    iterator_ckpt.read(data_prefix).expect_partial()
    return restored["state"], progress

  def save_best(self, step: int, state: TrainState) -> None:
    self.best.save(step, args=ocp.args.StandardSave({"params": state.params,
                                                     "model_state": state.model_state}), force=True)
    self.best.wait_until_finished()

  def restore_best(self, target: TrainState):
    step = self.best.latest_step()
    if step is None:
      return None
    return self.best.restore(step, args=ocp.args.StandardRestore(
        {"params": target.params, "model_state": target.model_state}))
