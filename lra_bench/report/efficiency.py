"""The efficiency tables (speed, memory, FLOPs per sequence length, with ratios), LRA Table 2 as
published, and the series of the scaling figure.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np
import pandas as pd

from lra_bench.experiments import results
from lra_bench.report.reference import number, paper_name
from lra_bench.report.tables import Table


# The two memory numbers of a point, never mixed in one column (a CPU run has only the first):
COMPILED_MEMORY = "XLA compiled estimate"   # compiled.memory_analysis(): the same on every backend
DEVICE_PEAK = "measured device peak"        # memory_stats()["peak_bytes_in_use"]: GPU/TPU only


def bench_frame(records: Sequence[dict]) -> pd.DataFrame:
  """One row per benchmark point (latest record of each). ``memory_bytes`` (the plots' memory) is the XLA
  compiled estimate on every backend, so curves from a CPU and a GPU run mean the same thing."""
  rows = []
  for r in results.latest_records(x for x in records if x.get("kind") == "bench"):
    memory = r.get("compiled_memory_bytes")
    rows.append({"attention": r["attention"], "mode": r.get("mode"), "batch_size": r.get("batch_size"),
                 "backend": r.get("backend"), "device_kind": r.get("device_kind"), "length": r["max_length"],
                 "status": r["status"], "compile_only": bool(r.get("compile_only")),
                 "steps_per_second": r.get("steps_per_second"), "step_seconds_median": r.get("step_seconds_median"),
                 "step_seconds_q25": r.get("step_seconds_q25"), "step_seconds_q75": r.get("step_seconds_q75"),
                 "examples_per_second": r.get("examples_per_second"),
                 "peak_memory_bytes": r.get("peak_memory_bytes"), "peak_rss_bytes": r.get("peak_rss_bytes"),
                 "compiled_memory_bytes": r.get("compiled_memory_bytes"), "memory_bytes": memory,
                 "memory_source": COMPILED_MEMORY if memory else None, "flops_per_step": r.get("flops_per_step"),
                 "compile_seconds": r.get("compile_seconds"), "error": r.get("error")})
  columns = ["attention", "mode", "batch_size", "backend", "device_kind", "length", "status"]
  return pd.DataFrame(rows, columns=columns if not rows else None)


def _bytes(n: float | None) -> str:
  if n is None or not np.isfinite(n):
    return ""
  for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
    if n >= size:
      return f"{n / size:.2f} {unit}" if n / size < 100 else f"{n / size:.0f} {unit}"
  return f"{n:.0f} B"


BASELINES = ("vanilla", "flash")  # ratios are against these (flash: exact jax.nn.dot_product_attention)


def _ratio(value, base) -> float | None:
  if value is None or base is None or not np.isfinite(value) or not np.isfinite(base) or base == 0:
    return None
  return value / base


def _with_ratios(text: str, ratios: dict[str, float | None]) -> str:
  """``text (2.00× vanilla, 0.50× flash)``, leaving out a baseline without a number at this length."""
  shown = [f"{r:.2f}× {name}" for name, r in ratios.items() if r is not None]
  return f"{text} ({', '.join(shown)})" if shown else text


@dataclasses.dataclass
class EfficiencyGroup:
  mode: str
  batch_size: int
  device_kind: str
  frame: pd.DataFrame
  speed: Table
  memory: Table
  flops: Table
  published: Table | None
  memory_source: str              # what ``memory`` (and the frame's memory_bytes) holds
  peak_memory: Table | None = None  # the measured device peak; None where no point has one (CPU)

  @property
  def stem(self) -> str:
    return f"{self.mode}_b{self.batch_size}_{re.sub(r'[^A-Za-z0-9]+', '-', self.device_kind).strip('-').lower()}"


def _point(frame: pd.DataFrame, attention: str, length: int) -> pd.Series | None:
  rows = frame[(frame.attention == attention) & (frame.length == length)]
  return rows.iloc[-1] if len(rows) else None


def _baseline_value(frame: pd.DataFrame, baseline: str, length: int, metric: str):
  point = _point(frame, baseline, length)
  return point[metric] if point is not None and point["status"] == "ok" else None


MEASURED = ("steps_per_second", "peak_memory_bytes")  # need a run: none for compile-only points


def _efficiency_cell(frame: pd.DataFrame, attention: str, length: int, metric: str, fmt) -> str:
  p = _point(frame, attention, length)
  if p is None:
    return "—"
  if p["status"] != "ok":
    return {"oom": "OOM"}.get(p["status"], p["status"])
  if metric in MEASURED and p["compile_only"]:
    return "compiled only"
  value = p[metric]
  if value is None or pd.isna(value):
    return "n/a"
  ratios = {b: _ratio(value, _baseline_value(frame, b, length, metric)) for b in BASELINES if b != attention}
  return _with_ratios(fmt(value), ratios)


def _efficiency_table(frame: pd.DataFrame, metric: str, fmt, caption: str, lengths: list[int],
                      attentions: list[str]) -> Table:
  """Attention x length; each value with its ratios vs ``BASELINES`` at the same length. Without any
  ``flash`` record a last column says so (a missing ratio is then not mistaken for a missing number)."""
  columns = ["Attention", *[f"{length:,}".replace(",", " ") for length in lengths]]
  no_flash = not (frame.attention == "flash").any()
  rows = [[a, *[_efficiency_cell(frame, a, length, metric, fmt) for length in lengths]]
          + (["no flash records"] if no_flash else []) for a in attentions]
  return Table(columns + (["vs flash"] if no_flash else []), rows, caption=caption)


def efficiency_groups(records: Sequence[dict], reference_eff: pd.DataFrame) -> list[EfficiencyGroup]:
  frame = bench_frame(records)
  if frame.empty:
    return []
  groups = []
  for (mode, batch, device), g in frame.groupby(["mode", "batch_size", "device_kind"], sort=True):
    lengths = sorted(g.length.unique().tolist())
    attentions = sorted(g.attention.unique(),
                        key=lambda n: (n not in BASELINES, BASELINES.index(n) if n in BASELINES else 0, n))
    what = "training step (forward + backward + AdamW)" if mode == "train" else "inference (forward only)"
    setting = f"LRA Text model (4 layers, emb 256, 4 heads, mlp 1024), batch {batch}, {device}"
    speed = _efficiency_table(g, "steps_per_second", lambda v: f"{v:.2f}",
                              f"Steps per second, {what}; {setting}. Median over repeats; "
                              "(ratios vs vanilla and vs flash) at the same length.", lengths, attentions)
    memory = _efficiency_table(g, "compiled_memory_bytes", _bytes,
                               f"Memory per step, {COMPILED_MEMORY} (XLA memory_analysis of the compiled "
                               f"step: arguments + outputs + temporaries − donated; computed, not measured, "
                               f"so comparable across CPU/GPU/TPU), {what}; {setting}. "
                               "(ratios vs vanilla and vs flash).", lengths, attentions)
    peak_memory = None
    if g.peak_memory_bytes.notna().any():
      peak_memory = _efficiency_table(
          g, "peak_memory_bytes", _bytes,
          f"Memory per step, {DEVICE_PEAK} (device memory_stats() peak_bytes_in_use while the point ran; "
          f"n/a: not reported by this backend, or not separable from an earlier point in the same process), "
          f"{what}; {setting}. (ratios vs vanilla and vs flash).", lengths, attentions)
    flops = _efficiency_table(g, "flops_per_step", lambda v: f"{v / 1e9:.1f} G",
                              f"XLA FLOPs per step, {what}; {setting}. (ratios vs vanilla and vs flash).",
                              lengths, attentions)
    published = _published_efficiency(reference_eff, attentions) if mode == "train" else None
    groups.append(EfficiencyGroup(mode, int(batch), device, g, speed, memory, flops, published,
                                  COMPILED_MEMORY, peak_memory))
  return groups


def _published_efficiency(reference_eff: pd.DataFrame, attentions: Sequence[str]) -> Table | None:
  """LRA Table 2 as ratios vs the Transformer (speed and peak memory at 1K..4K), for our models."""
  if reference_eff.empty:
    return None
  base = reference_eff[reference_eff.model == "Transformer"]
  if base.empty:
    return None
  base = base.iloc[0]
  keys = ["1k", "2k", "3k", "4k"]
  rows = []
  for a in attentions:
    rows_ = reference_eff[reference_eff.model == paper_name(a)]
    if rows_.empty:
      continue
    r = rows_.iloc[0]
    speed = [f"{number(r[f'steps_per_second_{k}']) / number(base[f'steps_per_second_{k}']):.2f}×" for k in keys]
    memory = [f"{number(r[f'peak_memory_gb_{k}']) / number(base[f'peak_memory_gb_{k}']):.2f}×" for k in keys]
    rows.append([paper_name(a), a, *speed, *memory])
  if not rows:
    return None
  columns = ["Model", "Attention", *[f"steps/s {k.upper()}" for k in keys], *[f"memory {k.upper()}" for k in keys]]
  return Table(columns, rows, left=2, caption=(
      "Published (LRA paper Table 2: Text, batch 32, 4x4 TPU v3) as ratios vs the Transformer "
      f"(Transformer: {base['steps_per_second_1k']}–{base['steps_per_second_4k']} steps/s, "
      f"{base['peak_memory_gb_1k']}–{base['peak_memory_gb_4k']} GB at 1K–4K)."))


def scaling_series(frame: pd.DataFrame) -> dict[str, dict[str, list]]:
  series = {}
  for a, g in frame.groupby("attention"):
    g = g.sort_values("length")
    ok = g[g.status == "ok"]
    timed = ok[~ok.compile_only]
    nan = lambda s: [float(v) if v is not None and pd.notna(v) else np.nan for v in s]
    lengths = ok.length.tolist()
    time_by_length = dict(zip(timed.length, zip(timed.step_seconds_median, timed.step_seconds_q25,
                                                timed.step_seconds_q75)))
    series[a] = {
        "length": lengths,
        "time": nan([time_by_length.get(n, (None,) * 3)[0] for n in lengths]),
        "time_lo": nan([time_by_length.get(n, (None,) * 3)[1] for n in lengths]),
        "time_hi": nan([time_by_length.get(n, (None,) * 3)[2] for n in lengths]),
        "memory": nan(ok.memory_bytes), "flops": nan(ok.flops_per_step),
        "failed_length": g[g.status != "ok"].length.tolist(),
        "failed_status": g[g.status != "ok"].status.tolist()}
  return series
