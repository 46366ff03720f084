"""Efficiency benchmark: the LRA Table 2 setting swept over sequence length, one record per point.

The model is the LRA Text model (4 layers, emb 256, 4 heads, qkv 256, mlp 1024, byte vocabulary 257,
2 classes, CLS pooling; lra_official.md §2) on random byte tokens. ``mode="train"`` measures the real
``train.train_step`` (AdamW, dropout on: forward + backward + update); ``mode="inference"`` measures
``train.eval_step`` (forward only, as the Combiner paper's Fig. 3).

For every (attention, length) point:
- XLA FLOPs and compiled memory come from ``jit(...).lower(...).compile()`` (deterministic; nothing is
  allocated for them: the state is abstract when ``compile_only``);
- the step time is measured over ``repeats`` single steps after ``warmup_steps`` (compile and warm-up
  excluded, ``block_until_ready`` before the clock stops); the record keeps every time, the median and
  the quartiles;
- the runtime peak comes from ``device.memory_stats()`` where the backend reports it (GPU/TPU) and the
  host peak RSS of the process always;
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
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Sequence

import ml_collections
import numpy as np

import attention_zoo
from lra_bench import config as config_lib
from lra_bench import results

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("train", "inference")
DEFAULT_LENGTHS = (1024, 2048, 3072, 4096, 8192, 16384)


@dataclasses.dataclass(frozen=True)
class TextShape:
  """What the model needs to know of the LRA Text task (byte-level IMDb; lra_official.md §2)."""

  name: str = "text"
  vocab_size: int = 257      # ByteTextEncoder: 256 bytes + pad
  num_classes: int = 2
  dual_input: bool = False
  input_keys: tuple[str, ...] = ("inputs",)


def bench_config(attention: str, length: int, *, batch_size: int = 32, mode: str = "train",
                 warmup_steps: int = 2, repeats: int = 10, compile_only: bool = False,
                 device_kind: str = "", overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The locked config of one point: LRA ``base_tc_config`` + ``transformer_base`` at ``length``."""
  from configs import lra

  if mode not in MODES:
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
  c = lra.base_config()
  c.protocol = "bench"
  c.task = "text"
  c.model.attention = attention
  # LRA Table 2: "the Text task ... 4 layers, emb 256, 4 heads, qkv 256, mlp 1024" (base_tc_config).
  c.model.num_layers = 4
  c.model.num_heads = 4
  c.model.emb_dim = 256
  c.model.qkv_dim = 256
  c.model.mlp_dim = 1024
  c.data.max_length = length
  c.batch_size = batch_size           # LRA Table 2 used 32
  c.optimizer.warmup_steps = 8000     # base_tc_config (only the learning-rate value depends on it)
  c.bench = ml_collections.ConfigDict()
  c.bench.mode = mode
  c.bench.warmup_steps = warmup_steps  # untimed steps after compilation
  c.bench.repeats = repeats            # timed single steps (median and quartiles are reported)
  c.bench.compile_only = compile_only  # FLOPs and compiled memory only; no step is run
  c.bench.device_kind = device_kind    # part of the hash: a point is measured once per device kind
  c.lock()
  config_lib.apply_overrides(c, overrides)
  config_lib.validate(c)
  return c


# ----------------------------------------------------------------------------------------------------
# One point (runs in the worker process)


def _host_peak_rss_bytes() -> int:
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def measure(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Compiles (and unless ``compile_only`` times) one point; raises on failure."""
  import jax

  from lra_bench import train

  shape = TextShape()
  b, length, mode = config.batch_size, config.data.max_length, config.bench.mode
  model = train.create_model(config, shape)
  tx = train.make_optimizer(config.optimizer)
  rng = np.random.default_rng(0)
  batch = {"inputs": rng.integers(1, shape.vocab_size, (b, length), dtype=np.int32),
           "targets": rng.integers(0, shape.num_classes, (b,), dtype=np.int32)}
  make_state = functools.partial(train.init_state, config, model, tx, {k: v[:2] for k, v in batch.items()})
  if config.bench.compile_only:
    state = jax.eval_shape(make_state)
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)
  else:
    state = make_state()
  num_params = int(sum(np.prod(x.shape) for x in jax.tree.leaves(state.params)))

  if mode == "train":
    fn = jax.jit(functools.partial(train.train_step, model=model, tx=tx), donate_argnums=0)
    args = (state, batch)
  else:
    fn = jax.jit(functools.partial(train.eval_step, model=model))
    weights = np.ones((b,), np.float32)
    batch["weights"] = jax.ShapeDtypeStruct(weights.shape, weights.dtype) if config.bench.compile_only \
        else weights
    args = (state.params, state.model_state, batch)
  start = time.perf_counter()
  compiled = fn.lower(*args).compile()
  out = {"compile_seconds": time.perf_counter() - start, "num_params": num_params}
  analysis = train.cost_analysis(compiled)
  out.update(flops_per_step=analysis["flops"], compiled_memory_bytes=analysis["compiled_memory_bytes"],
             compiled_temp_bytes=analysis["temp_bytes"])
  if config.bench.compile_only:
    return out

  def step(args):
    result = compiled(*args)
    jax.block_until_ready(result)
    return (result[0], batch) if mode == "train" else args

  args = jax.device_put(args)
  for _ in range(config.bench.warmup_steps):
    args = step(args)
  times = []
  for _ in range(config.bench.repeats):
    start = time.perf_counter()
    args = step(args)
    times.append(time.perf_counter() - start)
  q25, median, q75 = (float(v) for v in np.percentile(times, [25, 50, 75]))
  out.update(step_seconds=times, step_seconds_median=median, step_seconds_q25=q25,
             step_seconds_q75=q75, steps_per_second=1.0 / median, examples_per_second=b / median,
             tokens_per_second=b * length / median, peak_memory_bytes=train.peak_memory_bytes())
  return out


def measure_safely(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """``measure`` with failures as data: ``{"status": "ok"|"oom"|"failed", "error", ...}``."""
  from lra_bench import train

  try:
    out = dict(measure(config), status="ok")
  except Exception as err:  # noqa: BLE001 - every failure is a data point
    logging.debug("bench point failed:\n%s", traceback.format_exc())
    out = {"status": "oom" if train.is_oom(err) else "failed",
           "error": f"{type(err).__name__}: {err}"[:2000]}
  out["peak_rss_bytes"] = _host_peak_rss_bytes()
  return out


def _worker_main(argv: Sequence[str]) -> int:
  """``python -m lra_bench.bench SPEC.json OUT.json`` (what ``run_point`` starts)."""
  with open(argv[0]) as f:
    spec = json.load(f)
  config = ml_collections.ConfigDict(spec["config"])
  results.write_json_atomic(argv[1], measure_safely(config))
  return 0


def run_point(config: ml_collections.ConfigDict, *, isolate: bool = True,
              timeout_s: float | None = None) -> dict[str, Any]:
  """Measures one point, in a fresh subprocess unless ``isolate`` is False."""
  if not isolate:
    return measure_safely(config)
  with tempfile.TemporaryDirectory(prefix="lra-bench-point-") as tmp:
    spec, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
    results.write_json_atomic(spec, {"config": config.to_dict()})
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
    try:
      proc = subprocess.run([sys.executable, "-m", "lra_bench.bench", spec, out], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
      return {"status": "failed", "error": f"timeout: the point took longer than {timeout_s:g} s"}
    if os.path.exists(out):
      with open(out) as f:
        return json.load(f)
    tail = (proc.stderr or "")[-1500:]
    if proc.returncode == -9:  # SIGKILL: almost always the kernel's OOM killer
      return {"status": "oom", "error": f"worker killed by SIGKILL (host out of memory?)\n{tail}"}
    return {"status": "failed", "error": f"worker exited with {proc.returncode}\n{tail}"}


# ----------------------------------------------------------------------------------------------------
# The sweep


@dataclasses.dataclass
class BenchSummary:
  counts: dict[str, int] = dataclasses.field(default_factory=dict)
  done_before: int = 0
  records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  seconds: float = 0.0

  def lines(self) -> list[str]:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items())) or "nothing to run"
    return [f"bench finished in {self.seconds:.0f} s: {counts}; {self.done_before} already measured"]


def run_bench(lengths: Sequence[int] = DEFAULT_LENGTHS, attentions: str | Sequence[str] = "all", *,
              results_dir: str, batch_size: int = 32, mode: str = "train", warmup_steps: int = 2,
              repeats: int = 10, compile_only: bool = False, compile_only_from: int | None = None,
              timeout_s: float | None = 600.0, isolate: bool = True, overrides: Sequence[str] = (),
              progress: bool = True) -> BenchSummary:
  """Measures every (attention, length) point not yet measured on this device; returns a summary.

  ``compile_only_from``: lengths >= this are compiled only (FLOPs and compiled memory, no timing).
  """
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before this process touches a GPU
  import jax
  from tqdm.auto import tqdm

  from lra_bench import suite

  start = time.perf_counter()
  names = suite.parse_names(attentions, attention_zoo.list_attentions(), "attention")
  lengths = sorted(suite.parse_ints(lengths))
  device_kind = jax.devices()[0].device_kind
  summary = BenchSummary()
  existing = results.latest_records(r for r in results.load_records(results_dir) if r.get("kind") == "bench")
  by_key = {results.run_key(r): r for r in existing}
  points = []
  for name in names:
    for length in lengths:
      only_compile = compile_only or (compile_only_from is not None and length >= compile_only_from)
      config = bench_config(name, length, batch_size=batch_size, mode=mode, warmup_steps=warmup_steps,
                            repeats=repeats, compile_only=only_compile, device_kind=device_kind,
                            overrides=overrides)
      points.append(config)

  def key(config):
    return results.run_key(_record_base(config))

  todo = [c for c in points if by_key.get(key(c), {}).get("status") not in results.TERMINAL]
  summary.done_before = len(points) - len(todo)
  oom_at: dict[str, int] = {r["attention"]: r["max_length"] for r in existing
                            if r["status"] == "oom" and not r["config"]["bench"]["compile_only"]
                            and r["config"]["bench"]["mode"] == mode and r["batch_size"] == batch_size}
  bar = tqdm(total=len(todo), unit="point", desc=f"bench {mode}", disable=not progress, dynamic_ncols=True)
  try:
    for config in todo:
      name, length = config.model.attention, config.data.max_length
      bar.set_postfix_str(f"{name} L={length}")
      if not config.bench.compile_only and name in oom_at and length > oom_at[name]:
        out = {"status": "oom", "error": f"not run: out of memory at length {oom_at[name]} already"}
      else:
        t0 = time.perf_counter()
        out = run_point(config, isolate=isolate, timeout_s=timeout_s)
        out["wall_seconds"] = time.perf_counter() - t0
      if out["status"] == "oom" and not config.bench.compile_only:
        oom_at[name] = min(length, oom_at.get(name, length))
      record = results.make_record(**_record_base(config), **out)
      results.append_record(results_dir, record)
      summary.records.append(record)
      summary.counts[record["status"]] = summary.counts.get(record["status"], 0) + 1
      if record["status"] != "ok":
        bar.write(suite.failure_line(f"{name} L={length}", record))
      bar.update()
  finally:
    bar.close()
  summary.seconds = time.perf_counter() - start
  return summary


def _record_base(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return dict(kind="bench", task=config.task, attention=config.model.attention, protocol=config.protocol,
              seed=config.seed, max_length=config.data.max_length, batch_size=config.batch_size,
              mode=config.bench.mode, compile_only=config.bench.compile_only, config=config.to_dict(),
              config_hash=config_lib.config_hash(config))


if __name__ == "__main__":
  sys.exit(_worker_main(sys.argv[1:]))
