"""Efficiency benchmark: the LRA Table 2 setting swept over sequence length, one record per point.

The model is the one ``lra-bench train --task text --protocol lra`` trains (``tasks.get_task("text")``
and the ``lra`` config: 4 layers, emb 256, 4 heads, qkv 256, mlp 1024, byte vocabulary 257, 2 classes,
CLS pooling), on random byte tokens. ``mode="train"`` measures the real ``steps.train_step`` (AdamW,
dropout on: forward + backward + update); ``mode="inference"`` measures ``steps.eval_step`` (forward
only, as the Combiner paper's Fig. 3); ``mode="core"`` measures the attention core alone, forward +
backward, at the shapes that model gives it (``measure_core``): without the length-linear projections
and MLP, the core's own scaling in L; ``mode="core_forward"`` measures that core's forward alone, the same
call with the same inputs (``deterministic=False``, attention dropout on, as ``core`` differentiates it), so
a core's forward and forward + backward times are of one function. On a CPU its cost is mostly XLA
compilation (one program per point).

For every (attention, length) point:
- XLA FLOPs and compiled memory come from ``jit(...).lower(...).compile()`` (deterministic; nothing is
  allocated for them: the state is abstract when ``compile_only``);
- the step time is measured over ``repeats`` single steps after ``warmup_steps`` (compile and warm-up
  excluded, ``block_until_ready`` before the clock stops); the record keeps every time, the median and
  the quartiles;
- memory, as separate fields that mean the same on every machine: ``compiled_memory_bytes`` is XLA's
  estimate for the compiled step (every backend, also for compile-only points); ``peak_memory_bytes``
  is the device's measured peak (``memory_stats()["peak_bytes_in_use"]``), None where the backend
  reports none (CPU) or where it cannot be told apart from an earlier point's (see ``device_peak``);
  ``peak_rss_bytes`` is the host process's peak resident memory (isolated points only);
- what ran: ``compute_dtype`` and ``matmul_precision`` (``precision="auto"`` resolved on the device),
  ``attention_implementation`` (``flash``: its kernel, checked in the compiled program) and ``attention_dropout``;
  on a GPU (``FUSED_KERNEL_BACKENDS``) ``flash`` is timed without attention dropout in modes train, core
  and core_forward (every mode that runs dropout), since the fused kernels have none (with it the explicit
  path would be timed), and its record says 0;
- running out of memory is a data point (status ``oom``), and so is any other failure (``failed``, e.g.
  a timeout); once an attention runs out of memory, its longer lengths are recorded as ``oom`` unrun.

Each point runs in a fresh subprocess by default, so one point's peak memory cannot leak into the next
(JAX's peak counter is per process) and a crash or a hang (``timeout_s``) only costs that point.
Records have ``kind="bench"``, ``protocol="bench"``, ``task="text"`` and ``max_length = length``; the
device kind and the settings are part of the config hash, so a point already measured on this device
with the same settings is not measured again (a killed sweep resumes).

  lra-bench bench --lengths 1024,2048,4096 --attentions vanilla --batch_size 32 --results_dir results/bench
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import TYPE_CHECKING, Any, Sequence

from lra_bench import REPO_ROOT
from lra_bench.experiments import grid

if TYPE_CHECKING:
  import ml_collections

# This module imports only the standard library at its top (the rest where it is used): the CLI's parser
# reads ``MODES`` before any command runs.
# bench.mode: the model's train step (forward, backward, update), its forward only, the attention core
# alone (forward + backward), or the attention core alone, forward only
MODES = ("train", "inference", "core", "core_forward")
CORE_MODES = ("core", "core_forward")  # the attention core (or a sequence mixer) alone: ``measure_core``
DEFAULT_LENGTHS = (1024, 2048, 3072, 4096, 8192, 16384)


TASK = "text"       # LRA Table 2 measured the Text task's model
PROTOCOL = "lra"    # ... with its LRA config (configs/lra.py: 4 layers, emb 256, 4 heads, qkv 256, mlp 1024)


def bench_config(attention: str, length: int, *, batch_size: int = 32, mode: str = "train",
                 warmup_steps: int = 2, repeats: int = 10, compile_only: bool = False,
                 device_kind: str = "", overrides: Sequence[str] = (),
                 kwargs_of: str | None = None) -> ml_collections.ConfigDict:
  """The locked config of one point: the ``lra`` protocol's Text config at ``length`` and ``batch_size``.

  ``kwargs_of``: a protocol whose per-attention settings (its ``attention_settings``) give each layer its
  ``model.attention_kwargs.*`` (only those: the model, its size and its training stay the benchmark's), so
  a layer is timed in the form that protocol trains it in (``cpu``: the modern recurrences' token-by-token
  form, ``configs/cpu.py`` ``RECURRENT_ON_CPU``). Without it, the encoder settings only (a one-way mixer
  runs bidirectional)."""
  import ml_collections

  from configs import _sequence_models
  from lra_bench.training import config as config_lib

  if mode not in MODES:
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
  if kwargs_of is not None and kwargs_of not in config_lib.list_protocols():
    raise config_lib.ConfigError(f"--kwargs_of {kwargs_of!r}: no such protocol; known protocols: "
                                 f"{', '.join(config_lib.list_protocols())}")

  def extend(c: ml_collections.ConfigDict) -> None:
    c.protocol = "bench"
    c.data.max_length = length
    c.batch_size = batch_size            # LRA Table 2 used 32
    c.bench = ml_collections.ConfigDict()
    c.bench.mode = mode
    c.bench.warmup_steps = warmup_steps  # untimed steps after compilation
    c.bench.repeats = repeats            # timed single steps (median and quartiles are reported)
    c.bench.compile_only = compile_only  # FLOPs and compiled memory only; no step is run
    c.bench.device_kind = device_kind    # part of the hash: a point is measured once per device kind
    _length_bound(c, length + (1 if c.model.pooling == "CLS" else 0))
    if attention == "flash" and mode != "inference" and fused_kernel_device():
      # the fused kernels have no attention dropout (attention_zoo/flash.py): with it, flash would time the
      # explicit path; the record's attention_dropout says 0 ran (overrides still win). Every mode but
      # inference runs dropout (core_forward too: deterministic=False, as core), so core and core_forward
      # time the same flash
      c.model.attention_dropout_rate = 0.0
    if kwargs_of is None:
      # a one-way mixer (lru) runs bidirectional, the encoder setting of every attention timed here
      config_lib.apply_settings(c, _sequence_models.encoder_settings(c))
    else:
      settings = config_lib.protocol_settings(kwargs_of, c)
      config_lib.apply_settings(c, {k: v for k, v in settings.items() if k.startswith("model.attention_kwargs.")})

  return config_lib.load_config(PROTOCOL, TASK, overrides, attention=attention, extend=extend,
                                checks=[validate_bench])


def _length_bound(c: ml_collections.ConfigDict, positions: int) -> None:
  """A layer whose config bounds the length it accepts (Mega's relative bias: ``max_positions``) is built
  for the point's length, as its LRA configs build it for the task's, unless that bound is already larger."""
  import dataclasses

  import attention_zoo

  try:
    config = attention_zoo.layer_config(c.model.attention)
  except (TypeError, ValueError):
    return  # an unknown name: load_config reports it
  bound = getattr(config, "max_positions", None)
  if isinstance(bound, int) and "max_positions" in {f.name for f in dataclasses.fields(config)} and bound < positions:
    c.model.attention_kwargs.max_positions = positions


def validate_bench(config: ml_collections.ConfigDict) -> None:
  """The ``bench`` section (``load_config``'s check of the section ``bench_config`` adds): ConfigError
  naming the key, the value and what is allowed."""
  from lra_bench.training.values import INT, check_choice, check_number, fail

  check_number("bench.warmup_steps", config.bench.warmup_steps, INT, 0, None, ">= 0")
  check_number("bench.repeats", config.bench.repeats, INT, 1, None, ">= 1")
  check_choice("bench.mode", config.bench.mode, MODES)
  if not isinstance(config.bench.compile_only, bool):
    fail("bench.compile_only", config.bench.compile_only, "True or False")


# ----------------------------------------------------------------------------------------------------
# One point (runs in the worker process)


def device_peak(before: int | None, after: int | None) -> int | None:
  """This point's device peak from the process's peak counter read before and after it.

  The counter only grows and cannot be reset, so in a process that already ran a point the value
  belongs to this point only if the point raised it; otherwise this point's own peak is unknown (None),
  never an earlier point's number. A fresh process per point (the default) starts from 0.
  """
  if after is None or (before is not None and after <= before):
    return None
  return after


def time_steps(step, args, *, warmup_steps: int, repeats: int) -> list[float]:
  """Seconds of each of ``repeats`` calls of ``step``, after ``warmup_steps`` untimed ones.

  ``step(args) -> (next args, outputs)``. The clock stops once the outputs are ready
  (``jax.block_until_ready``): a jitted call returns as soon as its work is dispatched, so without it
  the time would be the dispatch's, not the computation's.
  """
  import jax

  for _ in range(warmup_steps):
    args, outputs = step(args)
    jax.block_until_ready(outputs)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    args, outputs = step(args)
    jax.block_until_ready(outputs)
    times.append(time.perf_counter() - start)
  return times


# Backends with a fused attention kernel (cuDNN, Pallas/Triton): a flash point there is timed without attention
# dropout (``bench_config``).
FUSED_KERNEL_BACKENDS = ("gpu",)


def fused_kernel_device() -> bool:
  """Whether this process's backend has a fused attention kernel (``FUSED_KERNEL_BACKENDS``)."""
  from lra_bench.training import steps

  return steps.backend() in FUSED_KERNEL_BACKENDS


def what_ran(config: ml_collections.ConfigDict, *, training: bool, compiled=None) -> dict[str, Any]:
  """The record fields that say how a point computed: ``compute_dtype``, ``matmul_precision`` and, for
  ``flash``, ``attention_implementation`` (``models.attention_implementation``, checked against the compiled
  program's text)."""
  from lra_bench.training import models, steps

  return {**steps.precision_fields(config), "attention_implementation": models.attention_implementation(
      config.model, steps.compute_dtype(config), training=training, compiled=compiled)}


def measure(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Compiles (and unless ``compile_only`` times) one point; raises on failure."""
  import jax
  import numpy as np

  import tasks as tasks_lib
  from lra_bench.training import objectives, optim, steps, xla_stats

  if config.bench.mode in CORE_MODES:
    import attention_zoo

    probe = type(attention_zoo.layer_config(config.model.attention)).probe_inputs
    return measure_core(config) if "value" in probe else measure_mixer(config)
  peak_before = xla_stats.peak_memory_bytes()
  task = tasks_lib.get_task(config.task)
  b, length, mode = config.batch_size, config.data.max_length, config.bench.mode
  objective = objectives.select(config)  # the task's: a classifier (bench tasks classify)
  model = objective.create_model()
  tx = optim.make_optimizer(config.optimizer)
  rng = np.random.default_rng(0)
  batch = {"inputs": rng.integers(1, task.vocab_size, (b, length), dtype=np.int32),
           "targets": rng.integers(0, task.num_classes, (b,), dtype=np.int32)}
  example = {k: v[:2] for k, v in batch.items()}
  if config.bench.compile_only:
    state = jax.eval_shape(steps.state_initializer(config, model, tx, example))
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)
  else:
    state = steps.init_state(config, model, tx, example)
  num_params = int(sum(np.prod(x.shape) for x in jax.tree.leaves(state.params)))

  if mode == "train":
    fn = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, terms=objective.terms), donate_argnums=0)
    args = (state, batch)
  else:
    fn = jax.jit(functools.partial(steps.eval_step, model=model, terms=objective.terms))
    weights = np.ones((b,), np.float32)
    batch["weights"] = jax.ShapeDtypeStruct(weights.shape, weights.dtype) if config.bench.compile_only \
        else weights
    args = (state.params, state.model_state, batch)
  start = time.perf_counter()
  compiled = fn.lower(*args).compile()
  out = {"compile_seconds": time.perf_counter() - start, "num_params": num_params,
         **what_ran(config, training=mode == "train", compiled=compiled)}
  analysis = xla_stats.cost_analysis(compiled)
  out.update(flops_per_step=analysis["flops"], compiled_memory_bytes=analysis["compiled_memory_bytes"],
             compiled_temp_bytes=analysis["temp_bytes"])
  if config.bench.compile_only:
    return out

  def step(args):  # train: the next step takes the new state (the old one is donated)
    result = compiled(*args)
    return ((result[0], batch) if mode == "train" else args), result

  times = time_steps(step, jax.device_put(args), warmup_steps=config.bench.warmup_steps,
                     repeats=config.bench.repeats)
  out.update(_timing(times, b, length), peak_memory_bytes=device_peak(peak_before, xla_stats.peak_memory_bytes()))
  return out


# ----------------------------------------------------------------------------------------------------
# The attention core alone (modes "core" and "core_forward")


def core_shape(config: ml_collections.ConfigDict) -> tuple[int, int, int, int]:
  """(B, L, H, D) of the core's query, key and value in the model of ``config``: the batch, the length,
  the heads and the head dim (qkv_dim / heads) of its ``MultiHeadAttention``. The model prepends a CLS
  token with CLS pooling (its core sees L + 1 positions); the core modes time exactly L."""
  heads, qkv_dim = config.model.num_heads, config.model.qkv_dim
  if qkv_dim % heads:
    raise ValueError(f"qkv_dim {qkv_dim} is not divisible by num_heads {heads}")
  return config.batch_size, config.data.max_length, heads, qkv_dim // heads


def create_core(config: ml_collections.ConfigDict):
  """The core of ``config`` as ``models.MultiHeadAttention`` creates it: its attention dropout and the
  protocol's per-attention settings (``model.attention_kwargs``)."""
  import attention_zoo

  return attention_zoo.create_attention(config.model.attention, dropout_rate=config.model.attention_dropout_rate,
                                        **dict(config.model.attention_kwargs))


# The last core initialised in this process, reused by the next point of the same core (same config, batch,
# heads, dtype and seed) when its variables have the same shapes: most cores' parameters do not depend on
# L, so a sweep initialises them once instead of once per length (their values only feed the timed program,
# whose cost does not depend on them). One entry: a sweep holds at most one core's variables at a time.
_INIT_CACHE: dict[str, Any] = {}


def _core_variables(core, key: tuple, abstract, init):
  """The core's variables: ``{}`` for a core without any (most: no initialisation at all), else the
  cached ones when ``key`` and the shapes ``abstract`` match, else ``init()`` (cached)."""
  import jax

  if not abstract:
    return {}
  shapes = jax.tree.map(lambda x: (x.shape, str(x.dtype)), abstract)
  if _INIT_CACHE.get("key") == (key, shapes):
    return _INIT_CACHE["variables"]
  _INIT_CACHE.clear()
  variables = init()
  _INIT_CACHE.update(key=(key, shapes), variables=variables)
  return variables


def _core_call(core, params, q, k, v, state, mask, rngs):
  """The core's call as the train step runs it: ``(out [B, L, H, D], updated collections)`` with
  ``deterministic=False``, the ``dropout`` and ``attention`` streams ``rngs``, the non-trainable collections
  (``state``, e.g. EMA centroids) and the sown auxiliary losses mutable."""
  from lra_bench.training import steps

  return core.apply({"params": params, **state}, q, k, v, mask=mask, deterministic=False, rngs=rngs,
                    mutable=[*state, steps.AUX_LOSSES])


def core_step(core):
  """The jittable forward + backward of ``core``: ``fn(params, q, k, v, state, mask, cotangent, rngs) ->
  (grads of sum(out * cotangent) w.r.t. (params, q, k, v), new state)``, as the train step runs it
  (``_core_call``), the non-trainable collections carried, sown auxiliary losses added to the objective."""
  import jax
  import jax.numpy as jnp

  from lra_bench.training import steps

  def objective(params, q, k, v, state, mask, cotangent, rngs):
    out, updated = _core_call(core, params, q, k, v, state, mask, rngs)
    loss = steps.with_aux_losses(jnp.sum(out.astype(jnp.float32) * cotangent), updated)
    return loss, {name: updated[name] for name in state}

  return jax.grad(objective, argnums=(0, 1, 2, 3), has_aux=True)


def core_forward_step(core):
  """The jittable forward of ``core``, the call ``core_step`` differentiates (``_core_call``: the same
  ``deterministic=False``, streams and collections): ``fn(params, q, k, v, state, mask, rngs) -> (out
  [B, L, H, D], new state, sown auxiliary losses)``. Returning the losses keeps their computation in the
  program; only the objective's sum(out * cotangent), O(B·L·H·D), is not part of the forward."""
  from lra_bench.training import steps

  def forward(params, q, k, v, state, mask, rngs):
    out, updated = _core_call(core, params, q, k, v, state, mask, rngs)
    return out, {name: updated[name] for name in state}, updated.get(steps.AUX_LOSSES, {})

  return forward


def measure_core(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The attention core alone at the shapes the model gives it: forward + backward (``core_step``) in mode
  ``core``, its forward only (``core_forward_step``) in mode ``core_forward``.

  q, k, v and the cotangent are N(0, 1) [B, L, H, D] in the compute dtype (``precision``), the mask all
  true, the streams ``dropout`` and ``attention`` fixed keys; the core's variables come from its own
  ``init`` (compiled; skipped for a core without variables, reused across lengths when their shapes do not
  change). Both modes draw the same q, k, v (the forward takes no cotangent). One program is compiled per
  point: its XLA FLOPs and compiled memory are the point's, and unless ``compile_only`` it is timed as the
  model's step is (``time_steps``)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from lra_bench.training import steps, xla_stats

  peak_before = xla_stats.peak_memory_bytes()
  b, length, heads, head_dim = core_shape(config)
  dtype = steps.compute_dtype(config)
  core = create_core(config)
  shape = (b, length, heads, head_dim)
  keys = jax.random.split(jax.random.key(config.seed), 3)
  rngs = {"dropout": keys[1], "attention": keys[2]}
  spec = jax.ShapeDtypeStruct(shape, dtype)
  mask_spec = jax.ShapeDtypeStruct((b, length), jnp.bool_)

  def init(q, k, v, mask):
    variables = dict(core.init({"params": keys[0], **rngs}, q, k, v, mask=mask, deterministic=True))
    variables.pop(steps.AUX_LOSSES, None)  # per-call outputs, not state
    return variables

  abstract = jax.eval_shape(init, spec, spec, spec, mask_spec)
  if config.bench.compile_only:
    q = k = v = cotangent = spec
    mask, variables, init_seconds = mask_spec, abstract, None
  else:
    rng = np.random.default_rng(config.seed)
    q, k, v, cotangent = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for _ in range(4))
    mask = jnp.ones((b, length), bool)
    cache_key = (repr(core.config), (b, heads, head_dim), str(dtype), config.seed)  # not L: see _INIT_CACHE
    start = time.perf_counter()
    variables = _core_variables(core, cache_key, abstract,
                                lambda: jax.block_until_ready(jax.jit(init)(q, k, v, mask)))
    init_seconds = time.perf_counter() - start
  variables = dict(variables)
  params = variables.pop("params", {})
  num_params = int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
  if _forward_only(config):
    step, args = core_forward_step(core), (params, q, k, v, variables, mask, rngs)
  else:
    step, args = core_step(core), (params, q, k, v, variables, mask, cotangent, rngs)
  # init_seconds: making the core's variables (~0: it has none, or an earlier length made them)
  return _compile_and_time(config, step, args, "core", init_seconds=init_seconds, num_params=num_params,
                           peak_before=peak_before)


def _forward_only(config: ml_collections.ConfigDict) -> bool:
  """Whether a point of ``CORE_MODES`` times the forward alone (``core_forward``) or forward + backward."""
  return config.bench.mode == "core_forward"


def _compile_and_time(config: ml_collections.ConfigDict, step, args, what: str, *, init_seconds, num_params: int,
                      peak_before) -> dict[str, Any]:
  """Compiles ``step(*args)`` (one point of ``CORE_MODES``: a core's or a mixer's forward + backward, or its
  forward alone), records its XLA FLOPs and compiled memory, and unless ``compile_only`` times it
  (``time_steps``)."""
  import jax

  from lra_bench.training import xla_stats

  b, length = config.batch_size, config.data.max_length
  start = time.perf_counter()
  compiled = jax.jit(step).lower(*args).compile()
  # training=True: both modes call the core with deterministic=False (attention dropout on)
  out = {"compile_seconds": time.perf_counter() - start, "init_seconds": init_seconds, "num_params": num_params,
         **what_ran(config, training=True, compiled=compiled)}
  analysis = xla_stats.cost_analysis(compiled)
  out.update(flops_per_step=analysis["flops"], compiled_memory_bytes=analysis["compiled_memory_bytes"],
             compiled_temp_bytes=analysis["temp_bytes"])
  if config.bench.compile_only:
    return out
  direction = "forward" if _forward_only(config) else "forward + backward"
  xla_stats.check_fits(compiled, f"the {config.model.attention} {what}'s {direction} at length {length}",
                       "run a shorter length or a smaller --batch_size, or --compile_only_from this length")
  times = time_steps(lambda a: (a, compiled(*a)), args, warmup_steps=config.bench.warmup_steps,
                     repeats=config.bench.repeats)
  return dict(out, **_timing(times, b, length), peak_memory_bytes=device_peak(peak_before,
                                                                                xla_stats.peak_memory_bytes()))


def measure_mixer(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Modes ``core`` / ``core_forward`` for a sequence mixer: the mixer layer alone (it owns its projections),
  as the train step runs it: x and a cotangent N(0, 1) [B, L, emb_dim] in the compute dtype, an all-true
  mask, ``deterministic=False`` with a ``dropout`` key; ``core``: the gradient of sum(out · cotangent) w.r.t.
  the mixer's parameters and x; ``core_forward``: that call's forward alone (out and the new state). Records
  the same fields as ``measure_core``."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  import attention_zoo
  from lra_bench.training import steps, xla_stats

  peak_before = xla_stats.peak_memory_bytes()
  b, length, width = config.batch_size, config.data.max_length, config.model.emb_dim
  dtype = steps.compute_dtype(config)
  mixer = attention_zoo.create_layer(config.model.attention, **{"dropout_rate": config.model.dropout_rate,
                                                                **dict(config.model.attention_kwargs)})
  gated = type(mixer.config).gated_residual
  keys = jax.random.split(jax.random.key(config.seed), 2)
  shape = (b, length, width)
  spec, mask_spec = jax.ShapeDtypeStruct(shape, dtype), jax.ShapeDtypeStruct((b, length), jnp.bool_)

  def call(variables, x, mask, **kw):
    return mixer.apply(variables, x, mask, **({"residual": x} if gated else {}), **kw)

  def init(x, mask):
    return mixer.init({"params": keys[0], "dropout": keys[1]}, x, mask, deterministic=True,
                      **({"residual": x} if gated else {}))

  def forward(params, x, state, mask, rng):
    out, updated = call({"params": params, **state}, x, mask, deterministic=False, rngs={"dropout": rng},
                        mutable=list(state))
    return out, {n: updated[n] for n in state}

  def objective(params, x, state, mask, cotangent, rng):
    out, new_state = forward(params, x, state, mask, rng)
    return jnp.sum(out.astype(jnp.float32) * cotangent), new_state

  abstract = jax.eval_shape(init, spec, mask_spec)
  if config.bench.compile_only:
    x = cotangent = spec
    mask, variables, init_seconds = mask_spec, dict(abstract), None
  else:
    rng = np.random.default_rng(config.seed)
    x, cotangent = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for _ in range(2))
    mask = jnp.ones((b, length), bool)
    start = time.perf_counter()
    variables = dict(jax.block_until_ready(jax.jit(init)(x, mask)))
    init_seconds = time.perf_counter() - start
  params = variables.pop("params", {})
  num_params = int(sum(np.prod(p.shape) for p in jax.tree.leaves(params)))
  if _forward_only(config):
    step, args = forward, (params, x, variables, mask, keys[1])
  else:
    step, args = jax.grad(objective, argnums=(0, 1), has_aux=True), (params, x, variables, mask, cotangent, keys[1])
  return _compile_and_time(config, step, args, "mixer", init_seconds=init_seconds, num_params=num_params,
                           peak_before=peak_before)


def _timing(times: Sequence[float], batch_size: int, length: int) -> dict[str, Any]:
  """The record's time fields of ``times`` (seconds per step): every time, median, quartiles, rates."""
  import numpy as np

  q25, median, q75 = (float(v) for v in np.percentile(times, [25, 50, 75]))
  return dict(step_seconds=list(times), step_seconds_median=median, step_seconds_q25=q25,
              step_seconds_q75=q75, steps_per_second=1.0 / median, examples_per_second=batch_size / median,
              tokens_per_second=batch_size * length / median)


def measure_safely(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """``measure`` with failures as data: ``{"status": "ok"|"oom"|"failed", "error", ...}``."""
  from lra_bench.experiments import cell
  from lra_bench.training import xla_stats

  try:
    out = dict(measure(config), status="ok")
  except Exception as err:  # noqa: BLE001 - every failure is a data point
    logging.debug("bench point failed:\n%s", traceback.format_exc())
    status, error = cell.outcome(err)
    out = {"status": status, "error": error}
  out["peak_rss_bytes"] = xla_stats.host_peak_rss_bytes()
  return out


def _worker_main(argv: Sequence[str]) -> int:
  """``python -m lra_bench.experiments.bench SPEC.json OUT.json`` (what ``run_point`` starts)."""
  import ml_collections

  from lra_bench.experiments import results

  with open(argv[0]) as f:
    spec = json.load(f)
  config = ml_collections.ConfigDict(spec["config"])
  results.write_json_atomic(argv[1], measure_safely(config))
  return 0


def run_point(config: ml_collections.ConfigDict, *, isolate: bool = True,
              timeout_s: float | None = None) -> dict[str, Any]:
  """Measures one point, in a fresh subprocess unless ``isolate`` is False."""
  from lra_bench.experiments import cell, processes, results

  if not isolate:
    # The host RSS peak is per process: in-process it would carry every earlier point's peak.
    return dict(measure_safely(config), peak_rss_bytes=None)
  with tempfile.TemporaryDirectory(prefix="lra-bench-point-") as tmp:
    spec, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
    results.write_json_atomic(spec, {"config": config.to_dict()})
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
    try:
      with processes.forking():  # a killed sweep leaves no point running
        proc = subprocess.run([sys.executable, "-m", "lra_bench.experiments.bench", spec, out], env=env,
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
                              preexec_fn=processes.die_with_parent())
    except subprocess.TimeoutExpired:
      return {"status": "failed", "error": f"timeout: the point took longer than {timeout_s:g} s"}
    if os.path.exists(out):
      with open(out) as f:
        return json.load(f)
    status, error = cell.subprocess_outcome(proc.returncode, (proc.stderr or "")[-1500:])
    return {"status": status, "error": error}


# ----------------------------------------------------------------------------------------------------
# The sweep


@dataclasses.dataclass
class BenchSummary:
  counts: dict[str, int] = dataclasses.field(default_factory=dict)
  done_before: int = 0
  records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  seconds: float = 0.0
  workers: list[str] = dataclasses.field(default_factory=list)  # side-by-side workers: a line each (log, exit)

  def lines(self) -> list[str]:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items())) or "nothing to run"
    return [f"bench finished in {self.seconds:.0f} s: {counts}; {self.done_before} already measured",
            *self.workers]


@dataclasses.dataclass
class Point:
  """One planned point: its config, its key in the records and the name it is shown under."""

  config: Any  # ml_collections.ConfigDict
  key: tuple

  @property
  def name(self) -> str:
    return f"{self.config.model.attention} L={self.config.data.max_length}"


class SweepProgress:
  """The benchmark's progress on the console (``tasks.progress.Progress``): points done / total across every
  worker, the point each worker measures now, and the time left from the points measured so far: each
  remaining point costs the mean wall time of this run's points at its length (the mean of all of them at
  a length not measured yet), a worker's remaining points add up, and the workers run side by side (the
  slowest one's sum). Elsewhere than a terminal: one line per measured point."""

  def __init__(self, queues: Sequence[Sequence[Point]], desc: str, enabled: bool = True):
    from tasks.progress import Progress

    self.queues = [list(q) for q in queues]
    self.done: dict[tuple, tuple[str, float | None]] = {}  # key -> (status, wall seconds)
    self.current: dict[int, tuple[tuple, float]] = {}  # worker -> (key of its point, since)
    self.bar = Progress(sum(map(len, self.queues)), desc, "points", remaining=self.seconds_left,
                        enabled=enabled)

  def measured(self, key: tuple, status: str, seconds: float | None) -> None:
    if key in self.done:
      return
    self.done[key] = (status, seconds)
    point = next(p for q in self.queues for p in q if p.key == key)
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    self.bar.advance(note=f"{point.name} {status}{took}")
    self.show()

  def show(self) -> None:
    """The point each worker measures now: the first of its queue without a record."""
    now, parts = time.monotonic(), []
    for w, queue in enumerate(self.queues):
      point = next((p for p in queue if p.key not in self.done), None)
      if point is None:
        self.current.pop(w, None)
        continue
      if self.current.get(w, (None,))[0] != point.key:
        self.current[w] = (point.key, now)
      parts.append((f"{point.name}" if len(self.queues) == 1 else f"w{w + 1} {point.name}", self.current[w][1]))
    if parts:
      self.bar.set_status(", ".join(text for text, _ in parts), min(since for _, since in parts))
    else:
      self.bar.set_status("")

  def seconds_left(self) -> float | None:
    times: dict[int, list[float]] = {}
    for key, (_, seconds) in self.done.items():
      if seconds is not None:
        length = next(p.config.data.max_length for q in self.queues for p in q if p.key == key)
        times.setdefault(length, []).append(seconds)
    if not times:
      return None
    overall = [t for ts in times.values() for t in ts]
    mean_all = sum(overall) / len(overall)
    now, left = time.monotonic(), 0.0
    for w, queue in enumerate(self.queues):
      total = 0.0
      for point in queue:
        if point.key in self.done:
          continue
        at = times.get(point.config.data.max_length)
        estimate = sum(at) / len(at) if at else mean_all
        if self.current.get(w, (None,))[0] == point.key:  # under way: what is left of it
          estimate = max(0.0, estimate - (now - self.current[w][1]))
        total += estimate
      left = max(left, total)
    return left

  def poll(self, results_dir: str, baseline: dict[tuple, int]) -> None:
    """The points with a record appended since the sweep was planned (``baseline``: records per key then)."""
    from lra_bench.experiments import results

    keys = {p.key for q in self.queues for p in q}
    seen: dict[tuple, int] = {}
    for record in results.load_records(results_dir):
      if record.get("kind") != "bench":
        continue
      key = results.run_key(record)
      if key in keys:
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > baseline.get(key, 0) and key not in self.done:
          if record["status"] != "ok":
            point = next(p for q in self.queues for p in q if p.key == key)
            self.bar.write(grid.failure_line(point.name, record), file=sys.stdout)
          self.measured(key, record["status"], record.get("wall_seconds"))
    self.show()

  def close(self) -> None:
    self.bar.close()


def run_bench(lengths: Sequence[int] = DEFAULT_LENGTHS, attentions: str | Sequence[str] = "all", *,
              results_dir: str, batch_size: int = 32, mode: str = "train", warmup_steps: int = 2,
              repeats: int = 10, compile_only: bool = False, compile_only_from: int | None = None,
              timeout_s: float | None = 600.0, isolate: bool = True, overrides: Sequence[str] = (),
              progress: bool = True, workers: int = 1, kwargs_of: str | None = None) -> BenchSummary:
  """Measures every (attention, length) point not yet measured on this device; returns a summary.

  ``compile_only_from``: lengths >= this are compiled only (FLOPs and compiled memory, no timing).
  ``workers`` > 1: the attentions are dealt (in turn, in registry order) to that many ``lra-bench bench``
  processes run side by side, each logging to ``<results_dir>/bench_worker<k>.log``, and this process
  shows their progress from the records (``sweep_workers``); a SIGTERM or Ctrl-C stops them all.
  ``kwargs_of``: time each layer in the form this protocol runs it (``bench_config``).
  """
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before this process touches a GPU
  import jax

  import attention_zoo
  from lra_bench.experiments import results

  start = time.perf_counter()
  names = grid.parse_names(attentions, attention_zoo.list_layers(), "attention")
  lengths = sorted(grid.parse_ints(lengths))
  device_kind = jax.devices()[0].device_kind
  summary = BenchSummary()
  records = results.load_records(results_dir)
  existing = results.latest_records(r for r in records if r.get("kind") == "bench")
  by_key = {results.run_key(r): r for r in existing}
  points = []
  for name in names:
    for length in lengths:
      only_compile = compile_only or (compile_only_from is not None and length >= compile_only_from)
      config = bench_config(name, length, batch_size=batch_size, mode=mode, warmup_steps=warmup_steps,
                            repeats=repeats, compile_only=only_compile, device_kind=device_kind,
                            overrides=overrides, kwargs_of=kwargs_of)
      points.append(Point(config, results.run_key(results.bench_key_fields(config))))

  todo = [p for p in points if by_key.get(p.key, {}).get("status") not in results.TERMINAL]
  summary.done_before = len(points) - len(todo)
  workers = max(1, min(workers, len(names)))
  if workers > 1 and todo:
    parts = [names[w::workers] for w in range(workers)]
    queues = [[p for p in todo if p.config.model.attention in part] for part in parts]
    argv = dict(lengths=lengths, batch_size=batch_size, mode=mode, warmup_steps=warmup_steps, repeats=repeats,
                compile_only=compile_only, compile_only_from=compile_only_from, timeout_s=timeout_s,
                isolate=isolate, overrides=overrides, results_dir=results_dir, kwargs_of=kwargs_of)
    summary.workers = sweep_workers(parts, queues, argv, f"bench {mode}", progress,
                                    baseline=_record_counts(records, {p.key for p in todo}))
    mine = [r for r in results.latest_records(r for r in results.load_records(results_dir) if r.get("kind") == "bench")
            if results.run_key(r) in {p.key for p in todo}]
    for record in mine:
      summary.records.append(record)
      summary.counts[record["status"]] = summary.counts.get(record["status"], 0) + 1
    summary.seconds = time.perf_counter() - start
    return summary
  oom_at: dict[str, int] = {r["attention"]: r["max_length"] for r in existing
                            if r["status"] == "oom" and not r["config"]["bench"]["compile_only"]
                            and r["config"]["bench"]["mode"] == mode and r["batch_size"] == batch_size}
  display = SweepProgress([todo], f"bench {mode}", enabled=progress)
  try:
    display.show()
    for point in todo:
      config = point.config
      name, length = config.model.attention, config.data.max_length
      if not config.bench.compile_only and name in oom_at and length > oom_at[name]:
        out = {"status": "oom", "error": f"not run: out of memory at length {oom_at[name]} already"}
      else:
        t0 = time.perf_counter()
        out = run_point(config, isolate=isolate, timeout_s=timeout_s)
        out["wall_seconds"] = time.perf_counter() - t0
      if out["status"] == "oom" and not config.bench.compile_only:
        oom_at[name] = min(length, oom_at.get(name, length))
      record = results.bench_record(config, **out)
      results.append_record(results_dir, record)
      summary.records.append(record)
      summary.counts[record["status"]] = summary.counts.get(record["status"], 0) + 1
      if record["status"] != "ok":
        display.bar.write(grid.failure_line(f"{name} L={length}", record), file=sys.stdout)
      display.measured(point.key, record["status"], out.get("wall_seconds"))
  finally:
    display.close()
  summary.seconds = time.perf_counter() - start
  return summary


def _record_counts(records: Sequence[dict], keys: set) -> dict[tuple, int]:
  """How many bench records each of ``keys`` has (a key with more later was measured since)."""
  from lra_bench.experiments import results

  counts = dict.fromkeys(keys, 0)
  for record in records:
    if record.get("kind") == "bench" and (key := results.run_key(record)) in counts:
      counts[key] += 1
  return counts


POLL_S = 2.0  # how often the side-by-side sweep's progress reads the records


def worker_command(attentions: Sequence[str], *, lengths, batch_size, mode, warmup_steps, repeats, compile_only,
                   compile_only_from, timeout_s, isolate, overrides, results_dir, kwargs_of=None) -> list[str]:
  """The ``lra-bench bench`` command of one side-by-side worker: the sweep's settings, its attentions."""
  return [sys.executable, "-m", "lra_bench", "bench", f"--attentions={','.join(attentions)}",
          f"--lengths={','.join(map(str, lengths))}", f"--batch_size={batch_size}", f"--mode={mode}",
          f"--warmup_steps={warmup_steps}", f"--repeats={repeats}",
          "--compile_only" if compile_only else "--nocompile_only",
          *([f"--compile_only_from={compile_only_from}"] if compile_only_from is not None else []),
          *([f"--timeout={timeout_s:g}"] if timeout_s else []), "--isolate" if isolate else "--noisolate",
          *([f"--kwargs_of={kwargs_of}"] if kwargs_of else []),
          *[f"--set={item}" for item in overrides], f"--results_dir={results_dir}", "--workers=1"]


def sweep_workers(parts: Sequence[Sequence[str]], queues: Sequence[Sequence[Point]], argv: dict[str, Any],
                  desc: str, progress: bool, *, baseline: dict[tuple, int]) -> list[str]:
  """Runs one ``lra-bench bench`` process per part of the attentions side by side (``worker_command``; stdout
  and stderr to ``<results_dir>/bench_worker<k>.log``), shows their progress from the records (``queues``:
  each worker's points in the order it measures them) and waits for them. A SIGTERM or Ctrl-C stops every
  worker (SIGTERM, then SIGKILL; each point's own process dies with its worker) before this process ends.
  Returns a line per worker: its log and how it ended."""
  from lra_bench.experiments import processes

  results_dir = argv["results_dir"]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
  os.makedirs(results_dir, exist_ok=True)
  display = SweepProgress(queues, desc, enabled=progress)
  procs, logs = [], []
  try:
    with processes.Signals() as signals:
      for w, part in enumerate(parts):
        log_path = os.path.join(results_dir, f"bench_worker{w + 1}.log")
        with open(log_path, "w") as log, processes.forking():
          procs.append(subprocess.Popen(worker_command(part, **argv), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT,
                                        preexec_fn=processes.die_with_parent()))
        logs.append(log_path)
      try:
        signals.check()
        while any(proc.poll() is None for proc in procs):
          display.poll(results_dir, baseline)
          time.sleep(POLL_S)
      except (KeyboardInterrupt, processes.Stopped) as err:
        signals.quiet()
        stopped = err if isinstance(err, processes.Stopped) else processes.Stopped(signal.SIGINT)
        display.bar.write(f"bench: stopping the {len(procs)} workers (a point cut short has no record and is "
                          "measured again by the next run)")
        pids = [pid for proc in procs for pid in (proc.pid, *processes.descendants(proc.pid))]
        processes.stop(pids, reap=lambda: [proc.poll() for proc in procs])
        display.poll(results_dir, baseline)  # the points recorded until they stopped
        display.bar.write("bench: every worker stopped; rerun the same command to resume")
        raise stopped.exit("the bench workers are stopped; rerun the same command to resume") from None
    display.poll(results_dir, baseline)
  finally:
    display.close()
  lines = []
  for w, (proc, log_path) in enumerate(zip(procs, logs)):
    ended = "finished" if proc.returncode == 0 else f"exited with {proc.returncode}"
    lines.append(f"bench worker {w + 1} ({', '.join(parts[w])}): {ended}; log {log_path}")
  return lines


if __name__ == "__main__":
  sys.exit(_worker_main(sys.argv[1:]))
