"""The efficiency tables (speed, memory, FLOPs per sequence length, with ratios and fitted slopes), the
crossover lengths against the exact baselines, LRA Table 2 as published, and the series of the scaling
figures.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np
import pandas as pd

from attention_zoo.registry import FAMILIES, attention_family
from lra_bench.experiments import results
from lra_bench.report.plots import fit_slope
from lra_bench.report.reference import number, paper_name
from lra_bench.report.tables import Table


# The two memory numbers of a point, never mixed in one column (a CPU run has only the first):
COMPILED_MEMORY = "XLA compiled estimate"   # compiled.memory_analysis(): the same on every backend
DEVICE_PEAK = "measured device peak"        # memory_stats()["peak_bytes_in_use"]: GPU/TPU only


RECURRENT_SUFFIX = " (recurrent)"


def point_label(record: dict) -> str:
  """The name a benchmark point is shown under: the layer's, with ``(recurrent)`` appended when the layer ran
  its token-by-token reference form (``model.attention_kwargs.mode = "recurrent"``), so a layer's two forms
  are two rows of the same tables (their ratio, and each one's crossover with ``vanilla``)."""
  kwargs = ((record.get("config") or {}).get("model") or {}).get("attention_kwargs") or {}
  return record["attention"] + RECURRENT_SUFFIX if kwargs.get("mode") == "recurrent" else record["attention"]


def bench_frame(records: Sequence[dict]) -> pd.DataFrame:
  """One row per benchmark point (latest record of each). ``memory_bytes`` (the plots' memory) is the XLA
  compiled estimate on every backend, so curves from a CPU and a GPU run mean the same thing."""
  rows = []
  for r in results.latest_records(x for x in records if x.get("kind") == "bench"):
    memory = r.get("compiled_memory_bytes")
    model = (r.get("config") or {}).get("model") or {}
    heads, qkv_dim = model.get("num_heads"), model.get("qkv_dim")
    dropout = model.get("attention_dropout_rate")
    head_dim = qkv_dim // heads if isinstance(heads, int) and isinstance(qkv_dim, int) and heads else None
    rows.append({"attention": point_label(r), "family": attention_family(r["attention"]), "mode": r.get("mode"),
                 "batch_size": r.get("batch_size"), "num_heads": heads, "head_dim": head_dim,
                 "attention_dropout": float(dropout) if isinstance(dropout, (int, float)) else None,
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
  crossover: Table | None = None    # slopes and crossover lengths per attention (``crossover_table``)
  crossover_frame: pd.DataFrame | None = None  # the same as numbers and texts (its CSV)
  what: str = ""                    # what one point measured ("attention core forward + backward")
  setting: str = ""                 # the shapes and the device ("batch 1, 4 heads x 64, cpu")
  # Set where records of the same mode, batch and device ran with different attention dropout rates:
  # then each rate is its own group, and the file names say which (a point's cost depends on it).
  attention_dropout: float | None = None

  @property
  def stem(self) -> str:
    device = re.sub(r'[^A-Za-z0-9]+', '-', self.device_kind).strip('-').lower()
    dropout = "" if self.attention_dropout is None else f"_dropout{self.attention_dropout:g}".replace(".", "p")
    return f"{self.mode}_b{self.batch_size}_{device}{dropout}"


def _point(frame: pd.DataFrame, attention: str, length: int) -> pd.Series | None:
  rows = frame[(frame.attention == attention) & (frame.length == length)]
  return rows.iloc[-1] if len(rows) else None


def _baseline_value(frame: pd.DataFrame, baseline: str, length: int, metric: str):
  point = _point(frame, baseline, length)
  return point[metric] if point is not None and point["status"] == "ok" else None


MEASURED = ("steps_per_second", "peak_memory_bytes", "step_seconds_median")  # none for compile-only points


def _metric_value(point: pd.Series | None, metric: str) -> float | None:
  """``metric`` of an ``ok`` point (of a timed one for a time), else None."""
  if point is None or point["status"] != "ok" or (metric in MEASURED and point["compile_only"]):
    return None
  return _number(point.get(metric))


def _values(frame: pd.DataFrame, attention: str, metric: str) -> tuple[list[int], list[float]]:
  """(lengths, values) of ``attention``'s points that have ``metric`` (``_metric_value``)."""
  points = [(int(p.length), _metric_value(p, metric)) for _, p in frame[frame.attention == attention].iterrows()]
  return [n for n, v in points if v is not None], [v for _, v in points if v is not None]


# The slopes of the tables: (frame metric, what it is). Time is seconds per step (the speed table shows its
# inverse, steps/s), memory XLA's compiled estimate.
SLOPES = (("step_seconds_median", "time"), ("compiled_memory_bytes", "memory"), ("flops_per_step", "FLOPs"))


def slope(frame: pd.DataFrame, attention: str, metric: str) -> float | None:
  """Fitted exponent k of metric ~ c * length^k over ``attention``'s points (``plots.fit_slope``: least
  squares of log metric on log length); None with fewer than 2 lengths."""
  return fit_slope(*_values(frame, attention, metric))


def _slope_text(value: float | None) -> str:
  return "—" if value is None else f"{round(value, 2) + 0.0:.2f}"  # + 0.0: never "-0.00"


def _number(value) -> float | None:
  return None if value is None or pd.isna(value) else float(value)


def _length_text(length: int) -> str:
  return f"{int(length)}"


def crossover(frame: pd.DataFrame, attention: str, baseline: str, metric: str) -> tuple[int | None, str]:
  """(L*, text): the shortest measured length L* from which ``attention`` is below ``baseline`` in
  ``metric`` (faster: ``step_seconds_median``; smaller: ``compiled_memory_bytes``) at L* and at every
  longer length where the two are compared.

  The two are compared at a length where both have the metric (ok points; timed ones for a time), where
  the baseline ran out of memory and the attention has the metric (a win), and where the attention ran
  out of memory or failed and the baseline has it (a loss); other lengths (compile-only times, missing
  points) are not compared. Text: ``"1024"``; ``"never (≤ 4096)"`` when it is not below at the longest
  compared length (4096); ``"—"`` when the baseline has no records here, is ``attention`` itself, or no
  length compares them.
  """
  if attention == baseline or not (frame.attention == baseline).any():
    return None, "—"
  compared = []
  for length in sorted(set(frame[frame.attention.isin([attention, baseline])].length.astype(int))):
    a, b = _point(frame, attention, length), _point(frame, baseline, length)
    value_a, value_b = (_metric_value(p, metric) for p in (a, b))
    if value_a is not None and value_b is not None:
      compared.append((length, value_a < value_b))
    elif value_a is not None and b is not None and b["status"] == "oom":
      compared.append((length, True))
    elif value_b is not None and a is not None and a["status"] in ("oom", "failed"):
      compared.append((length, False))
  if not compared:
    return None, "—"
  star = None
  for length, below in reversed(compared):
    if not below:
      break
    star = length
  if star is None:
    return None, f"never (≤ {_length_text(compared[-1][0])})"
  return star, _length_text(star)


def family_order(families) -> list[str]:
  """``registry.FAMILIES`` order; families it does not list (a plugin's) after them, "other" last."""
  known = [f for f in FAMILIES if f != "other"]
  return sorted(set(families), key=lambda f: (f == "other", known.index(f) if f in known else len(known), f))


def crossover_frame(frame: pd.DataFrame, attentions: Sequence[str]) -> pd.DataFrame:
  """Per attention: family, the three fitted slopes, and the crossover lengths (number and text) against
  each of ``BASELINES`` in time and in compiled memory."""
  rows = []
  for a in attentions:
    row = {"attention": a, "family": attention_family(a.removesuffix(RECURRENT_SUFFIX))}
    for metric, name in SLOPES:
      row[f"{name.lower()}_slope"] = slope(frame, a, metric)
    for baseline in BASELINES:
      for metric, word in (("step_seconds_median", "faster"), ("compiled_memory_bytes", "smaller")):
        length, text = crossover(frame, a, baseline, metric)
        row[f"{word}_than_{baseline}_from"] = length
        row[f"{word}_than_{baseline}"] = text
    rows.append(row)
  out = pd.DataFrame(rows)
  for column in [c for c in out.columns if c.endswith("_from")]:
    out[column] = out[column].astype("Int64")  # a length or empty, never 1024.0
  return out


def crossover_table(crossovers: pd.DataFrame, what: str, setting: str, lengths: Sequence[int]) -> Table:
  """``crossover_frame`` as a display table (rows by family, the baselines first, then by name), its
  caption saying what was measured and how slopes and crossovers are defined."""
  pairs = [(word, b) for b in BASELINES for word in ("faster", "smaller")]
  columns = ["Attention", "family", *[f"slope {name}" for _, name in SLOPES],
             *[f"{word} than {b} from" for word, b in pairs]]
  order = family_order(crossovers.family) if len(crossovers) else []
  ranked = sorted(crossovers.to_dict("records"), key=lambda r: (
      order.index(r["family"]), BASELINES.index(r["attention"]) if r["attention"] in BASELINES else len(BASELINES),
      r["attention"]))
  rows = [[r["attention"], r["family"], *[_slope_text(_number(r[f"{name.lower()}_slope"])) for _, name in SLOPES],
           *[r[f"{word}_than_{b}"] for word, b in pairs]] for r in ranked]
  span = f"{_length_text(min(lengths))}–{_length_text(max(lengths))}" if lengths else "none"
  return Table(columns, rows, left=2, caption=(
      f"Scaling and crossover lengths, {what}; {setting}; lengths {span}. Slope: the fitted exponent k of "
      "y ~ c·L^k (least squares of log y on log L over the measured lengths; time = median seconds per step "
      f"of the timed points, memory = {COMPILED_MEMORY}, FLOPs = XLA's count; — with fewer than 2 lengths). "
      "Crossover vs a baseline: the shortest measured length L* from which the attention is faster (median "
      "time) / smaller (compiled memory) than the baseline at L* and at every longer length where both were "
      "measured (the baseline out of memory counts as a win, the attention out of memory or failed as a "
      "loss). never (≤ Lmax): not faster / smaller at the longest compared length Lmax; —: no records of "
      "that baseline, or the row is the baseline. Times are one machine's: on a shared machine they are "
      "indicative."))


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
                      attentions: list[str], slope_of: tuple[str, str] | None = None) -> Table:
  """Attention x length; each value with its ratios vs ``BASELINES`` at the same length, then the fitted
  log-log slope of ``slope_of`` = (frame metric, column title) over the lengths. Without any ``flash``
  record a last column says so (a missing ratio is then not mistaken for a missing number)."""
  columns = ["Attention", *[f"{length:,}".replace(",", " ") for length in lengths]]
  columns += [slope_of[1]] if slope_of else []
  no_flash = not (frame.attention == "flash").any()
  rows = [[a, *[_efficiency_cell(frame, a, length, metric, fmt) for length in lengths]]
          + ([_slope_text(slope(frame, a, slope_of[0]))] if slope_of else [])
          + (["no flash records"] if no_flash else []) for a in attentions]
  return Table(columns + (["vs flash"] if no_flash else []), rows, caption=caption)


def dropout_words(rate: float) -> str:
  """An attention dropout rate as captions and headings write it: "off" or "0.1"."""
  return "off" if rate == 0 else f"{rate:g}"


def _dropout_text(frame: pd.DataFrame) -> str:
  """", attention dropout 0.1" / ", attention dropout off" from the points' configs ("" where unknown).
  Where attentions differ (an LRA preset's own rate: reformer ran without attention dropout), the most
  common rate and the exceptions: ", attention dropout 0.1 (off for reformer)"."""
  if "attention_dropout" not in frame:
    return ""
  known = frame.dropna(subset=["attention_dropout"])
  if known.empty:
    return ""
  rate_of = known.groupby("attention").attention_dropout.first()
  counts = rate_of.value_counts()
  common = max(counts.index, key=lambda r: (counts[r], -r))
  text = ", attention dropout " + dropout_words(common)
  others = [f"{dropout_words(r)} for {', '.join(sorted(rate_of.index[rate_of == r]))}"
            for r in sorted(counts.index) if r != common]
  return text + (f" ({'; '.join(others)})" if others else "")


def describe(mode: str, batch: int, device: str, frame: pd.DataFrame) -> tuple[str, str]:
  """(what one point of ``mode`` measured, its setting: shapes, attention dropout and device), for captions
  and titles. The dropout rate matters to the cost: with JAX's default (threefry) generator the mask's
  random bits cost about as much as some cores' arithmetic on a CPU, and twice their compile time."""
  dropout = _dropout_text(frame)
  if mode == "core":
    heads = sorted({int(h) for h in frame.get("num_heads", pd.Series(dtype=float)).dropna()})
    dims = sorted({int(d) for d in frame.get("head_dim", pd.Series(dtype=float)).dropna()})
    shape = (f", {'/'.join(map(str, heads))} heads x {'/'.join(map(str, dims))}" if heads and dims else "")
    return ("attention core forward + backward (gradient w.r.t. q, k, v and the core's parameters)",
            f"batch {batch}{shape}{dropout}, {device}")
  what = "training step (forward + backward + AdamW)" if mode == "train" else "inference (forward only)"
  return what, f"LRA Text model (4 layers, emb 256, 4 heads, mlp 1024), batch {batch}{dropout}, {device}"


def efficiency_groups(records: Sequence[dict], reference_eff: pd.DataFrame) -> list[EfficiencyGroup]:
  frame = bench_frame(records)
  if frame.empty:
    return []
  groups = []
  for (mode, batch, device), g_all in frame.groupby(["mode", "batch_size", "device_kind"], sort=True):
    rates = g_all.get("attention_dropout", pd.Series(dtype=float))
    parts = [(None, g_all)]
    # Two sweeps at different dropout rates (some attention measured at both): one group each. Attentions
    # that differ only by their preset's own rate (LRA's reformer: none) stay together; the caption says so.
    per_attention = rates.groupby(g_all.attention).nunique()
    if (per_attention > 1).any():
      parts = [(rate, g_all[rates == rate]) for rate in sorted(rates.dropna().unique())]
      parts += [(None, g_all[rates.isna()])] if rates.isna().any() else []  # points without a config
    for rate, g in parts:
      groups.append(_efficiency_group(mode, batch, device, g, reference_eff, rate))
  return groups


def _efficiency_group(mode: str, batch, device: str, g: pd.DataFrame, reference_eff: pd.DataFrame,
                      attention_dropout: float | None) -> EfficiencyGroup:
  lengths = sorted(g.length.unique().tolist())
  attentions = sorted(g.attention.unique(),
                      key=lambda n: (n not in BASELINES, BASELINES.index(n) if n in BASELINES else 0, n))
  what, setting = describe(mode, int(batch), device, g)
  slope_note = "Last column: the fitted log-log slope in length (crossover table)."
  speed = _efficiency_table(g, "steps_per_second", lambda v: f"{v:.2f}",
                            f"Steps per second, {what}; {setting}. Median over repeats; "
                            "(ratios vs vanilla and vs flash) at the same length. Last column: the fitted "
                            "log-log slope of the time per step (seconds, the inverse of steps/s) in length.",
                            lengths, attentions, ("step_seconds_median", "time slope"))
  memory = _efficiency_table(g, "compiled_memory_bytes", _bytes,
                             f"Memory per step, {COMPILED_MEMORY} (XLA memory_analysis of the compiled "
                             f"step: arguments + outputs + temporaries − donated; computed, not measured, "
                             f"so comparable across CPU/GPU/TPU), {what}; {setting}. "
                             f"(ratios vs vanilla and vs flash). {slope_note}", lengths, attentions,
                             ("compiled_memory_bytes", "slope"))
  peak_memory = None
  if g.peak_memory_bytes.notna().any():
    peak_memory = _efficiency_table(
        g, "peak_memory_bytes", _bytes,
        f"Memory per step, {DEVICE_PEAK} (device memory_stats() peak_bytes_in_use while the point ran; "
        f"n/a: not reported by this backend, or not separable from an earlier point in the same process), "
        f"{what}; {setting}. (ratios vs vanilla and vs flash).", lengths, attentions)
  flops = _efficiency_table(g, "flops_per_step", lambda v: f"{v / 1e9:.1f} G",
                            f"XLA FLOPs per step, {what}; {setting}. (ratios vs vanilla and vs flash). "
                            f"{slope_note}", lengths, attentions, ("flops_per_step", "slope"))
  published = _published_efficiency(reference_eff, attentions) if mode == "train" else None
  crossovers = crossover_frame(g, attentions)
  return EfficiencyGroup(mode, int(batch), device, g, speed, memory, flops, published, COMPILED_MEMORY,
                         peak_memory, crossover_table(crossovers, what, setting, lengths), crossovers, what,
                         setting, attention_dropout)


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
