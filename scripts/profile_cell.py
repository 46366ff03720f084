"""Profiles one training cell: where the time of ``lra-bench train`` goes, and what the full cell costs.

Builds the cell exactly as ``lra-bench train`` does (``training.loop.Run``: config, data, model, mesh,
compiled train step; the workdir is a fresh temporary folder, deleted at the end) and measures:

- ``compile_s``: compiling the train step (ahead of time, as the loop does);
- ``step_s``: seconds per train step, the median over ``--steps`` steps after ``--warmup`` steps, each
  blocked until ready (the input batch is fetched before the clock starts);
- ``flops`` / ``bytes``: XLA's cost analysis of the compiled train step, and ``flop_bound_s``: the step's
  FLOPs at ``--peak_gflops`` (how far the measured step is from the FLOP bound);
- ``core_s``: the attention core alone (forward + backward at the model's shapes, times the number of
  layers), so ``step_s - core_s`` is the rest of the model (embedding, projections, MLP, norms, loss,
  optimizer);
- ``eval_s``: one evaluation pass over the whole validation split (``Run.evaluate``, what the loop runs
  every ``eval_every`` steps), after a first pass that compiles the eval step (``eval_compile_s``);
- ``data_s``: the input pipeline (tf.data read, tokenise, shuffle, batch, host copy) per train batch;
- ``log_s``, ``checkpoint_s``, ``best_s``: one log line + summaries, one ``last`` and one ``best``
  checkpoint save;
- ``projected_s``: the whole cell, ``num_train_steps`` steps + an evaluation every ``eval_every`` steps
  (and a ``best`` save at each, an upper bound) + a log every ``log_every`` + a checkpoint every
  ``checkpoint_every`` + compile + the two final test passes (each costed like a validation pass, per
  example). The input pipeline runs ahead in tf.data's threads (prefetch), so it is reported apart and
  not added.

Clocks: on a shared machine a pinned, single-threaded process waits for its CPU, so wall time measures
the load as much as the program. The step, eval, data and core times are therefore the process's CPU
seconds (``time.process_time``: what the cell costs on a quiet core; with one XLA thread and tf.data
idle behind its prefetch buffer they are the step's own work); the wall medians are kept beside them
(``step_wall_s``, ``eval_wall_s``). With ``--threads 0`` every time is wall time. Compile, log and checkpoint
times are wall seconds (they wait on the disk).

Threads: by default (``--threads 1``) XLA runs on one thread (``--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``) and the process is pinned to one CPU (``--cpu``, default 1), so the
numbers hold on a shared machine where other jobs take the other cores; relative costs are what they are
for. ``--threads 0`` leaves XLA's default (every core). The flags must be set before JAX starts, so this
script sets them itself; an ``XLA_FLAGS`` already in the environment is kept and added to.

    python scripts/profile_cell.py --protocol xiong --task listops --attention nystromformer \\
        --data_dir DIR --steps 5 --json reports/cpu_xiong_listops/results/profile/nystromformer.json

The data only needs the right format (step time does not depend on the split sizes); evaluate on a
validation split of the real size (LRA ListOps: 2000) for ``eval_s``:
``lra-bench data prepare listops --data_dir DIR --num_train 3000 --num_val 2000 --num_test 200``.
Bad flags or a missing data folder: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

SINGLE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


class Parser(argparse.ArgumentParser):
  """Usage errors as one ``error:`` line (exit 2)."""

  def error(self, message: str):
    self.exit(2, f"error: {message} ({self.prog} --help shows the usage)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  parser = Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--protocol", default="xiong")
  parser.add_argument("--task", default="listops")
  parser.add_argument("--attention", required=True)
  parser.add_argument("--data_dir", default=None, help="task data (default: $LRA_DATA_DIR or ~/lra_data)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config override, as lra-bench train --set (repeatable)")
  parser.add_argument("--steps", type=int, default=5, help="timed train steps (median reported)")
  parser.add_argument("--warmup", type=int, default=1, help="untimed steps after the compile")
  parser.add_argument("--eval_passes", type=int, default=1, help="timed validation passes (0: skip eval)")
  parser.add_argument("--data_batches", type=int, default=20, help="train batches timed for data_s")
  parser.add_argument("--threads", type=int, default=1, choices=(0, 1),
                      help="1: XLA on one thread, pinned to --cpu (default); 0: XLA's default threads")
  parser.add_argument("--cpu", type=int, default=1, help="the CPU --threads 1 pins to")
  parser.add_argument("--peak_gflops", type=float, default=None,
                      help="one thread's peak float32 GFLOP/s for flop_bound_s (default: measured with "
                           "a 1024x1024 float32 matmul)")
  parser.add_argument("--json", default=None, help="also write the measurements to this JSON file")
  args = parser.parse_args(argv)
  for flag in ("steps", "warmup", "eval_passes", "data_batches"):
    if getattr(args, flag) < (1 if flag == "steps" else 0):
      parser.error(f"--{flag} {getattr(args, flag)} must be >= {1 if flag == 'steps' else 0}")
  if args.threads == 1:
    cpus = os.sched_getaffinity(0)
    if args.cpu not in cpus:
      parser.error(f"--cpu {args.cpu} is not one this process may run on ({sorted(cpus)})")
  return args


def set_threads(args: argparse.Namespace) -> str:
  """Sets XLA's thread flags and the CPU affinity (before JAX is imported); returns a description."""
  if args.threads == 0:
    return f"XLA default threads, {len(os.sched_getaffinity(0))} CPU(s)"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SINGLE_THREAD_FLAGS}".strip()
  os.sched_setaffinity(0, {args.cpu})
  return f"1 XLA thread, pinned to CPU {args.cpu} ({SINGLE_THREAD_FLAGS})"


class Clock:
  """Wall and process CPU seconds since it was made (``wall``, ``cpu``)."""

  def __init__(self):
    self._wall, self._cpu = time.perf_counter(), time.process_time()

  @property
  def wall(self) -> float:
    return time.perf_counter() - self._wall

  @property
  def cpu(self) -> float:
    return time.process_time() - self._cpu if CPU_CLOCK else self.wall


CPU_CLOCK = True  # False with --threads 0: CPU seconds would add up the threads


def timed(fn, *args, cpu: bool = True):
  """(result, seconds) of ``fn(*args)`` blocked until ready: process CPU seconds (``cpu``, see the
  module docstring) or wall seconds."""
  import jax

  clock = Clock()
  out = jax.block_until_ready(fn(*args))
  return out, clock.cpu if cpu and CPU_CLOCK else clock.wall


def measured_peak_gflops() -> float:
  """GFLOP/s of a jitted 1024x1024 float32 matmul (best of 5): this thread's practical matmul peak."""
  import jax
  import jax.numpy as jnp

  a = jnp.ones((1024, 1024), jnp.float32)
  matmul = jax.jit(lambda x: x @ x)
  timed(matmul, a)
  best = min(timed(matmul, a)[1] for _ in range(5))
  return 2 * 1024 ** 3 / best / 1e9


def core_seconds(config, steps: int) -> tuple[float, float | None]:
  """(median seconds, XLA FLOPs) of the attention core's forward + backward at the model's shapes
  (batch, length, heads, head dim of ``config``; all tokens real), for one layer."""
  import jax
  import jax.numpy as jnp

  import attention_zoo

  m = config.model
  head_dim = m.qkv_dim // m.num_heads
  shape = (config.batch_size, config.data.max_length, m.num_heads, head_dim)
  core = attention_zoo.create_attention(m.attention, dropout_rate=m.attention_dropout_rate,
                                        **dict(m.attention_kwargs))
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys[:3])
  mask = jnp.ones(shape[:2], bool)
  rngs = {"params": keys[3], "dropout": keys[3], "attention": keys[3]}
  variables = core.init(rngs, q, k, v, mask)

  def loss(q, k, v):
    out = core.apply(variables, q, k, v, mask, deterministic=False, rngs=rngs,
                     mutable=["intermediates", "losses"])[0]
    return jnp.sum(out * out)

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
  flops = _cost(compiled).get("flops")
  timed(compiled, q, k, v)
  return statistics.median(timed(compiled, q, k, v)[1] for _ in range(steps)), flops


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  return (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}


def profile(args: argparse.Namespace, threads: str) -> dict:
  """The measurements of one cell (module docstring)."""
  import tasks as tasks_lib
  from lra_bench.training import config as config_lib

  config = config_lib.load_config(args.protocol, args.task, args.set, attention=args.attention)
  data_dir = args.data_dir or tasks_lib.base.default_data_dir()
  with tempfile.TemporaryDirectory(prefix="profile_cell-") as workdir:
    start = time.perf_counter()
    run = _loop().Run(config, workdir, data_dir)
    setup_s = time.perf_counter() - start
    out = {"protocol": config.protocol, "task": config.task, "attention": config.model.attention,
           "attention_kwargs": dict(config.model.attention_kwargs), "threads": threads,
           "batch_size": config.batch_size, "max_length": config.data.max_length,
           "setup_s": setup_s, "compile_s": run.compile_seconds}
    cost = _cost(run.compiled)
    out["flops"], out["bytes"] = cost.get("flops"), cost.get("bytes accessed")
    out.update(_train_steps(run, args))
    out["data_s"] = _data_seconds(run, args.data_batches)
    out.update(_periodic_seconds(run))
    if args.eval_passes:
      out.update(_eval_seconds(run, args.eval_passes))
    out["core_s"], out["core_flops"] = core_seconds(config, args.steps)
    out["core_s"] *= config.model.num_layers
    out["core_flops"] = out["core_flops"] and out["core_flops"] * config.model.num_layers
    peak = args.peak_gflops or measured_peak_gflops()
    out["peak_gflops"] = peak
    out["flop_bound_s"] = out["flops"] / (peak * 1e9) if out["flops"] else None
    out.update(projection(config, run, out))
  return out


def _train_steps(run, args) -> dict:
  """Median seconds of ``args.steps`` train steps after ``args.warmup`` untimed ones."""
  import jax

  cpu, wall = [], []
  for i in range(args.warmup + args.steps):
    batch = run.to_global(loop_to_numpy(next(run.train_iter)))
    clock = Clock()
    run.state, metrics = run.compiled(run.state, batch)
    jax.block_until_ready((run.state, metrics))
    if i >= args.warmup:
      cpu.append(clock.cpu)
      wall.append(clock.wall)
  return {"step_s": statistics.median(cpu), "step_s_all": cpu, "step_wall_s": statistics.median(wall),
          "step_wall_s_all": wall}


def _loop():
  """``lra_bench.training.loop``, imported late (JAX must start after ``set_threads``)."""
  from lra_bench.training import loop

  return loop


def loop_to_numpy(batch):
  return _loop().to_numpy(batch)


def _data_seconds(run, batches: int) -> float | None:
  """Seconds per train batch of the input pipeline alone (next + host copy), no step running."""
  if not batches:
    return None
  clock = Clock()
  for _ in range(batches):
    loop_to_numpy(next(run.train_iter))
  return clock.cpu / batches


def _periodic_seconds(run) -> dict:
  """One log (with summaries), one ``last`` checkpoint and one ``best`` checkpoint, timed."""
  import jax

  step = int(run.state.step)
  run.best_val, run.best_step = -1.0, 0
  run.timer = _loop().StepTimer(step)
  metrics = jax.device_get([{"loss": 1.0, "accuracy": 0.5}])
  log_s = timed(run._check_and_log, step, metrics, True, cpu=False)[1]      # noqa: SLF001 - the loop's
  checkpoint_s = timed(run._save_last, step, cpu=False)[1]                    # noqa: SLF001 - own code
  best_s = timed(run.checkpoints.save_best, step, run.state, cpu=False)[1]
  return {"log_s": log_s, "checkpoint_s": checkpoint_s, "best_s": best_s}


def _eval_seconds(run, passes: int) -> dict:
  """The eval step's compile (its first call, on one padded batch) and the median of ``passes`` timed
  validation passes (``Run.evaluate``: every batch, the last one padded)."""
  state, loop = run.state, _loop()
  batch = loop.pad_batch(loop.steps.example_batch(run.data.validation.element_spec, 1),
                         run.data.local_batch_size)
  _, eval_compile_s = timed(run.placed.eval_step, state.params, state.model_state, run.to_global(batch))
  cpu, wall, result = [], [], None
  for _ in range(passes):
    clock = Clock()
    result = run.evaluate("validation", state.params, state.model_state)
    cpu.append(clock.cpu)
    wall.append(clock.wall)
  return {"eval_s": statistics.median(cpu), "eval_wall_s": statistics.median(wall),
          "eval_compile_s": eval_compile_s,
          "eval_examples": result["count"], "eval_batches": run.data.eval_steps("validation")}


def projection(config, run, m: dict) -> dict:
  """Projected wall seconds of the whole cell from the measurements ``m`` (module docstring)."""
  steps = config.num_train_steps
  evals = -(-steps // config.eval_every)
  logs = -(-steps // config.log_every)
  checkpoints = -(-steps // config.checkpoint_every)
  eval_s = m.get("eval_s")
  test_s = None
  if eval_s is not None:
    per_example = eval_s / max(m["eval_examples"], 1)
    test_s = 2 * per_example * run.data.examples["test"].num_examples
    if run.data.examples["test"].num_examples < m["eval_examples"]:  # a small test split: cost it as LRA's
      test_s = 2 * eval_s
  parts = {"train_steps_total_s": steps * m["step_s"],
           "evals_total_s": evals * (eval_s + m["best_s"]) if eval_s is not None else None,
           "logs_total_s": logs * m["log_s"], "checkpoints_total_s": checkpoints * m["checkpoint_s"],
           "test_total_s": test_s}
  total = m["compile_s"] + m.get("eval_compile_s", 0.0) + sum(v for v in parts.values() if v is not None)
  return {**parts, "num_train_steps": steps, "eval_every": config.eval_every,
          "projected_s": total, "projected_h": total / 3600}


def summary(m: dict) -> str:
  """A few readable lines of the measurements."""
  def f(key, fmt="{:.3f}"):
    return "n/a" if m.get(key) is None else fmt.format(m[key])

  ratio = m["step_s"] / m["flop_bound_s"] if m.get("flop_bound_s") else None
  return "\n".join([
      f"{m['protocol']}/{m['task']}/{m['attention']} {m['attention_kwargs']}: {m['threads']}",
      f"  compile {f('compile_s', '{:.1f}')} s; train step {f('step_s')} s ({1 / m['step_s']:.3f} steps/s); "
      f"attention cores {f('core_s')} s of it",
      f"  XLA: {m['flops'] / 1e9:.1f} GFLOP, {m['bytes'] / 1e9:.2f} GB per step; FLOP bound "
      f"{f('flop_bound_s')} s at {m['peak_gflops']:.1f} GFLOP/s"
      + (f" (measured = {ratio:.1f}x the bound)" if ratio else ""),
      f"  eval pass {f('eval_s', '{:.1f}')} s over {m.get('eval_examples', 'n/a')} examples "
      f"(+{f('eval_compile_s', '{:.1f}')} s compile); data {f('data_s', '{:.4f}')} s/batch; "
      f"log {f('log_s', '{:.4f}')} s, checkpoint last {f('checkpoint_s', '{:.2f}')} s, "
      f"best {f('best_s', '{:.2f}')} s",
      f"  projected cell ({m['num_train_steps']} steps, eval every {m['eval_every']}): "
      f"{m['projected_s'] / 3600:.2f} h (steps {m['train_steps_total_s'] / 3600:.2f} h, evals "
      f"{(m['evals_total_s'] or 0) / 3600:.2f} h)",
  ])


def write_json(path: str, data: dict) -> None:
  """Atomic: a temporary file in the same folder, then ``os.replace``."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".profile-", dir=folder)
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(data, f, indent=1, sort_keys=True)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def main(argv: list[str] | None = None) -> int:
  global CPU_CLOCK
  args = parse_args(argv)
  threads = set_threads(args)
  CPU_CLOCK = args.threads == 1
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from absl import logging as absl_logging

  absl_logging.set_verbosity(absl_logging.WARNING)
  from lra_bench.training.config import ConfigError
  from tasks import DataError

  try:
    measurements = profile(args, threads)
  except (ConfigError, DataError, ValueError) as err:
    print("error: " + " ".join(line.strip() for line in str(err).splitlines()), file=sys.stderr)
    return 2
  print(summary(measurements))
  if args.json:
    write_json(args.json, measurements)
  return 0


if __name__ == "__main__":
  sys.exit(main())
