"""Train one config: data, model, mesh, compiled steps, the loop, evaluation, checkpoints, measurements.

``train_and_evaluate(config, workdir, data_dir, objective=...)`` returns the run's measurements (a flat
dict); it knows nothing about records, suites or failure policies (``lra_bench.experiments.cell`` turns its
outcome, or its exception, into a record). What it trains for is its objective's (``training.objectives``:
the model, the batch transform, the loss and metric terms; by default the task's own objective).

The train step is compiled ahead of time (``place_and_compile``), so compile time, XLA FLOPs and
compiled memory are measured apart from the steps. Every ``eval_every`` steps the validation split is
evaluated, the best-validation state is checkpointed and every ``checkpoint_every`` steps the last
state (``checkpoints.Checkpoints``: exact resume, consistent under a kill at any instant, and never
of another config). At the end the test split is evaluated with the
best-validation parameters (the reported accuracy) and with the last ones.

Periodic work is a few small objects in the style of the flax examples' ``periodic_actions``:
``Every`` (fires every n steps and at the last step) and ``StepTimer`` (training time without the
first step after a (re)start, which compiles and warms up, and without evaluation and checkpointing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import os
import signal
import threading
import time
from typing import Any, Iterable

import jax
import ml_collections
import numpy as np
import optax

import attention_zoo
import tasks as tasks_lib
from lra_bench import files
from lra_bench.errors import UserError
from lra_bench.training import objectives as objectives_lib
from lra_bench.training import models, optim, parallel, pretrain, steps, xla_stats
from lra_bench.training.checkpoints import Checkpoints, iterator_checkpoint


class TrainingError(UserError, RuntimeError):
  """Training cannot continue (e.g. the loss became NaN). The message says what to change."""

  exit_code = 1


class Interrupted(KeyboardInterrupt):
  """Ctrl-C during the steps; the message names the step and the checkpoint a rerun resumes from."""


# ----------------------------------------------------------------------------------------------------
# Evaluation of padded batches


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
  totals = {"loss": 0.0, "correct": 0.0, "count": 0.0, "examples": 0.0}
  classes: dict[str, np.ndarray] = {}
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
      totals[k] += float(sums.get(k, sums["count"]))  # an eval_fn without "examples": one label each
    for k in CLASS_COUNTS:
      if k in sums:
        classes[k] = classes.get(k, 0) + np.asarray(sums[k], np.float64)
  count = max(totals["count"], 1.0)
  out = {"accuracy": totals["correct"] / count, "loss": totals["loss"] / count,
         "count": int(totals["count"]), "examples": int(totals["examples"])}
  if classes:  # a macro-metric task: ``accuracy`` is the macro one, the micro one is kept beside it
    out.update(accuracy=macro_accuracy(*(classes[k] for k in CLASS_COUNTS)), accuracy_micro=out["accuracy"],
               metric="macro")
  return out


CLASS_COUNTS = ("class_correct", "class_labels", "class_predicted")


def macro_accuracy(correct: np.ndarray, labels: np.ndarray, predicted: np.ndarray) -> float:
  """The mean over classes of correct / labels (a class's recall), as torchmetrics'
  ``MulticlassAccuracy(average="macro")`` that MAD reports: a class that was neither a label nor a
  prediction is left out; a class that was predicted but never a label counts as 0 (its wrong
  predictions are someone else's misses, but it stays in the mean). 0 when no class counts."""
  correct, labels, predicted = (np.asarray(x, np.float64) for x in (correct, labels, predicted))
  false_pos, false_neg = predicted - correct, labels - correct
  counted = (correct + false_pos + false_neg) > 0
  if not counted.any():
    return 0.0
  recall = np.divide(correct, labels, out=np.zeros_like(correct), where=labels > 0)
  return float(recall[counted].mean())


# ----------------------------------------------------------------------------------------------------
# The mesh / jit / compile block (also what the multi-device tests run)


@dataclasses.dataclass
class Placed:
  """The initial state where it lives on ``mesh`` and the steps jitted with its shardings."""

  mesh: Any
  state: steps.TrainState
  state_shardings: Any
  train_step: Any   # jitted (state, global batch) -> (state, metrics); donates the state
  eval_step: Any    # jitted (params, model_state, global batch) -> sums


def place(config: ml_collections.ConfigDict, objective: objectives_lib.Objective, model,
          tx: optax.GradientTransformation, mesh, example: dict[str, np.ndarray],
          vocab_size: int | None = None) -> Placed:
  """Creates the state of ``model`` on ``mesh`` (``config.param_sharding``) and jits both steps with its
  shardings and ``objective``'s terms, batch transform (with its evaluation key) and per-class counts.

  ``example`` is any batch of the right per-example shapes (only its shapes are used); ``vocab_size``: the
  data's, where it decides it (``Examples.vocab_size``).
  """
  prepare, prepare_key = objective.batch_transform(vocab_size), objective.eval_key()
  shardings_of = functools.partial(parallel.state_shardings, mesh=mesh, param_sharding=config.param_sharding)
  if prepare is not None:  # the model is initialised with the batches it will see
    example = jax.tree.map(np.asarray, jax.jit(prepare)(example, prepare_key))
  state = steps.init_state(config, model, tx, example, shardings=shardings_of)
  state_shardings = shardings_of(state)
  data, replicated = parallel.batch_sharding(mesh), parallel.replicated(mesh)
  train_fn = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, terms=objective.terms,
                                       accumulate_steps=config.accumulate_steps, prepare=prepare),
                     in_shardings=(state_shardings, data), out_shardings=(state_shardings, replicated),
                     donate_argnums=0)
  eval_fn = jax.jit(functools.partial(steps.eval_step, model=model, terms=objective.terms, prepare=prepare,
                                      prepare_key=prepare_key, num_classes=objective.macro_classes(vocab_size)),
                    in_shardings=(state_shardings.params, state_shardings.model_state, data),
                    out_shardings=replicated)
  return Placed(mesh, state, state_shardings, train_fn, eval_fn)


def compile_train_step(placed: Placed, state, global_batch_shapes) -> tuple[Any, float, dict]:
  """(compiled train step, compile seconds, ``xla_stats.cost_analysis``) for batches of these shapes."""
  start = time.perf_counter()
  compiled = placed.train_step.lower(state, global_batch_shapes).compile()
  return compiled, time.perf_counter() - start, xla_stats.cost_analysis(compiled)


# ----------------------------------------------------------------------------------------------------
# Periodic actions


@dataclasses.dataclass
class Every:
  """Fires at every multiple of ``every`` and at the ``last`` step."""

  every: int
  last: int

  def __call__(self, step: int) -> bool:
    return step % self.every == 0 or step == self.last


class StepTimer:
  """Seconds spent in train steps, in windows between boundaries (eval, checkpoint, log).

  A window opens before the first step after the previous boundary; after a (re)start it opens one
  step later (that step compiles and warms up). Closing a window needs the state ready (the caller
  blocks on it), so the window times finished steps.
  """

  def __init__(self, step: int, seconds: float = 0.0, steps_done: int = 0):
    self.seconds, self.steps = seconds, steps_done
    self._start: float | None = None
    self._first = step

  def before_step(self, step: int) -> None:
    if self._start is None and step > self._first:
      self._start, self._first = time.perf_counter(), step

  def close(self, step: int) -> None:
    if self._start is not None:
      self.seconds += time.perf_counter() - self._start
      self.steps += step - self._first

  def reopen(self, step: int) -> None:
    self._start, self._first = time.perf_counter(), step

  @property
  def steps_per_second(self) -> float | None:
    return self.steps / self.seconds if self.seconds > 0 else None


# ----------------------------------------------------------------------------------------------------
# One run


@dataclasses.dataclass
class Data:
  """The three splits of a task, read once, and batched for this process."""

  examples: dict[str, tasks_lib.Examples]
  train: Any
  validation: Any
  test: Any
  local_batch_size: int

  @classmethod
  def load(cls, config: ml_collections.ConfigDict, task: tasks_lib.Task, data_dir: str,
           local_batch_size: int, indexed: bool = False) -> "Data":
    """``indexed``: each example also carries ``index``, its position in its split (an objective whose
    batch transform keys by it, ``Objective.indexed``)."""
    options = dict(config.data.options)
    if config.model.get("input_kind", "tokens") == "pixels":
      options["input_kind"] = "pixels"  # one knob: the model's input kind picks the task's inputs
    read = task.array_examples if config.data.get("pipeline", "tf") == "numpy" else task.examples
    try:
      examples = {split: read(data_dir, split, max_length=config.data.max_length, **options)
                  for split in tasks_lib.SPLITS}
    except tasks_lib.MissingDependencyError as err:
      if read == task.examples and config.task in tasks_lib.base.array_tasks():
        raise tasks_lib.MissingDependencyError(f"{err}; or read the {config.task} data without TensorFlow: "
                                               "--set data.pipeline=numpy") from None
      raise
    if indexed and examples["train"].arrays is not None:
      index = lambda ex: np.arange(ex.num_examples, dtype=np.int32)
      examples = {split: dataclasses.replace(ex, arrays={**ex.arrays, "index": index(ex)})
                  for split, ex in examples.items()}
    elif indexed:
      tf = tasks_lib.base.import_tf()
      examples = {split: dataclasses.replace(ex, dataset=ex.dataset.enumerate().map(
          lambda i, example: {**example, "index": tf.cast(i, tf.int32)})) for split, ex in examples.items()}
    batched = functools.partial(tasks_lib.base.batched, batch_size=local_batch_size, seed=config.seed,
                                shuffle_buffer=config.data.shuffle_buffer, num_shards=jax.process_count(),
                                shard_index=jax.process_index())
    return cls(examples, batched(examples["train"], repeat=True), batched(examples["validation"]),
               batched(examples["test"]), local_batch_size)

  def eval_steps(self, split: str) -> int:
    """Eval steps every process runs: as many as the largest shard (process 0's) needs."""
    per_process = math.ceil(self.examples[split].num_examples / jax.process_count())
    return math.ceil(per_process / self.local_batch_size)

  def stats(self) -> dict[str, dict]:
    return {split: {"num_examples": ex.num_examples, "num_truncated": ex.num_truncated,
                    "source": ex.source} for split, ex in self.examples.items()}


_PROCESS_STOP = threading.Event()


def request_stop() -> None:
  """Asks every run of this process to stop at its next step boundary, as a first Ctrl-C does (raising
  ``Interrupted``; its last checkpoint stays the resume point). For a caller that learns from a signal
  that the process must end (a suite worker's preemption, ``launcher``): raising from a signal handler
  lands wherever the main thread is, and inside a finaliser the exception is lost."""
  _PROCESS_STOP.set()


class StopFlag:
  """Ctrl-C as a request: a first SIGINT sets ``requested`` (the loop stops at the next step boundary),
  a second raises KeyboardInterrupt at once.

  Python raises KeyboardInterrupt wherever the main thread happens to be; inside a library (tf.data,
  orbax, logging, XLA's compiler) that can be swallowed or leave threads waiting, and the run then trains
  on (seen: a SIGINT during a resumed run's compilation was lost). ``train_and_evaluate`` installs the
  flag before the run is set up, so a request made while the data load, the checkpoint restores or the
  step compiles is kept, and the loop honours it before its first step."""

  def __init__(self):
    self.requested = False

  @contextlib.contextmanager
  def installed(self):
    """The flag as SIGINT's handler while the block runs (only in the main thread: signal handlers can
    be set nowhere else); nested installs keep the outer one's request."""
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    def request_stop(signum, frame):
      if self.requested:
        raise KeyboardInterrupt
      self.requested = True
      os.write(2, b"Ctrl-C: the run stops before its next step; Ctrl-C again stops it at once\n")
    previous = signal.signal(signal.SIGINT, request_stop)
    try:
      yield self
    finally:
      signal.signal(signal.SIGINT, previous)


class Run:
  """The state of one training run between its steps (see the module docstring)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, data_dir: str, devices=None, *,
               objective: objectives_lib.Objective | None = None, init_from=None, stop: StopFlag | None = None):
    """``objective``: what the run trains for (``objectives.select(config, phase)``; default: the task's
    own, ``objectives.TRAIN``): its model, batches and terms. ``init_from()``: the pretrained ``{params,
    model_state}`` a fresh run starts its encoder from (``init_from(run)``: called with this run once its
    data are loaded; not called when the run resumes its own checkpoint). ``stop``: the Ctrl-C flag, when
    the caller installed one before creating the run (``train_and_evaluate``); ``train`` installs it (or a
    fresh one) while it steps."""
    self.stop = stop if stop is not None else StopFlag()
    self.objective = objective if objective is not None else objectives_lib.select(config, objectives_lib.TRAIN)
    self.config, self.wall_start = config, time.perf_counter()
    workdir, data_dir = files.absolute(workdir), files.absolute(data_dir)
    self.mesh = parallel.make_mesh(devices)
    self.layout = parallel.batch_split(config.batch_size, config.accumulate_steps, self.mesh.size,
                                       jax.process_count())
    self._log_setup()
    self.checkpoints = Checkpoints(workdir, config)
    self.checkpoints.check_config()  # refuse another config's checkpoints before loading any data
    task = tasks_lib.get_task(config.task)
    self.data = Data.load(config, task, data_dir, self.layout["per_process_batch_size"],
                          indexed=self.objective.indexed)
    vocab_size = self.data.examples["train"].vocab_size
    self.placed = place(config, self.objective, self.objective.create_model(vocab_size),
                        optim.make_optimizer(config.optimizer), self.mesh,
                        steps.example_batch(self.data.train.element_spec, 2), vocab_size)
    self.state = self.placed.state
    self.saved_step = 0  # the step of the last committed checkpoint (what a rerun resumes from)
    self.num_params = int(sum(x.size for x in jax.tree.leaves(self.state.params)))
    self.transferred: dict[str, Any] | None = None
    logging.info("model has %d parameters", self.num_params)
    self.to_global = functools.partial(parallel.global_batch, mesh=self.mesh)
    self.train_iter = iter(self.data.train)
    self.iterator_ckpt = iterator_checkpoint(self.train_iter)
    self.progress = {"best_val_accuracy": -1.0, "best_step": 0, "train_seconds": 0.0, "timed_steps": 0,
                     "wall_seconds": 0.0}
    self._resume()
    if init_from is not None and self.saved_step == 0:
      self._start_from(init_from(self))
    global_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct((config.batch_size, *x.shape[1:]), x.dtype),
                                 steps.example_batch(self.data.train.element_spec, 0))
    self.compiled, self.compile_seconds, self.analysis = compile_train_step(self.placed, self.state,
                                                                            global_shapes)
    xla_stats.check_fits(self.compiled, "train step", steps.MEMORY_FIX)  # before the allocator aborts
    # what computes a flash model's attention in the train step
    self.attention_implementation = models.attention_implementation(
        config.model, steps.compute_dtype(config), training=True, compiled=self.compiled)
    self.workdir = workdir
    self.writer = _summary_writer(workdir)
    self.schedule = optim.learning_rate_schedule(config.optimizer)

  def _log_setup(self) -> None:
    c, layout = self.config, self.layout
    precision = steps.precision_fields(c)
    logging.info("task %s, attention %s, protocol %s, seed %d, precision %s (%s), matmuls %s; %d device(s) in %d "
                 "process(es): batch %d = %d accumulation step(s) x %d device(s) x %d per device; devices %s", c.task,
                 c.model.attention, c.protocol, c.seed, precision["compute_dtype"], c.precision,
                 precision["matmul_precision"], self.mesh.size, jax.process_count(),
                 c.batch_size, c.accumulate_steps, self.mesh.size, layout["per_device_batch_size"],
                 self.mesh.devices.tolist())

  def _resume(self) -> None:
    restored = self.checkpoints.restore_last(self.state, self.iterator_ckpt)
    if restored is not None:
      state, self.progress = restored
      self.state = jax.device_put(state, self.placed.state_shardings)
      self.saved_step = int(self.state.step)
      # WARNING: shown by default, so a rerun says it continued rather than started over.
      logging.warning("resumed from step %d of the checkpoint in %s", int(self.state.step),
                      self.checkpoints.root)

  def _start_from(self, pretrained: dict[str, Any]) -> None:
    """The fresh state with every parameter (and model state) the pretrained model shares with it."""
    params, taken, fresh = pretrain.transfer(pretrained["params"], jax.device_get(self.state.params))
    model_state, state_taken, _ = pretrain.transfer(pretrained.get("model_state") or {},
                                                    jax.device_get(self.state.model_state))
    if not taken:
      raise TrainingError("the pretrained model shares no parameter with this model; were both stages "
                          "run with the same model settings?")
    self.state = jax.device_put(self.state.replace(params=params, model_state=model_state),
                                self.placed.state_shardings)
    count = lambda tree, keys: int(sum(np.size(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
                                       if jax.tree_util.keystr(path) in keys))
    self.transferred = {"params": count(params, set(taken)), "fresh_params": count(params, set(fresh)),
                        "fresh": fresh, "model_state": len(state_taken)}
    logging.info("started from the pretrained encoder: %d parameters taken, %d fresh (%s)",
                 self.transferred["params"], self.transferred["fresh_params"], ", ".join(fresh))

  def evaluate(self, split: str, params, model_state, max_batches: int = -1) -> dict[str, float]:
    return evaluate(self.placed.eval_step, params, model_state, getattr(self.data, split),
                    self.data.local_batch_size, max_batches, num_batches=self.data.eval_steps(split),
                    empty_batch=steps.example_batch(self.data.validation.element_spec, 0),
                    to_global=self.to_global)

  def wall_seconds(self) -> float:
    return self.progress["wall_seconds"] + time.perf_counter() - self.wall_start

  def train(self) -> None:
    """Steps until ``num_train_steps``; at each boundary: NaN check, log, evaluate, checkpoint."""
    c = self.config
    log, evaluate_now, checkpoint_now = (Every(c.log_every, c.num_train_steps),
                                         Every(c.eval_every, c.num_train_steps),
                                         Every(c.checkpoint_every, c.num_train_steps))
    self.best_val, self.best_step = self.progress["best_val_accuracy"], self.progress["best_step"]
    step = int(self.state.step)
    self.timer = StepTimer(step, self.progress["train_seconds"], self.progress["timed_steps"])
    metrics: list[dict] = []
    self.step = step  # the last step done (Ctrl-C names it)
    try:
      with self.stop.installed():
        self._steps(step, metrics, log, evaluate_now, checkpoint_now)
    except KeyboardInterrupt:
      resume = (f"from the last checkpoint, step {self.saved_step} or later" if self.saved_step
                else "no checkpoint was saved yet, so it starts again")
      raise Interrupted(f"interrupted at step {self.step}; rerun the same command to resume ({resume})") from None

  @property
  def stop_requested(self) -> bool:
    return self.stop.requested or _PROCESS_STOP.is_set()

  # How much work the loop may queue ahead of the device, in seconds of measured steps. JAX dispatches
  # asynchronously; unbounded, the loop queued every step up to the next log boundary and waited there,
  # so a Ctrl-C (read before each dispatch) took effect only once the device had run them all (3.5
  # minutes of xiong ListOps steps on this CPU). Bounding every run to 2 steps cost ~9 % of the steps/s
  # of a fast CPU cell (cpu ListOps vanilla, 35 ms steps: 26.9 vs 29.6 steps/s, 3 A/B pairs), so the
  # bound is in time: a step of 5 s keeps 2 in flight, a step of 35 ms is not held back (the first log
  # interval, before a step is timed, is not bounded).
  MAX_QUEUED_SECONDS = 10.0

  def _max_in_flight(self) -> int | None:
    """Steps that may be dispatched and unfinished at once (>= 2: the next one is dispatched while the
    current one runs); None before any step was timed."""
    rate = self.timer.steps_per_second
    return None if rate is None else max(2, math.ceil(self.MAX_QUEUED_SECONDS * rate))

  def _steps(self, step: int, metrics: list, log: Every, evaluate_now: Every, checkpoint_now: Every) -> None:
    c = self.config
    limit = self._max_in_flight()
    if self.stop_requested:  # asked for during the set-up (or with every step already done)
      raise KeyboardInterrupt
    while step < c.num_train_steps:
      if self.stop_requested:
        raise KeyboardInterrupt
      batch = self.to_global(to_numpy(next(self.train_iter)))
      self.timer.before_step(step)
      self.state, step_metrics = self.compiled(self.state, batch)
      step = self.step = step + 1
      metrics.append(step_metrics)
      if limit is not None and len(metrics) >= limit:  # at most limit - 1 earlier steps unfinished
        jax.block_until_ready(metrics[-limit]["loss"])
      if not (log(step) or evaluate_now(step) or checkpoint_now(step)):
        continue
      metrics = jax.device_get(metrics)
      jax.block_until_ready(self.state)
      self.timer.close(step)
      self._check_and_log(step, metrics, log(step))
      metrics, limit = [], self._max_in_flight()
      if evaluate_now(step):
        self._validate(step)
      if checkpoint_now(step):
        self._save_last(step)
      self.timer.reopen(step)

  def _check_and_log(self, step: int, metrics: list[dict], log: bool) -> None:
    losses = [float(m["loss"]) for m in metrics]
    loss = float(np.mean(losses))
    if not math.isfinite(losses[0]) and step - len(metrics) == 0:
      raise TrainingError(self._nan_before_update(losses[0]))
    if not math.isfinite(loss):
      raise TrainingError(f"loss became {loss} by step {step} (learning rate "
                          f"{float(self.schedule(step)):.3g}); lower optimizer.learning_rate or set "
                          "optimizer.grad_clip_norm")
    if not log:
      return
    accuracy = float(np.mean([m["accuracy"] for m in metrics]))
    logging.info("step %d: loss %.4f, accuracy %.4f, %.2f steps/s", step, loss, accuracy,
                 self.timer.steps / max(self.timer.seconds, 1e-9))
    if self.writer:
      self.writer.scalar("train/loss", loss, step)
      self.writer.scalar("train/accuracy", accuracy, step)
      self.writer.scalar("train/learning_rate", float(self.schedule(step)), step)
      self.writer.flush()

  def _nan_before_update(self, loss: float) -> str:
    """The NaN message when step 1's loss (the initial parameters: no update yet) is not finite."""
    name = self.config.model.attention
    module = attention_zoo.layer_defining_module(name)
    plugin = "" if module.startswith("attention_zoo.") else f" --plugin {module}"
    layer = type(attention_zoo.layer_config(name)).noun
    return (f"loss is {loss} at step 1, before any parameter update: the model produced it from its "
            f"initial parameters, so the learning rate is not the cause; check the {layer} "
            f"{name!r} with: lra-bench check {name}{plugin}")

  def _validate(self, step: int) -> None:
    val = self.evaluate("validation", self.state.params, self.state.model_state, self.config.num_eval_batches)
    logging.info("step %d: validation accuracy %.4f, loss %.4f", step, val["accuracy"], val["loss"])
    if self.writer:
      self.writer.scalar("eval/accuracy", val["accuracy"], step)
      self.writer.scalar("eval/loss", val["loss"], step)
    if val["accuracy"] > self.best_val:
      self.best_val, self.best_step = val["accuracy"], step
      self.checkpoints.save_best(step, self.state)

  def _save_last(self, step: int) -> None:
    self.checkpoints.save_last(step, self.state, {
        "best_val_accuracy": self.best_val, "best_step": self.best_step,
        "train_seconds": self.timer.seconds, "timed_steps": self.timer.steps,
        "wall_seconds": self.wall_seconds()}, self.iterator_ckpt)
    self.saved_step = step

  def test(self) -> dict[str, Any]:
    """Test accuracy of the best-validation and of the last parameters; the run's measurements."""
    best, best_step = self.checkpoints.restore_best(self.state, self.best_step), self.best_step
    if best is None:  # no eval happened (e.g. zero steps): evaluate the current parameters
      best_step = int(self.state.step)
    test_last = self.evaluate("test", self.state.params, self.state.model_state)
    # Best step = last step: the same parameters (restored above all the same, so a damaged best
    # checkpoint is still reported), evaluated once.
    test_best = (test_last if best_step == int(self.state.step)
                 else self.evaluate("test", best["params"], best["model_state"]))
    logging.info("test accuracy %.4f (best-validation params, step %d), %.4f (last params)",
                 test_best["accuracy"], best_step, test_last["accuracy"])
    curve = None
    if self.writer:
      self.writer.scalar("test/accuracy", test_best["accuracy"], int(self.state.step))
      self.writer.close()
      curve = validation_curve(self.workdir, last_step=int(self.state.step))
    return {**self._measurements(test_best, test_last, best_step), **({"val_curve": curve} if curve else {})}

  def _measurements(self, test_best: dict, test_last: dict, best_step: int) -> dict[str, Any]:
    c, speed = self.config, self.timer.steps_per_second
    return {
        "test_accuracy": test_best["accuracy"], "test_accuracy_last": test_last["accuracy"],
        **({"metric": "macro", "test_accuracy_micro": test_best["accuracy_micro"]} if "metric" in test_best else {}),
        "test_loss": test_best["loss"],  # mean over the labels (cross-entropy; the L1 of a pixel pretraining)
        "test_examples": test_best["examples"], "test_labels": test_best["count"],
        "best_val_accuracy": self.best_val, "best_step": best_step,
        "train_steps": int(self.state.step), "num_params": self.num_params, "steps_per_second": speed,
        "examples_per_second": speed * c.batch_size if speed else None,
        "compile_seconds": self.compile_seconds, "num_devices": self.mesh.size,
        "num_processes": jax.process_count(), "per_device_batch_size": self.layout["per_device_batch_size"],
        "accumulate_steps": c.accumulate_steps, "precision": c.precision, **steps.precision_fields(c),
        "attention_implementation": self.attention_implementation,
        "wall_seconds": self.wall_seconds(), "peak_memory_bytes": xla_stats.peak_memory_bytes(),
        "compiled_memory_bytes": self.analysis["compiled_memory_bytes"],
        "compiled_temp_bytes": self.analysis["temp_bytes"], "flops_per_step": self.analysis["flops"],
        "data": self.data.stats(),
        **({"transferred_params": self.transferred["params"], "fresh_params": self.transferred["fresh_params"]}
           if self.transferred else {}),
    }


def validation_curve(workdir: str, tag: str = "eval/accuracy", last_step: int | None = None) -> list[list[float]]:
  """[[step, validation accuracy], ...] of the run in ``workdir``, read from its TensorBoard events (every
  start of the run appends a file), up to ``last_step``. A step evaluated twice (after a resume, the steps
  since the last checkpoint run again) keeps its latest value. An unreadable event file is skipped with a
  warning: the curve is a record field for the report, not a result."""
  import glob

  from tensorboard.backend.event_processing import event_file_loader
  from tensorboard.util.tensor_util import make_ndarray
  points: dict[int, tuple[float, float]] = {}
  for path in sorted(glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))):
    try:
      for event in event_file_loader.EventFileLoader(path).Load():
        for value in event.summary.value:
          if value.tag != tag:
            continue
          number = (float(np.asarray(make_ndarray(value.tensor)))
                    if value.HasField("tensor") else float(value.simple_value))
          if event.step not in points or event.wall_time >= points[event.step][1]:
            points[int(event.step)] = (number, event.wall_time)
    except Exception as err:  # noqa: BLE001 - a damaged events file costs the curve, not the run
      logging.warning("validation curve: skipped %s (%s: %s)", path, type(err).__name__, err)
  return [[step, round(points[step][0], 6)] for step in sorted(points) if last_step is None or step <= last_step]


class ScalarWriter:
  """TensorBoard scalars written with the ``tensorboard`` package alone (no TensorFlow, which
  ``flax.metrics.tensorboard`` imports): the loop writes only scalars. Read back by ``validation_curve``
  and by TensorBoard (tests/test_curves.py)."""

  def __init__(self, logdir: str):
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    self._writer = EventFileWriter(logdir)

  def scalar(self, tag: str, value: float, step: int) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2

    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))])
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def _summary_writer(workdir: str) -> ScalarWriter | None:
  """A TensorBoard writer on process 0 (None elsewhere, or where the tensorboard package is missing:
  then the record carries no validation curve)."""
  if jax.process_index() != 0:
    return None
  try:
    return ScalarWriter(os.path.join(workdir, "tensorboard"))
  except ImportError:
    logging.warning("the tensorboard package is not installed: no TensorBoard events and no validation "
                    "curve in the record (pip install tensorboard)")
    return None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, data_dir: str, devices=None, *,
                       objective: objectives_lib.Objective | None = None, init_from=None) -> dict[str, Any]:
  """Trains ``config`` in ``workdir`` (resuming if a checkpoint is there); returns its measurements.

  Data-parallel over ``devices`` (default: every device of every process; see ``parallel``). ``config``
  comes from ``config.load_config``, which validated it. ``objective`` / ``init_from``: ``Run``'s (the
  self-pretraining's two runs: ``lra_bench.experiments.cell``).
  """
  stop = StopFlag()
  with stop.installed():  # from the start: a Ctrl-C while the run sets up is kept (StopFlag)
    run = Run(config, workdir, data_dir, devices, objective=objective, init_from=init_from, stop=stop)
    run.train()
  return run.test()
