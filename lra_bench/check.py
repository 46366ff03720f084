"""``lra-bench check NAME``: one verdict on an attention core, in a form to paste into a paper's appendix.

What it measures, in order (a progress line per stage goes to stderr):

1. the conformance table of ``lra_bench.testing`` (property | pass / FAIL / n.a. | the number measured);
2. the core alone (batch 1, 4 heads of 64, float32, as the LRA Text model; forward + backward of
   ``sum(core(q, k, v)^2)``): XLA's FLOPs and compiled memory at two lengths and their log-log slope,
   and the fwd+bwd time beside ``vanilla``'s at the same lengths (median of interleaved repeats, so a
   busy machine slows both alike);
3. the effective-attention heatmap (``lra_bench.report.viz.plot_attention``) as a PNG;
4. learnability: the smoke ListOps cell (``configs/smoke.py``) trained for NAME and for ``vanilla``
   under the same budget, test accuracy side by side (chance is 0.1). The smoke ListOps data is
   generated in ``data_dir`` when it is missing (``tasks.get_task("listops").prepare`` with the smoke
   protocol's options: 2400 short expressions, seconds; idempotent, and files generated with other
   options are never overwritten: that case is reported with the command that fixes it).

The report goes to stdout and, as Markdown, to ``<out>/check_<NAME>.md`` (default ``out``:
``check_<NAME>/`` in the current directory) beside the heatmap and the training runs. The exit status
is 1 when a conformance check fails, else 0. ``quick`` is stage 1 alone, on the kit's smaller shapes
(``testing.QUICK``): no timing, no heatmap, no training (``lengths`` and ``steps`` are then unused).

  lra-bench check my_attention --lengths 256,512 --out check_my_attention
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any, Sequence


import attention_zoo
from lra_bench import testing

DEFAULT_LENGTHS = (256, 512)
HEADS, HEAD_DIM = 4, 64      # the LRA Text model's attention (qkv 256 over 4 heads)
HEATMAP_LENGTH = 64
BASELINE = "vanilla"


def _progress(name: str, message: str) -> None:
  print(f"[check {name}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------
# The core's cost (scripts/core_flops.py counts FLOPs with the same compile)


def compile_core(name: str, length: int, heads: int = HEADS, head_dim: int = HEAD_DIM):
  """(core, compiled): d(sum(core(q, k, v)^2))/d(q, k, v) at this length, compiled for abstract
  params and [1, L, heads, head_dim] float32 inputs (nothing is allocated)."""
  import jax
  import jax.numpy as jnp

  core = attention_zoo.create_attention(name)
  shape = jax.ShapeDtypeStruct((1, length, heads, head_dim), jnp.float32)
  zeros = jnp.zeros(shape.shape, shape.dtype)
  params = jax.eval_shape(lambda: core.init(jax.random.key(0), zeros, zeros, zeros))
  loss = lambda p, q, k, v: jnp.sum(core.apply(p, q, k, v) ** 2)
  compiled = jax.jit(jax.grad(loss, argnums=(1, 2, 3))).lower(params, shape, shape, shape).compile()
  return core, compiled


def core_cost(name: str, length: int, heads: int = HEADS, head_dim: int = HEAD_DIM) -> dict[str, Any]:
  """XLA's FLOPs and compiled memory (bytes) of the core's forward + backward at this length."""
  from lra_bench.training import xla_stats

  return xla_stats.cost_analysis(compile_core(name, length, heads, head_dim)[1])


def _time_cores(names: Sequence[str], length: int, repeats: int) -> dict[str, dict[str, Any]]:
  """{name: cost analysis + median fwd+bwd seconds}: one warm-up call each, then ``repeats`` rounds
  that call every core once in turn (interleaved: load on the machine hits all of them alike)."""
  import jax

  from lra_bench.training import xla_stats

  runs, out = {}, {}
  for i, name in enumerate(names):
    core, compiled = compile_core(name, length)
    q, k, v = testing.random_qkv(i, 1, length, HEADS, HEAD_DIM, HEAD_DIM)
    params = core.init(jax.random.key(0), q, k, v)
    jax.block_until_ready(compiled(params, q, k, v))  # warm-up
    runs[name] = (compiled, (params, q, k, v))
    out[name] = dict(xla_stats.cost_analysis(compiled), times=[])
  for _ in range(repeats):
    for name, (compiled, args) in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(compiled(*args))
      out[name]["times"].append(time.perf_counter() - start)
  for stats in out.values():
    stats["seconds"] = statistics.median(stats["times"])
  return out


def measure_cost(name: str, lengths: Sequence[int], repeats: int) -> dict[int, dict[str, dict[str, Any]]]:
  """{length: {name or vanilla: {flops, compiled_memory_bytes, seconds, ...}}}."""
  names = [name] if name == BASELINE else [name, BASELINE]
  out = {}
  for length in lengths:
    _progress(name, f"cost and fwd+bwd time at L={length} (beside {BASELINE})")
    out[length] = _time_cores(names, length, repeats)
  return out


MIXER_DIM = 256  # a sequence mixer's cost is measured at the LRA Text model's width


def mixer_cost(name: str, lengths: Sequence[int], repeats: int) -> dict[int, dict[str, Any]]:
  """{length: cost analysis + median fwd+bwd seconds} of the mixer layer alone: batch 1, width
  ``MIXER_DIM``, float32, d(sum(mixer(x)^2))/d(params, x) (its projections included: a mixer owns them)."""
  import jax
  import jax.numpy as jnp

  from lra_bench.training import xla_stats

  mixer = attention_zoo.create_layer(name)
  gated = type(mixer.config).gated_residual
  out = {}
  for length in lengths:
    _progress(name, f"cost and fwd+bwd time of the mixer layer at L={length}")
    x = jnp.asarray(jax.random.normal(jax.random.key(0), (1, length, MIXER_DIM)))
    mask = jnp.ones((1, length), bool)
    extra = {"residual": x} if gated else {}
    params = mixer.init(jax.random.key(1), x, mask, **extra)
    loss = lambda p, x, mask=mask: jnp.sum(mixer.apply(p, x, mask, **({"residual": x} if gated else {})) ** 2)
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    stats = dict(xla_stats.cost_analysis(compiled))
    jax.block_until_ready(compiled(params, x))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(compiled(params, x))
      times.append(time.perf_counter() - start)
    stats["seconds"] = statistics.median(times)
    out[length] = stats
  return out


def mixer_cost_table(name: str, cost: dict[int, dict[str, Any]]) -> list[str]:
  from lra_bench.report.plots import fit_slope

  lengths = sorted(cost)
  lines = ["| L | GFLOP | compiled MiB | fwd+bwd ms |", "|---:|---:|---:|---:|"]
  for length in lengths:
    c = cost[length]
    lines.append(f"| {length} | {_num(c['flops'], 1e9)} | {_num(c['compiled_memory_bytes'], 2 ** 20)} | "
                 f"{_num(c['seconds'], 1e-3)} |")
  slopes = [_num(fit_slope(lengths, [cost[n][key] for n in lengths]), fmt="{:.2f}")
            if all(cost[n][key] is not None for n in lengths) else "-"
            for key in ("flops", "compiled_memory_bytes", "seconds")]
  lines.append("| log-log slope | " + " | ".join(slopes) + " |")
  return lines


# ----------------------------------------------------------------------------------------------------
# Learnability: the smoke ListOps cell


def _smoke_configs(name: str, steps: int | None):
  from lra_bench.training import config as config_lib

  overrides = []
  if steps is not None:
    every = max(1, min(steps, 30))
    overrides = [f"num_train_steps={steps}", f"eval_every={every}", f"checkpoint_every={every}",
                 f"log_every={every}", f"optimizer.warmup_steps={max(1, steps // 4)}"]
  names = [name] if name == BASELINE else [name, BASELINE]
  return {n: config_lib.load_config("smoke", "listops", overrides, attention=n) for n in names}


def learnability(name: str, *, steps: int | None, data_dir: str, out: str) -> dict[str, dict[str, Any]]:
  """{attention: record} of the smoke ListOps cell for ``name`` and vanilla under the same budget.

  NAME's cell always retrains (its code may have changed under the same config); vanilla's is reused
  from ``<out>/learnability/vanilla`` when that run had the same config.
  """
  import tasks
  from lra_bench.experiments import cell
  from tasks import plan

  configs = _smoke_configs(name, steps)
  config = next(iter(configs.values()))
  prepare = dict(plan.run_options("listops", config.data.prepare.to_dict(), config.data.options.to_dict()),
                 progress=False)
  _progress(name, f"smoke ListOps data in {data_dir} (generated if missing)")
  try:
    tasks.get_task("listops").prepare(data_dir, **prepare)
  except tasks.DataError as err:
    message = f"{err}\n  fix: lra-bench data prepare listops --protocol smoke --data_dir {data_dir} --overwrite"
    return {n: {"status": "no_data", "error": message} for n in configs}
  records = {}
  for n, config in configs.items():
    _progress(name, f"training the smoke ListOps cell for {n} ({config.num_train_steps} steps)")
    records[n] = cell.train_cell(config, os.path.join(out, "learnability", n), data_dir, force=n == name)
  return records


# ----------------------------------------------------------------------------------------------------
# The report


def _cell(text: Any) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def conformance_table(results: Sequence[testing.Check]) -> list[str]:
  lines = ["| property | result | measured | note |", "|---|---|---|---|"]
  for r in results:
    lines.append(f"| {r.name} | {r.status} | {_cell(r.measured)} | {_cell(r.detail)} |")
  return lines


def _num(value: float | None, scale: float = 1.0, fmt: str = "{:.3g}") -> str:
  return "-" if value is None else fmt.format(value / scale)


def cost_table(name: str, cost: dict[int, dict[str, dict[str, Any]]]) -> list[str]:
  from lra_bench.report.plots import fit_slope

  lengths = sorted(cost)
  with_base = name != BASELINE
  header = ["L", f"{name} GFLOP", f"{name} compiled MiB", f"{name} fwd+bwd ms"]
  if with_base:
    header += [f"{BASELINE} GFLOP", f"{BASELINE} compiled MiB", f"{BASELINE} fwd+bwd ms", "time ratio"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
  names = [name, BASELINE] if with_base else [name]

  def row(label, values):
    lines.append(f"| {label} | " + " | ".join(values) + " |")

  for length in lengths:
    values = []
    for n in names:
      s = cost[length][n]
      values += [_num(s["flops"], 1e9), _num(s["compiled_memory_bytes"], 2 ** 20),
                 _num(s["seconds"], 1e-3)]
    if with_base:
      values.append(f"{cost[length][name]['seconds'] / cost[length][BASELINE]['seconds']:.2f}")
    row(str(length), values)
  slopes = []
  for n in names:
    for key in ("flops", "compiled_memory_bytes", "seconds"):
      slope = fit_slope(lengths, [cost[length][n][key] for length in lengths]) \
          if all(cost[length][n][key] is not None for length in lengths) else None
      slopes.append(_num(slope, fmt="{:.2f}"))
  if with_base:
    slopes.append("")
  row("log-log slope", slopes)
  return lines


def learnability_table(records: dict[str, dict[str, Any]]) -> list[str]:
  lines = ["| attention | test accuracy | best validation accuracy | train steps | wall s | status |",
           "|---|---:|---:|---:|---:|---|"]
  for n, r in records.items():
    if r.get("status") == "ok":
      lines.append(f"| {n} | {r['test_accuracy']:.4f} | {r['best_val_accuracy']:.4f} | {r['train_steps']} | "
                   f"{_num(r.get('wall_seconds'), fmt='{:.0f}')} | ok |")
    else:
      lines.append(f"| {n} | - | - | - | - | {r.get('status')}: {_cell(r.get('error', ''))[:300]} |")
  return lines


def _defining_module(name: str) -> str:
  return attention_zoo.defining_module(name)


def _header(name: str) -> list[str]:
  import jax

  config = attention_zoo.layer_config(name)
  noun = type(config).noun
  return [f"# `lra-bench check {name}`", "",
          f"{noun[0].upper() + noun[1:]} `{name}` from `{_defining_module(name)}`; config `{config!r}`.",
          f"Declared: {config.declared()}. Device: {jax.devices()[0].device_kind} ({jax.default_backend()}).", ""]


def _write_atomic(path: str, text: str) -> None:
  from lra_bench import files

  files.write_atomic(path, text, suffix=".md")


def _validate(name: str, lengths: Sequence[int], steps: int | None) -> list[int]:
  from lra_bench.errors import ConfigError

  try:
    attention_zoo.layer_config(name)
  except ValueError as err:
    raise ConfigError(str(err)) from None
  try:
    lengths = sorted({int(n) for n in lengths})
  except (TypeError, ValueError):
    raise ConfigError(f"--lengths must be positive integers, got {list(lengths)!r}") from None
  if not lengths or lengths[0] < 1:
    raise ConfigError(f"--lengths must be positive integers, got {lengths}")
  if steps is not None and steps < 1:
    raise ConfigError(f"--steps must be >= 1, got {steps}")
  return lengths


def cost_and_heatmap(name: str, lengths: Sequence[int], out: str, repeats: int) -> list[str]:
  """Stages 2 and 3 as report lines; a core that does not compile or cannot be drawn gets a line
  saying why instead of the table or the figure."""
  from lra_bench.report import viz
  from lra_bench.training import steps, xla_stats

  lines = [f"## Cost of the core (forward + backward, batch 1, {HEADS} heads x {HEAD_DIM}, float32)", ""]
  try:
    cost = measure_cost(name, lengths, repeats=repeats)
    lines += ["FLOPs and compiled memory from XLA's cost analysis; time = median of "
              f"{repeats} interleaved calls after one warm-up.", "", *cost_table(name, cost), ""]
  except Exception as err:  # noqa: BLE001 - a core that does not compile still gets the rest of the report
    lines += [f"not measured: {type(err).__name__}: {_cell(err)[:300]}", ""]

  _progress(name, "effective-attention heatmap")
  png = os.path.join(out, f"attention_{name}_L{HEATMAP_LENGTH}.png")
  try:
    viz.plot_attention(name, png, HEATMAP_LENGTH, compiler=steps.compile_run_once, fits=xla_stats.check_fits)
    lines += [f"## Effective attention (one head, random q/k, L = {HEATMAP_LENGTH})", "",
              f"![{name}]({os.path.basename(png)})", ""]
  except Exception as err:  # noqa: BLE001 - a core the probe cannot draw still gets the rest of the report
    lines += ["## Effective attention", "", f"not drawn: {type(err).__name__}: {err}", ""]
  return lines


def run_check(name: str, *, lengths: Sequence[int] = DEFAULT_LENGTHS, out: str | None = None,
              steps: int | None = None, data_dir: str | None = None, quick: bool = False) -> int:
  """Runs every stage on core ``name`` (``quick``: the conformance table only), prints the report and
  writes it to ``<out>/check_<name>.md``; returns 1 when a conformance check fails, else 0. Bad
  arguments raise ConfigError."""
  import tasks

  lengths = _validate(name, lengths, steps)
  out = out or os.path.join(os.getcwd(), f"check_{name}")
  data_dir = data_dir or tasks.default_data_dir()
  start = time.perf_counter()
  lines = _header(name)

  kit = testing.kit(name)
  _progress(name, f"conformance: {len(kit.checks)} checks" + (" (quick shapes)" if quick else ""))
  results = testing.run_conformance(
      name, quick=quick, progress=lambda r: _progress(name, f"  {r.name}: {r.status} ({r.measured})"))
  failed = testing.failures(results)
  title = f"## Conformance ({kit.title(quick)})"
  probes_values = "value" in type(attention_zoo.layer_config(name)).probe_inputs  # a core: its matrix exists
  lines += [title, "",
            *conformance_table(results), "",
            (f"**{len(failed)} failed:** {', '.join(r.name for r in failed)}." if failed
             else "Every applicable check passes."), ""]

  if quick:
    lines += ["Quick check: conformance only (no cost, heatmap or learnability).", ""]
  else:
    if not probes_values:  # a layer that owns its projections: the layer's cost, no attention matrix
      lines += [f"## Cost of the mixer layer (forward + backward, batch 1, width {MIXER_DIM}, float32)", ""]
      try:
        lines += ["FLOPs and compiled memory from XLA's cost analysis; time = median of 5 calls after one "
                  "warm-up. A mixer has no attention matrix: no heatmap.", "",
                  *mixer_cost_table(name, mixer_cost(name, lengths, repeats=5)), ""]
      except Exception as err:  # noqa: BLE001 - a mixer that does not compile still gets the rest
        lines += [f"not measured: {type(err).__name__}: {_cell(err)[:300]}", ""]
    else:
      lines += cost_and_heatmap(name, lengths, out, repeats=5)
    records = learnability(name, steps=steps, data_dir=data_dir, out=out)
    budget = next(iter(records.values())).get("config", {}).get("num_train_steps", steps)
    lines += [f"## Learnability (smoke ListOps, {budget} steps each; chance 0.1)", "",
              *learnability_table(records), ""]

  lines += [f"Verdict: {'FAIL (' + ', '.join(r.name for r in failed) + ')' if failed else 'conformant'}; "
            f"check took {time.perf_counter() - start:.0f} s.", ""]
  text = "\n".join(lines)
  path = os.path.join(out, f"check_{name}.md")
  _write_atomic(path, text)
  print(text)
  print(f"written to {path}")
  return 1 if failed else 0
