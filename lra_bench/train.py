"""Training and evaluation: pure steps jitted at the call site, LRA schedules, exact resume, one record.

``train_step`` / ``eval_step`` are module-level pure functions. The loop compiles the train step ahead of
time (so compile time, XLA FLOPs and compiled memory are measured apart from the steps), evaluates every
``eval_every`` steps, keeps orbax checkpoints of the last and of the best-validation state, and reports
test accuracy of the best-validation parameters on the full test set (and of the last parameters).

Exact resume: the checkpoint holds params, optimizer state, step and the base PRNG key (per-step keys are
``fold_in(key, step)``), and the tf.data iterator state (position and shuffle buffer) is saved beside it,
so a killed run continued with the same command ends with the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import time
import traceback
from typing import Any, Iterable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

import tasks as tasks_lib
from lra_bench import config as config_lib
from lra_bench import models, results


class TrainingError(RuntimeError):
  """Training cannot continue (e.g. the loss became NaN). The message says what to change."""


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any  # non-trainable flax collections (e.g. EMA centroids); often empty
  rng: jax.Array    # base key (raw uint32); the key of step s is fold_in(rng, s)


# ----------------------------------------------------------------------------------------------------
# Schedules and optimizer


def learning_rate_schedule(opt: ml_collections.ConfigDict) -> optax.Schedule:
  """The LRA ``create_learning_rate_scheduler``: a product of named factors.

  ``constant`` (times learning_rate), ``linear_warmup`` (min(1, step/warmup)), ``rsqrt_decay``
  (1/sqrt(max(step, warmup))), ``linear_decay`` (clip((cycle - step)/(cycle - warmup), 0, 1)), ``cosine_decay`` (0.5(1 + cos(pi·((step-warmup)/cycle mod 1)))).
  """
  factors = [f.strip() for f in opt.schedule.split("*")]
  known = {"constant", "linear_warmup", "rsqrt_decay", "linear_decay", "cosine_decay"}
  unknown = set(factors) - known
  if unknown:
    raise config_lib.ConfigError(f"unknown schedule factor(s) {sorted(unknown)}; known: {sorted(known)}")
  warmup = float(opt.warmup_steps)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    lr = jnp.ones([], jnp.float32)
    for factor in factors:
      if factor == "constant":
        lr = lr * opt.learning_rate
      elif factor == "linear_warmup":
        lr = lr * jnp.minimum(1.0, step / max(warmup, 1.0))
      elif factor == "rsqrt_decay":
        lr = lr / jnp.sqrt(jnp.maximum(step, max(warmup, 1.0)))
      elif factor == "linear_decay":  # to 0 at steps_per_cycle (PyTorch OneCycle, linear anneal)
        span = max(float(opt.steps_per_cycle) - warmup, 1.0)
        lr = lr * jnp.clip((float(opt.steps_per_cycle) - step) / span, 0.0, 1.0)
      elif factor == "cosine_decay":
        progress = jnp.maximum(0.0, (step - warmup) / float(opt.steps_per_cycle))
        lr = lr * 0.5 * (1.0 + jnp.cos(jnp.pi * (progress % 1.0)))
    return lr

  return schedule


def make_optimizer(opt: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW(b1, b2, eps) with decoupled, lr-scaled weight decay on all parameters (as flax.optim Adam)."""
  parts = []
  if opt.grad_clip_norm and opt.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt.grad_clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(opt), b1=opt.b1, b2=opt.b2, eps=opt.eps,
                           weight_decay=opt.weight_decay))
  return optax.chain(*parts)


# ----------------------------------------------------------------------------------------------------
# Pure steps


def _variables(params, model_state):
  return {"params": params, **model_state}


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def train_step(state: TrainState, batch: dict[str, jax.Array], *, model: nn.Module,
               tx: optax.GradientTransformation) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on ``batch``; dropout/attention randomness from fold_in(state.rng, step)."""
  dropout_rng, attention_rng = jax.random.split(jax.random.fold_in(state.rng, state.step))
  mutable = list(state.model_state) or False

  def loss_fn(params):
    out = model.apply(_variables(params, state.model_state), batch, deterministic=False,
                      rngs={"dropout": dropout_rng, "attention": attention_rng}, mutable=mutable)
    logits, new_model_state = out if mutable else (out, state.model_state)
    loss = jnp.mean(cross_entropy(logits, batch["targets"]))
    return loss, (logits, new_model_state)

  (loss, (logits, new_model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["targets"]),
             "grad_norm": optax.global_norm(grads)}
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            model_state=new_model_state)
  return new_state, metrics


def eval_step(params, model_state, batch: dict[str, jax.Array], *, model: nn.Module) -> dict[str, jax.Array]:
  """Sums over the real examples of ``batch`` (``weights`` marks them): loss, correct, count."""
  logits = model.apply(_variables(params, model_state), batch, deterministic=True)
  weights = batch["weights"]
  return {"loss": jnp.sum(cross_entropy(logits, batch["targets"]) * weights),
          "correct": jnp.sum((jnp.argmax(logits, -1) == batch["targets"]) * weights),
          "count": jnp.sum(weights)}


# ----------------------------------------------------------------------------------------------------
# Helpers of the loop


def to_numpy(batch) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in batch.items()}


def pad_batch(batch: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
  """Pads a (last, partial) eval batch to ``batch_size`` and adds ``weights`` (1 = real example)."""
  n = len(batch["targets"])
  out = {k: np.concatenate([v, np.zeros((batch_size - n, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}
  out["weights"] = (np.arange(batch_size) < n).astype(np.float32)
  return out


def evaluate(eval_fn, params, model_state, batches: Iterable, batch_size: int,
             max_batches: int = -1) -> dict[str, float]:
  totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
  for i, batch in enumerate(batches):
    if 0 <= max_batches <= i:
      break
    sums = eval_fn(params, model_state, pad_batch(to_numpy(batch), batch_size))
    for k in totals:
      totals[k] += float(sums[k])
  count = max(totals["count"], 1.0)
  return {"accuracy": totals["correct"] / count, "loss": totals["loss"] / count,
          "count": int(totals["count"])}


def cost_analysis(compiled) -> dict[str, float | None]:
  """XLA's FLOPs and memory estimate of a compiled executable (None where the backend has none)."""
  out: dict[str, float | None] = {"flops": None, "compiled_memory_bytes": None, "temp_bytes": None}
  try:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0] if cost else {}
    out["flops"] = float(cost.get("flops")) if cost and cost.get("flops") is not None else None
  except Exception:  # noqa: BLE001 - not every backend implements it
    pass
  try:
    mem = compiled.memory_analysis()
    if mem is not None:
      out["temp_bytes"] = int(mem.temp_size_in_bytes)
      out["compiled_memory_bytes"] = int(mem.temp_size_in_bytes + mem.argument_size_in_bytes
                                         + mem.output_size_in_bytes - mem.alias_size_in_bytes)
  except Exception:  # noqa: BLE001
    pass
  return out


def peak_memory_bytes() -> int | None:
  """Runtime peak bytes on the first local device, where the backend reports it (GPU/TPU; not CPU)."""
  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception:  # noqa: BLE001
    return None
  return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def is_oom(err: BaseException) -> bool:
  text = f"{type(err).__name__}: {err}"
  return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM"))


class _Checkpoints:
  """``<workdir>/checkpoints/{last,best}`` (orbax) + the tf.data iterator state beside ``last``."""

  def __init__(self, workdir: str):
    self.root = os.path.join(workdir, "checkpoints")
    options = lambda: ocp.CheckpointManagerOptions(max_to_keep=1, create=True,
                                                   enable_async_checkpointing=False,
                                                   cleanup_tmp_directories=True)
    self.last = ocp.CheckpointManager(os.path.join(self.root, "last"), options=options())
    self.best = ocp.CheckpointManager(os.path.join(self.root, "best"), options=options())
    self.data_dir = os.path.join(self.root, "data")

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
    iterator_ckpt.read(os.path.join(self.root, progress["data_checkpoint"])).expect_partial()
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


# ----------------------------------------------------------------------------------------------------
# The loop


def create_model(config: ml_collections.ConfigDict, task: tasks_lib.Task) -> models.Classifier:
  return models.Classifier(config.model, task.vocab_size, task.num_classes, task.dual_input)


def example_batch(element_spec, batch_size: int) -> dict[str, np.ndarray]:
  """Zeros shaped like one batch of a dataset with ``element_spec`` (for init and compiling)."""
  return {key: np.zeros((batch_size, *spec.shape[1:]), spec.dtype.as_numpy_dtype)
          for key, spec in element_spec.items()}


def init_state(config, model, tx, batch: dict[str, np.ndarray]) -> TrainState:
  """Parameters from PRNGKey(seed); ``batch`` only provides shapes."""
  rng = jax.random.PRNGKey(config.seed)
  params_rng, dropout_rng, attention_rng, train_rng = jax.random.split(rng, 4)
  variables = jax.jit(functools.partial(model.init, deterministic=True))(
      {"params": params_rng, "dropout": dropout_rng, "attention": attention_rng}, batch)
  variables = dict(variables)
  params = variables.pop("params")
  return TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=tx.init(params),
                    model_state=variables, rng=train_rng)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, data_dir: str) -> dict[str, Any]:
  """Trains ``config`` in ``workdir`` (resuming if a checkpoint is there); returns the metric fields."""
  from flax.metrics import tensorboard

  tf = tasks_lib.base.import_tf()
  wall_start = time.perf_counter()
  task = tasks_lib.get_task(config.task)
  max_length = config.data.max_length
  data_options = dict(config.data.options)
  if config.model.get("input_kind", "tokens") == "pixels":
    data_options["input_kind"] = "pixels"  # one knob: the model's input kind picks the task's inputs
  logging.info("task %s, attention %s, protocol %s, seed %d, devices %s", config.task,
               config.model.attention, config.protocol, config.seed, jax.devices())

  data_stats = {split: task.examples(data_dir, split, max_length=max_length, **data_options)
                for split in tasks_lib.SPLITS}
  batched = functools.partial(tasks_lib.base.batched, batch_size=config.batch_size, seed=config.seed,
                              shuffle_buffer=config.data.shuffle_buffer)
  train_ds = batched(data_stats["train"], repeat=True)
  val_ds, test_ds = batched(data_stats["validation"]), batched(data_stats["test"])

  model = create_model(config, task)
  tx = make_optimizer(config.optimizer)
  state = init_state(config, model, tx, example_batch(train_ds.element_spec, 2))
  num_params = int(sum(x.size for x in jax.tree.leaves(state.params)))
  logging.info("model has %d parameters", num_params)

  train_iter = iter(train_ds)
  iterator_ckpt = tf.train.Checkpoint(iterator=train_iter)
  checkpoints = _Checkpoints(workdir)
  progress = {"best_val_accuracy": -1.0, "best_step": 0, "train_seconds": 0.0, "timed_steps": 0,
              "wall_seconds": 0.0}
  restored = checkpoints.restore_last(state, iterator_ckpt)
  if restored is not None:
    state, progress = restored
    logging.info("resumed from step %d", int(state.step))

  step_fn = jax.jit(functools.partial(train_step, model=model, tx=tx), donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, model=model))
  compile_start = time.perf_counter()
  compiled = step_fn.lower(state, example_batch(train_ds.element_spec, config.batch_size)).compile()
  compile_seconds = time.perf_counter() - compile_start
  analysis = cost_analysis(compiled)

  writer = tensorboard.SummaryWriter(os.path.join(workdir, "tensorboard")) if jax.process_index() == 0 else None
  schedule = learning_rate_schedule(config.optimizer)
  best_val, best_step = progress["best_val_accuracy"], progress["best_step"]
  train_seconds, timed_steps = progress["train_seconds"], progress["timed_steps"]
  step = int(state.step)
  window_start, window_first_step = None, step
  train_metrics: list[dict] = []

  def run_eval_and_checkpoint(step: int) -> None:
    nonlocal best_val, best_step, state
    if step % config.eval_every == 0 or step == config.num_train_steps:
      val = evaluate(eval_fn, state.params, state.model_state, val_ds, config.batch_size,
                     config.num_eval_batches)
      logging.info("step %d: validation accuracy %.4f, loss %.4f", step, val["accuracy"], val["loss"])
      if writer:
        writer.scalar("eval/accuracy", val["accuracy"], step)
        writer.scalar("eval/loss", val["loss"], step)
      if val["accuracy"] > best_val:
        best_val, best_step = val["accuracy"], step
        checkpoints.save_best(step, state)
    if step % config.checkpoint_every == 0 or step == config.num_train_steps:
      checkpoints.save_last(step, state, {
          "best_val_accuracy": best_val, "best_step": best_step, "train_seconds": train_seconds,
          "timed_steps": timed_steps,
          "wall_seconds": progress["wall_seconds"] + time.perf_counter() - wall_start}, iterator_ckpt)

  while step < config.num_train_steps:
    batch = to_numpy(next(train_iter))
    if window_start is None and step > window_first_step:
      window_start, window_first_step = time.perf_counter(), step  # first step after (re)start = warm-up
    state, metrics = compiled(state, batch)
    step += 1
    train_metrics.append(metrics)
    boundary = (step % config.log_every == 0 or step % config.eval_every == 0
                or step % config.checkpoint_every == 0 or step == config.num_train_steps)
    if not boundary:
      continue
    metrics = jax.device_get(train_metrics)
    jax.block_until_ready(state)
    if window_start is not None:
      train_seconds += time.perf_counter() - window_start
      timed_steps += step - window_first_step
    train_metrics = []
    loss = float(np.mean([m["loss"] for m in metrics]))
    if not math.isfinite(loss):
      raise TrainingError(f"loss became {loss} by step {step} (learning rate {float(schedule(step)):.3g}); "
                          "lower optimizer.learning_rate or set optimizer.grad_clip_norm")
    if step % config.log_every == 0 or step == config.num_train_steps:
      logging.info("step %d: loss %.4f, accuracy %.4f, %.2f steps/s", step, loss,
                   np.mean([m["accuracy"] for m in metrics]), timed_steps / max(train_seconds, 1e-9))
      if writer:
        writer.scalar("train/loss", loss, step)
        writer.scalar("train/accuracy", float(np.mean([m["accuracy"] for m in metrics])), step)
        writer.scalar("train/learning_rate", float(schedule(step)), step)
        writer.flush()
    run_eval_and_checkpoint(step)
    window_start, window_first_step = time.perf_counter(), step

  best = checkpoints.restore_best(state)
  if best is None:  # no eval happened (e.g. zero steps): evaluate the current parameters
    best, best_step = {"params": state.params, "model_state": state.model_state}, step
  test_best = evaluate(eval_fn, best["params"], best["model_state"], test_ds, config.batch_size)
  test_last = evaluate(eval_fn, state.params, state.model_state, test_ds, config.batch_size)
  logging.info("test accuracy %.4f (best-validation params, step %d), %.4f (last params)",
               test_best["accuracy"], best_step, test_last["accuracy"])
  if writer:
    writer.scalar("test/accuracy", test_best["accuracy"], step)
    writer.close()
  steps_per_second = timed_steps / train_seconds if train_seconds > 0 else None
  return {
      "test_accuracy": test_best["accuracy"], "test_accuracy_last": test_last["accuracy"],
      "test_examples": test_best["count"], "best_val_accuracy": best_val, "best_step": best_step,
      "train_steps": step, "num_params": num_params, "steps_per_second": steps_per_second,
      "examples_per_second": steps_per_second * config.batch_size if steps_per_second else None,
      "compile_seconds": compile_seconds,
      "wall_seconds": progress["wall_seconds"] + time.perf_counter() - wall_start,
      "peak_memory_bytes": peak_memory_bytes(),
      "compiled_memory_bytes": analysis["compiled_memory_bytes"],
      "compiled_temp_bytes": analysis["temp_bytes"], "flops_per_step": analysis["flops"],
      "data": {split: {"num_examples": ex.num_examples, "num_truncated": ex.num_truncated,
                       "source": ex.source} for split, ex in data_stats.items()},
  }


def run(config: ml_collections.ConfigDict, workdir: str, data_dir: str,
        results_dir: str | None = None, force: bool = False) -> dict[str, Any]:
  """Runs one training cell and writes its record; failures become records too (never half-written).

  A workdir whose ``result.json`` already holds a terminal record for the same config is not rerun
  (unless ``force``); an interrupted run resumes from its checkpoint.
  """
  os.makedirs(workdir, exist_ok=True)
  result_path = os.path.join(workdir, "result.json")
  chash = config_lib.config_hash(config)
  if os.path.exists(result_path) and not force:
    with open(result_path) as f:
      previous = json.load(f)
    if previous.get("config_hash") == chash and previous.get("status") in results.TERMINAL:
      logging.info("%s already holds a %r result for this config; not rerunning", workdir,
                   previous["status"])
      if results_dir:
        results.append_record(results_dir, previous)
      return previous
  if force:
    shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)

  base = dict(task=config.task, attention=config.model.attention, protocol=config.protocol,
              seed=config.seed, max_length=config.data.max_length, batch_size=config.batch_size,
              config=config.to_dict(), config_hash=chash, workdir=os.path.abspath(workdir),
              data_dir=os.path.abspath(data_dir))
  try:
    fields = train_and_evaluate(config, workdir, data_dir)
    record = results.make_record(status="ok", **base, **fields)
  except tasks_lib.MissingDataError as err:
    fix = (f"lra-bench data prepare {config.task} --protocol {config.protocol} "
           f"--data_dir {os.path.abspath(data_dir)}")
    message = str(err).split("\n")[0] + f"\nPrepare it for protocol {config.protocol!r} with:\n  {fix}"
    record = results.make_record(status="no_data", error=message, **base)
  except BaseException as err:  # noqa: BLE001 - every failure becomes a record, then propagates if fatal
    if isinstance(err, (KeyboardInterrupt, SystemExit)):
      raise
    with open(os.path.join(workdir, "error.log"), "w") as f:
      f.write(traceback.format_exc())
    status = "oom" if is_oom(err) else "failed"
    message = str(err) if isinstance(err, (TrainingError, tasks_lib.DataError, config_lib.ConfigError)) \
        else f"{type(err).__name__}: {err}"
    record = results.make_record(status=status, error=message.strip()[:2000], **base)
  if jax.process_index() == 0:
    results.write_json_atomic(result_path, record)
    if results_dir:
      results.append_record(results_dir, record)
  return record
