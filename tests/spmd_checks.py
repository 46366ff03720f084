"""Multi-device checks, run by tests/test_parallel.py in a subprocess with 4 simulated CPU devices.

``python -m tests.spmd_checks DATA_DIR WORKDIR`` (with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
set before JAX starts) prints one JSON object of measurements; the test asserts on it. One process runs
them all so JAX, TensorFlow and the compiles are paid for once.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
import optax

import tasks
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from lra_bench.training import checkpoints, loop, objectives, optim, parallel
from tests.conftest import tiny_overrides


def _setup(**overrides):
  config = config_lib.load_config("smoke", "listops", tiny_overrides(**overrides))
  task = tasks.get_task("listops")
  return config, objectives.select(config).create_model(), task


def _batches(task, count: int, batch_size: int, length: int = 64, seed: int = 0) -> list[dict]:
  rng = np.random.default_rng(seed)
  return [{"inputs": rng.integers(1, task.vocab_size, (batch_size, length), dtype=np.int32),
           "targets": rng.integers(0, task.num_classes, (batch_size,), dtype=np.int32)}
          for _ in range(count)]


def _run_steps(config, model, tx, batches, devices, param_sharding="replicated", accumulate_steps=1):
  """Trains on ``batches`` over a mesh of ``devices`` with the loop's own mesh/jit block (``loop.place``).

  Returns (losses, initial params, final params, whether any state leaf is split over devices).
  """
  mesh = parallel.make_mesh(devices)
  config = config_lib.load_config("smoke", "listops", tiny_overrides(
      param_sharding=param_sharding, accumulate_steps=accumulate_steps,
      **{"model.dropout_rate": config.model.dropout_rate,
         "model.attention_dropout_rate": config.model.attention_dropout_rate}))
  placed = loop.place(config, objectives.select(config), model, tx, mesh, batches[0])
  state, initial = placed.state, jax.device_get(placed.state.params)
  losses = []
  for batch in batches:
    state, metrics = placed.train_step(state, parallel.global_batch(batch, mesh))
    losses.append(float(metrics["loss"]))
  sharded = any(not s.is_fully_replicated for s in jax.tree.leaves(placed.state_shardings))
  return losses, initial, jax.device_get(state.params), sharded


def _max_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def data_parallel_matches_one_device() -> dict:
  """Same batches, same keys (dropout on): 1 device vs 4 devices replicated vs 4 devices FSDP."""
  config, model, task = _setup()
  tx = optim.make_optimizer(config.optimizer)
  batches = _batches(task, 4, 8)
  one, _, params_one, _ = _run_steps(config, model, tx, batches, jax.devices()[:1])
  four, _, params_four, _ = _run_steps(config, model, tx, batches, jax.devices())
  # FSDP threshold lowered so the tiny model's embedding/MLP kernels really are split.
  parallel.FSDP_MIN_SIZE, saved = 256, parallel.FSDP_MIN_SIZE
  fsdp, _, params_fsdp, fsdp_sharded = _run_steps(config, model, tx, batches, jax.devices(), "fsdp")
  parallel.FSDP_MIN_SIZE = saved
  return {"losses_one": one, "losses_four": four, "losses_fsdp": fsdp, "fsdp_sharded": fsdp_sharded,
          "params_diff_four": _max_diff(params_one, params_four),
          "params_diff_fsdp": _max_diff(params_one, params_fsdp)}


def accumulation_matches_full_batch() -> dict:
  """One step of 4 micro-batches of 4 == one step of the batch of 16 (SGD, so params - lr·grad)."""
  config, model, task = _setup(**{"model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0})
  tx = optax.sgd(1.0)
  batches = _batches(task, 1, 16, seed=1)
  full, init, params_full, _ = _run_steps(config, model, tx, batches, jax.devices())
  accumulated, _, params_acc, _ = _run_steps(config, model, tx, batches, jax.devices(), accumulate_steps=4)
  return {"loss_full": full[0], "loss_accumulated": accumulated[0],
          "params_diff": _max_diff(params_full, params_acc), "update_size": _max_diff(params_full, init)}


class _Interrupted(BaseException):
  """Raised by the patched checkpoint writer: the process 'dies' right after a checkpoint (not a
  KeyboardInterrupt, which the loop turns into its "interrupted at step N" message)."""


def end_to_end(data_dir: str, workdir: str) -> dict:
  """The real loop on 4 devices with accumulation and bf16 (37 test examples in global batches of 8:
  the last one is padded and masked); the same run interrupted after its first checkpoint and rerun
  (exact resume); and an indivisible batch."""
  config = config_lib.load_config("smoke", "listops", tiny_overrides(
      num_train_steps=8, eval_every=4, checkpoint_every=4, accumulate_steps=2, precision="bfloat16"))
  record = cell.train_cell(config, workdir + "/e2e", data_dir)

  save_last = checkpoints.Checkpoints.save_last
  def save_and_die(self, *args, **kwargs):
    save_last(self, *args, **kwargs)
    raise _Interrupted
  checkpoints.Checkpoints.save_last = save_and_die
  try:
    cell.train_cell(config, workdir + "/resumed", data_dir)
  except _Interrupted:
    pass
  finally:
    checkpoints.Checkpoints.save_last = save_last
  restore_last, resumed_from = checkpoints.Checkpoints.restore_last, []
  def restore_and_note(self, *args, **kwargs):
    restored = restore_last(self, *args, **kwargs)
    resumed_from.append(None if restored is None else int(restored[0].step))
    return restored
  checkpoints.Checkpoints.restore_last = restore_and_note
  try:
    resumed = cell.train_cell(config, workdir + "/resumed", data_dir)
  finally:
    checkpoints.Checkpoints.restore_last = restore_last

  bad = cell.train_cell(config_lib.load_config("smoke", "listops", tiny_overrides(batch_size=6)),
                  workdir + "/bad", data_dir)
  keys = ("status", "error", "test_examples", "num_devices", "per_device_batch_size", "accumulate_steps",
          "precision", "test_accuracy", "test_accuracy_last", "best_val_accuracy", "best_step",
          "train_steps", "flops_per_step")
  return {"record": {k: record.get(k) for k in keys}, "resumed_from": resumed_from,
          "resumed": {k: resumed.get(k) for k in keys},
          "bad": {k: bad.get(k) for k in ("status", "error")}}


def main(argv: list[str]) -> None:
  data_dir, workdir = argv[1], argv[2]
  assert jax.device_count() == 4, jax.devices()
  out = {"data_parallel": data_parallel_matches_one_device(),
         "accumulation": accumulation_matches_full_batch(),
         "end_to_end": end_to_end(data_dir, workdir)}
  print("SPMD_CHECKS " + json.dumps(out))


if __name__ == "__main__":
  main(sys.argv)
