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
import itertools
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
from lra_bench import models, parallel, results


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


def _micro_batches(batch: dict[str, jax.Array], accumulate_steps: int) -> dict[str, jax.Array]:
  """[B, ...] -> [A, B/A, ...]; micro-batch ``a`` holds rows a, a + A, a + 2A, ...

  Strided rather than contiguous so that a batch sharded over devices along B stays where it is: every
  device's rows split into A local micro-batches, and no example moves between devices.
  """
  def split(x):
    return jnp.swapaxes(x.reshape(x.shape[0] // accumulate_steps, accumulate_steps, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def train_step(state: TrainState, batch: dict[str, jax.Array], *, model: nn.Module,
               tx: optax.GradientTransformation,
               accumulate_steps: int = 1) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on ``batch``; dropout/attention randomness from fold_in(state.rng, step).

  With ``accumulate_steps = A > 1`` the batch is A equal micro-batches (``_micro_batches``) run one
  after another in a ``lax.scan`` (so only one micro-batch's activations are alive); their mean
  gradients are averaged in float32 (= the gradient of the mean loss over the batch) and the optimizer
  steps once. Micro-batch ``a`` draws its randomness from fold_in(key of the step, a).
  """
  step_rng = jax.random.fold_in(state.rng, state.step)
  mutable = list(state.model_state) or False

  def grads_of(params, model_state, micro_batch, rng):
    dropout_rng, attention_rng = jax.random.split(rng)

    def loss_fn(params):
      out = model.apply(_variables(params, model_state), micro_batch, deterministic=False,
                        rngs={"dropout": dropout_rng, "attention": attention_rng}, mutable=mutable)
      logits, new_model_state = out if mutable else (out, model_state)
      loss = jnp.mean(cross_entropy(logits, micro_batch["targets"]))
      return loss, (logits, new_model_state)

    (loss, (logits, new_model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == micro_batch["targets"])
    return grads, new_model_state, loss, accuracy

  if accumulate_steps == 1:
    grads, new_model_state, loss, accuracy = grads_of(state.params, state.model_state, batch, step_rng)
  else:
    def body(carry, inputs):
      grad_sum, model_state, loss_sum, accuracy_sum = carry
      index, micro_batch = inputs
      grads, model_state, loss, accuracy = grads_of(state.params, model_state, micro_batch,
                                                    jax.random.fold_in(step_rng, index))
      grad_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32), grad_sum, grads)
      return (grad_sum, model_state, loss_sum + loss, accuracy_sum + accuracy), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    init = (zeros, state.model_state, jnp.zeros([], jnp.float32), jnp.zeros([], jnp.float32))
    (grad_sum, new_model_state, loss_sum, accuracy_sum), _ = jax.lax.scan(
        body, init, (jnp.arange(accumulate_steps), _micro_batches(batch, accumulate_steps)))
    grads = jax.tree.map(lambda g, p: (g / accumulate_steps).astype(p.dtype), grad_sum, state.params)
    loss, accuracy = loss_sum / accumulate_steps, accuracy_sum / accumulate_steps

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.global_norm(grads)}
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
             max_batches: int = -1, *, num_batches: int | None = None,
             empty_batch: dict[str, np.ndarray] | None = None, to_global=lambda batch: batch) -> dict[str, float]:
  """Sums of ``eval_fn`` over ``batches`` (each padded to ``batch_size`` and masked by ``weights``).

  Multi-host: every process must run the same number of (collective) steps although its shard may hold
  one batch fewer, so with ``num_batches`` a process whose batches run out feeds ``empty_batch``
  (zero rows, hence zero weight) until that count. ``to_global`` turns a process's padded batch into
  the global array ``eval_fn`` takes.
  """
  totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
  iterator = iter(batches)
  for i in itertools.count():
    if 0 <= max_batches <= i or (num_batches is not None and i >= num_batches):
      break
    batch = next(iterator, None)
    if batch is None:
      if num_batches is None:
        break
      batch = empty_batch
    sums = eval_fn(params, model_state, to_global(pad_batch(to_numpy(batch), batch_size)))
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


# ----------------------------------------------------------------------------------------------------
# The loop


def compute_dtype(config: ml_collections.ConfigDict):
  """Activation/matmul dtype of ``config.precision`` (parameters, softmax, norms and loss stay float32)."""
  parallel.check_config(config)
  return jnp.dtype(config.precision)


def create_model(config: ml_collections.ConfigDict, task: tasks_lib.Task) -> models.Classifier:
  return models.Classifier(config.model, task.vocab_size, task.num_classes, task.dual_input,
                           dtype=compute_dtype(config))


def example_batch(element_spec, batch_size: int) -> dict[str, np.ndarray]:
  """Zeros shaped like one batch of a dataset with ``element_spec`` (for init and compiling)."""
  return {key: np.zeros((batch_size, *spec.shape[1:]), spec.dtype.as_numpy_dtype)
          for key, spec in element_spec.items()}


def init_state(config, model, tx, batch: dict[str, np.ndarray], *, shardings=None) -> TrainState:
  """Parameters from PRNGKey(seed); ``batch`` only provides shapes.

  ``shardings``: None (default placement), or a function from the abstract state to its shardings
  (``partial(parallel.state_shardings, mesh=...)``); the state is then created where it lives.
  """
  def create():
    rng = jax.random.PRNGKey(config.seed)
    params_rng, dropout_rng, attention_rng, train_rng = jax.random.split(rng, 4)
    variables = dict(model.init({"params": params_rng, "dropout": dropout_rng, "attention": attention_rng},
                                batch, deterministic=True))
    params = variables.pop("params")
    return TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=tx.init(params),
                      model_state=variables, rng=train_rng)

  out_shardings = shardings(jax.eval_shape(create)) if shardings else None
  return jax.jit(create, out_shardings=out_shardings)()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, data_dir: str,
                       devices=None) -> dict[str, Any]:
  """Trains ``config`` in ``workdir`` (resuming if a checkpoint is there); returns the metric fields.

  Data-parallel over ``devices`` (default: every device of every process; see ``parallel``).
  """
  from flax.metrics import tensorboard

  tf = tasks_lib.base.import_tf()
  wall_start = time.perf_counter()
  task = tasks_lib.get_task(config.task)
  max_length = config.data.max_length
  data_options = dict(config.data.options)
  if config.model.get("input_kind", "tokens") == "pixels":
    data_options["input_kind"] = "pixels"  # one knob: the model's input kind picks the task's inputs
  mesh = parallel.make_mesh(devices)
  num_processes, process_index = jax.process_count(), jax.process_index()
  layout = parallel.batch_split(config.batch_size, config.accumulate_steps, mesh.size, num_processes)
  local_batch_size = layout["per_process_batch_size"]
  logging.info("task %s, attention %s, protocol %s, seed %d, precision %s; %d device(s) in %d process(es): "
               "batch %d = %d accumulation step(s) x %d device(s) x %d per device; devices %s", config.task,
               config.model.attention, config.protocol, config.seed, config.precision, mesh.size,
               num_processes, config.batch_size, config.accumulate_steps, mesh.size,
               layout["per_device_batch_size"], mesh.devices.tolist())

  data_stats = {split: task.examples(data_dir, split, max_length=max_length, **data_options)
                for split in tasks_lib.SPLITS}
  batched = functools.partial(tasks_lib.base.batched, batch_size=local_batch_size, seed=config.seed,
                              shuffle_buffer=config.data.shuffle_buffer, num_shards=num_processes,
                              shard_index=process_index)
  train_ds = batched(data_stats["train"], repeat=True)
  val_ds, test_ds = batched(data_stats["validation"]), batched(data_stats["test"])

  model = create_model(config, task)
  tx = make_optimizer(config.optimizer)
  shardings_of = functools.partial(parallel.state_shardings, mesh=mesh, param_sharding=config.param_sharding)
  state = init_state(config, model, tx, example_batch(train_ds.element_spec, 2), shardings=shardings_of)
  state_shardings = shardings_of(state)
  num_params = int(sum(x.size for x in jax.tree.leaves(state.params)))
  logging.info("model has %d parameters", num_params)

  to_global = functools.partial(parallel.global_batch, mesh=mesh)
  # Every process runs as many eval steps as the largest shard (process 0's) needs.
  eval_steps = {name: math.ceil(math.ceil(data_stats[name].num_examples / num_processes) / local_batch_size)
                for name in ("validation", "test")}
  run_evaluate = functools.partial(evaluate, batch_size=local_batch_size, to_global=to_global,
                                   empty_batch=example_batch(val_ds.element_spec, 0))

  train_iter = iter(train_ds)
  iterator_ckpt = tf.train.Checkpoint(iterator=train_iter)
  checkpoints = _Checkpoints(workdir)
  progress = {"best_val_accuracy": -1.0, "best_step": 0, "train_seconds": 0.0, "timed_steps": 0,
              "wall_seconds": 0.0}
  restored = checkpoints.restore_last(state, iterator_ckpt)
  if restored is not None:
    state, progress = restored
    state = jax.device_put(state, state_shardings)
    logging.info("resumed from step %d", int(state.step))

  data_sharding, replicated = parallel.batch_sharding(mesh), parallel.replicated(mesh)
  step_fn = jax.jit(functools.partial(train_step, model=model, tx=tx, accumulate_steps=config.accumulate_steps),
                    in_shardings=(state_shardings, data_sharding), out_shardings=(state_shardings, replicated),
                    donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, model=model),
                    in_shardings=(state_shardings.params, state_shardings.model_state, data_sharding),
                    out_shardings=replicated)
  compile_start = time.perf_counter()
  global_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct((config.batch_size, *x.shape[1:]), x.dtype),
                               example_batch(train_ds.element_spec, 0))
  compiled = step_fn.lower(state, global_shapes).compile()
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
      val = run_evaluate(eval_fn, state.params, state.model_state, val_ds,
                         max_batches=config.num_eval_batches, num_batches=eval_steps["validation"])
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
    batch = to_global(to_numpy(next(train_iter)))
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
  test_best = run_evaluate(eval_fn, best["params"], best["model_state"], test_ds,
                           num_batches=eval_steps["test"])
  test_last = run_evaluate(eval_fn, state.params, state.model_state, test_ds, num_batches=eval_steps["test"])
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
      "num_devices": mesh.size, "num_processes": num_processes,
      "per_device_batch_size": layout["per_device_batch_size"], "accumulate_steps": config.accumulate_steps,
      "precision": config.precision,
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
