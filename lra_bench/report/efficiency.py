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
from lra_bench.report.reference import (FLA_LAYERS, load_device_peaks, load_fla_reference,
                                        load_flash_reference, number, paper_name)
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


def _compute_dtype(record: dict) -> tuple[str | None, str | None]:
  """(the dtype a point computed in, the field it was read from): the record's ``compute_dtype``, else its
  ``precision``, else its config's ``precision`` (records written before ``compute_dtype`` existed); a
  value of ``"auto"`` (resolved at run time) counts as not recorded."""
  config = record.get("config") or {}
  for value, field in ((record.get("compute_dtype"), "compute_dtype"), (record.get("precision"), "precision"),
                       (config.get("precision"), "config precision")):
    if isinstance(value, str) and value and value != "auto":
      return value, field
  return None, None


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
    precision = _compute_dtype(r)
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
                 "compile_seconds": r.get("compile_seconds"), "error": r.get("error"),
                 "compute_dtype": precision[0], "compute_dtype_from": precision[1],
                 "matmul_precision": r.get("matmul_precision"),
                 "attention_implementation": r.get("attention_implementation"),
                 "causal": bool((model.get("attention_kwargs") or {}).get("causal", False))})
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
  checks: Table | None = None                # time, ratio to flash, FLOP/s and fraction of peak (``checks_table``)
  checks_frame: pd.DataFrame | None = None   # the same as numbers (its CSV)
  anchors: list[Table] = dataclasses.field(default_factory=list)  # the published anchors (``anchors_tables``)
  # Set where records of the same mode, batch, device (and dropout) ran in different compute dtypes: then each
  # dtype is its own group, and the file names and the setting say which.
  compute_dtype: str | None = None

  @property
  def stem(self) -> str:
    device = re.sub(r'[^A-Za-z0-9]+', '-', self.device_kind).strip('-').lower()
    dropout = "" if self.attention_dropout is None else f"_dropout{self.attention_dropout:g}".replace(".", "p")
    dtype = "" if self.compute_dtype is None else "_" + re.sub(r'[^A-Za-z0-9]+', '-', self.compute_dtype)
    return f"{self.mode}_b{self.batch_size}_{device}{dropout}{dtype}"


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
  if mode in CORE_MODES:
    heads = sorted({int(h) for h in frame.get("num_heads", pd.Series(dtype=float)).dropna()})
    dims = sorted({int(d) for d in frame.get("head_dim", pd.Series(dtype=float)).dropna()})
    shape = (f", {'/'.join(map(str, heads))} heads x {'/'.join(map(str, dims))}" if heads and dims else "")
    what = ("attention core forward + backward (gradient w.r.t. q, k, v and the core's parameters)"
            if mode == "core" else "attention core forward only (deterministic=False as in mode core: attention "
            "dropout on)")
    return what, f"batch {batch}{shape}{dropout}, {device}"
  what = "training step (forward + backward + AdamW)" if mode == "train" else "inference (forward only)"
  return what, f"LRA Text model (4 layers, emb 256, 4 heads, mlp 1024), batch {batch}{dropout}, {device}"


@dataclasses.dataclass
class Anchors:
  """The published numbers the efficiency report sets beside its rows (``reference``'s loaders)."""
  flash: pd.DataFrame
  fla: pd.DataFrame
  peaks: pd.DataFrame

  @classmethod
  def load(cls, reference_dir: str | None = None) -> "Anchors":
    return cls(load_flash_reference(reference_dir), load_fla_reference(reference_dir),
               load_device_peaks(reference_dir))


# The modes of the bench that time the attention core alone (``bench.CORE_MODES``; not imported: the report
# reads records, not the bench's code).
CORE_MODES = ("core", "core_forward")
# The mode whose records are a group's forward column: the model's forward for a train step, the core's
# forward for the core's forward + backward (same batch and device; ``_forward_point`` matches the rest).
FORWARD_OF = {"train": "inference", "core": "core_forward"}


def efficiency_groups(records: Sequence[dict], reference_eff: pd.DataFrame,
                      anchors: Anchors | None = None) -> list[EfficiencyGroup]:
  """One group per (mode, batch, device kind) (and attention dropout rate, where sweeps differ in it).
  ``core_forward`` records are the forward column of the ``core`` group of the same batch and device, not a
  group of their own; only where no ``core`` record of that batch and device exists are they one ("attention
  core forward only"). ``anchors``: the published anchors (default: the package's ``published/``)."""
  frame = bench_frame(records)
  if frame.empty:
    return []
  anchors = anchors or Anchors.load()
  groups = []
  cores = set(zip(*(frame[frame["mode"] == "core"][k] for k in ("batch_size", "device_kind"))))
  for (mode, batch, device), g_all in frame.groupby(["mode", "batch_size", "device_kind"], sort=True):
    if mode == "core_forward" and (batch, device) in cores:
      continue  # the forward column of that core group
    rates = g_all.get("attention_dropout", pd.Series(dtype=float))
    parts = [(None, g_all)]
    # Two sweeps at different dropout rates (some attention measured at both): one group each. Attentions
    # that differ only by their preset's own rate (LRA's reformer: none) stay together; the caption says so.
    per_attention = rates.groupby(g_all.attention).nunique()
    if (per_attention > 1).any():
      parts = [(rate, g_all[rates == rate]) for rate in sorted(rates.dropna().unique())]
      parts += [(None, g_all[rates.isna()])] if rates.isna().any() else []  # points without a config
    for rate, g_rate in parts:
      forward = frame[(frame["mode"] == FORWARD_OF.get(mode)) & (frame.batch_size == batch)
                      & (frame.device_kind == device)]
      if rate is not None and "attention_dropout" in forward:
        forward = forward[forward.attention_dropout == rate]
      # Sweeps in different compute dtypes (a float32 lease and a bfloat16 one on the same device): one group
      # each, never one table mixing them; a single dtype keeps the group (and its file names) as they were.
      dtypes = g_rate.get("compute_dtype", pd.Series(dtype=object)).fillna("not recorded")
      split = dtypes.nunique() > 1
      for dtype in sorted(dtypes.unique()) if split else [None]:
        g = g_rate[dtypes == dtype] if split else g_rate
        groups.append(_efficiency_group(mode, batch, device, g, reference_eff, rate, forward, anchors,
                                        compute_dtype=dtype))
  return groups


def _efficiency_group(mode: str, batch, device: str, g: pd.DataFrame, reference_eff: pd.DataFrame,
                      attention_dropout: float | None, forward: pd.DataFrame | None, anchors: Anchors,
                      compute_dtype: str | None = None) -> EfficiencyGroup:
  lengths = sorted(g.length.unique().tolist())
  attentions = sorted(g.attention.unique(),
                      key=lambda n: (n not in BASELINES, BASELINES.index(n) if n in BASELINES else 0, n))
  what, setting = describe(mode, int(batch), device, g)
  setting += f", {compute_dtype}" if compute_dtype else ""   # set only where the device's sweeps differ in it
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
  ordered = sorted(attentions, key=lambda a: (family_order(g.family).index(attention_family(
      a.removesuffix(RECURRENT_SUFFIX))), a not in BASELINES, BASELINES.index(a) if a in BASELINES else 0, a))
  has_forward = forward is not None and bool(len(forward)) and mode in FORWARD_OF
  checks = checks_frame(g, forward if has_forward else None, anchors.peaks, ordered)
  # a forward column only where some row has its forward point (else the caption says none was recorded)
  has_forward = has_forward and bool(checks.get("forward_status", pd.Series(dtype=object)).notna().any())
  return EfficiencyGroup(mode, int(batch), device, g, speed, memory, flops, published, COMPILED_MEMORY,
                         peak_memory, crossover_table(crossovers, what, setting, lengths), crossovers, what,
                         setting, attention_dropout, checks_table(checks, mode, what, setting, has_forward),
                         checks, anchors_tables(checks, mode, setting, anchors.flash, anchors.fla), compute_dtype)


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


# ----------------------------------------------------------------------------------------------------
# Ratios a reader can check: time, ratio to flash, achieved FLOP/s against the device's peak and against
# the published FlashAttention figures.

FUSED_IMPLEMENTATIONS = ("cudnn", "pallas")  # attention_zoo/flash.py: the fused kernels of jax's attention


def is_fused(implementation) -> bool:
  """Whether a record's ``attention_implementation`` names a fused kernel (cuDNN's or the Pallas one)."""
  return isinstance(implementation, str) and implementation.strip().lower() in FUSED_IMPLEMENTATIONS


def row_label(attention: str, implementation) -> str:
  """The name a point is shown under in the checks and anchors tables: ``flash`` only where its record says
  the fused kernel ran, else ``flash (unfused: xla)`` / ``flash (unfused: not recorded)``."""
  if attention != "flash" or is_fused(implementation):
    return attention
  shown = implementation if isinstance(implementation, str) and implementation else "not recorded"
  return f"flash (unfused: {shown})"


def fa2_attention_flops(batch: int, heads: int, length: int, head_dim: int, *, backward: bool = True,
                        causal: bool = False) -> float:
  """FlashAttention-2's FLOP count of exact attention (Dao 2023, Fig. 4's convention): 4·B·H·L²·D for the
  forward pass (two matrix products), 2.5 times that for the backward pass (so 3.5 times for forward +
  backward), halved when causal."""
  total = 4.0 * batch * heads * length * length * head_dim * (3.5 if backward else 1.0)
  return total / 2 if causal else total


# ``matmul_precision`` values (the records' field, ``training.steps.matmul_precision``) under which float32
# products run on TF32 tensor cores on an NVIDIA GPU, and as true float32. None (not recorded) on a GPU is
# JAX's default there: TF32 on every GPU this project has used (compute capability >= 8.0).
_TF32 = (None, "", "default", "default (tf32 on gpu)", "high", "tensorfloat32", "tf32")
_FP32 = ("highest", "float32", "fp32", "default (gpu: float32)", "default (cpu: float32)")


def peak_compute(dtype: str | None, matmul_precision, backend) -> tuple[str | None, str]:
  """(the row of ``device_peak_flops.csv``'s ``compute`` column a point is held against, why): bfloat16 as
  itself; float32 on a GPU at the default matmul precision as TF32 (XLA runs float32 dots on TF32 tensor
  cores there), at ``highest`` as FP32; None where the dtype or the precision says nothing known."""
  if not dtype:
    return None, "compute dtype not recorded"
  dtype = str(dtype).lower()
  if dtype in ("bfloat16", "bf16"):
    return "bfloat16", "bfloat16"
  if dtype in ("float32", "fp32"):
    precision = matmul_precision.lower() if isinstance(matmul_precision, str) else matmul_precision
    if backend != "gpu" or precision in _FP32:
      return "float32", "float32" + ("" if backend != "gpu" else f", matmul precision {matmul_precision}")
    if precision in _TF32:
      said = "not recorded (JAX's default)" if precision is None else precision
      return "tf32", f"float32 at matmul precision {said} = TF32 tensor cores"
    return None, f"float32 at matmul precision {matmul_precision}: no peak known"
  return None, f"{dtype}: no peak known"


def peak_flops(peaks: pd.DataFrame, device_kind, compute: str | None) -> tuple[float | None, str | None]:
  """(peak FLOP/s, source) of ``device_kind`` (exact string) in ``compute``; (None, None) where unknown."""
  if compute is None or peaks is None or peaks.empty:
    return None, None
  rows = peaks[(peaks.device_kind == device_kind) & (peaks.compute == compute)]
  value = number(rows.iloc[0].peak_tflops) if len(rows) else None
  return (value * 1e12, rows.iloc[0].source) if value is not None else (None, None)


def _rate(flops_per_second: float | None) -> str:
  if flops_per_second is None:
    return "—"
  for unit, size in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
    if flops_per_second >= size:
      return f"{flops_per_second / size:.3g} {unit}"
  return f"{flops_per_second:.3g} FLOP/s"


def _seconds(value: float | None) -> str:
  return "—" if value is None else f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _timed(point: pd.Series | None) -> float | None:
  return _metric_value(point, "step_seconds_median")


# What a core's forward point shares with its forward + backward point besides the attention, the length, the
# batch and the device (a ``core_forward`` record of other heads, dropout, causality or dtype is another point).
FORWARD_MATCH = ("num_heads", "head_dim", "attention_dropout", "causal", "compute_dtype")


def _same(a, b) -> bool:
  missing = lambda v: v is None or (isinstance(v, float) and np.isnan(v))
  return (missing(a) and missing(b)) or (not missing(a) and not missing(b) and a == b)


def _forward_point(forward: pd.DataFrame | None, p: pd.Series, attention: str, length: int) -> pd.Series | None:
  """The forward point of ``p`` (``attention`` at ``length``) in ``forward`` (records of the group's batch and
  device): the model's forward (``inference``) for a train step; for the core's forward + backward, the
  ``core_forward`` point that also has its ``FORWARD_MATCH`` fields."""
  if forward is None or not len(forward):
    return None
  rows = forward[(forward.attention == attention) & (forward.length == length)]
  if p.get("mode") == "core":
    for field in FORWARD_MATCH:
      if field in rows:
        rows = rows[[_same(v, p.get(field)) for v in rows[field]]]
  return rows.iloc[-1] if len(rows) else None


def _fa2_count(p: pd.Series, length: int, *, backward: bool) -> float | None:
  """FlashAttention-2's count of ``p``'s exact attention (its batch, heads and head dim); None where ``p`` is
  not exact attention timed alone or its shape is not recorded."""
  shape = [_number(p.get(k)) for k in ("batch_size", "num_heads", "head_dim")]
  if p.get("family") != "exact" or p.get("mode") not in CORE_MODES or any(v is None for v in shape):
    return None
  return fa2_attention_flops(*(int(v) for v in shape[:2]), int(length), int(shape[2]), backward=backward,
                             causal=bool(p.get("causal")))


def checks_frame(g: pd.DataFrame, forward: pd.DataFrame | None, peaks: pd.DataFrame | None,
                 attentions: Sequence[str]) -> pd.DataFrame:
  """One row per (attention, length) of a group: forward time (``forward_seconds``; the model's forward, an
  ``inference`` record of the same batch and device, in mode ``train``; the core's forward, the
  ``core_forward`` record of the same batch, device, heads, head dim, attention dropout, causality and dtype,
  in mode ``core``; ``forward_status`` None where there is no such record), the step's time (the group's
  median step), its ratio to ``flash`` at that length, the model's FLOP/s (XLA's count / the median step)
  and its fraction of the device's peak (``peak_compute``), and for exact attention timed alone (modes
  ``core`` / ``core_forward``) FlashAttention-2's FLOP count of the step and the FLOP/s it gives, and of
  the forward (``fa2_forward_flops``: 4·B·H·L²·D, over the forward time)."""
  rows = []
  for a in attentions:
    for length in sorted(g[g.attention == a].length.unique().tolist()):
      p = _point(g, a, length)
      step = _timed(p)
      flash_point = _point(g, "flash", length)
      flash = _timed(flash_point)
      forward_point = _forward_point(forward, p, a, length)
      fwd = _timed(forward_point)
      flops = _metric_value(p, "flops_per_step")
      compute, compute_text = peak_compute(p.get("compute_dtype"), p.get("matmul_precision"), p.get("backend"))
      peak, peak_source = peak_flops(peaks, p.get("device_kind"), compute)
      model_rate = flops / step if flops is not None and step else None
      fa2 = _fa2_count(p, length, backward=p.get("mode") == "core")
      fa2_forward = _fa2_count(p, length, backward=False) if forward_point is not None else None
      rows.append({"attention": a, "label": row_label(a, p.get("attention_implementation")),
                   "family": p.get("family"), "device_kind": p.get("device_kind"), "length": int(length),
                   "batch_size": p.get("batch_size"), "num_heads": p.get("num_heads"), "head_dim": p.get("head_dim"),
                   "causal": bool(p.get("causal")), "status": p["status"],
                   "compile_only": bool(p["compile_only"]), "forward_seconds": fwd,
                   "forward_status": _status_text(forward_point, "ok") if forward_point is not None else None,
                   "step_seconds": step,
                   "vs_flash": _ratio(step, flash) if a != "flash" else None,
                   "flash_status": None if flash_point is None else flash_point["status"],
                   "flops_per_step": flops, "model_flops_per_second": model_rate,
                   "compute_dtype": p.get("compute_dtype"), "compute_dtype_from": p.get("compute_dtype_from"),
                   "matmul_precision": p.get("matmul_precision"), "peak_compute": compute,
                   "peak_compute_note": compute_text, "peak_flops_per_second": peak, "peak_source": peak_source,
                   "fraction_of_peak": model_rate / peak if model_rate is not None and peak else None,
                   "attention_implementation": p.get("attention_implementation"),
                   "fa2_attention_flops": fa2,
                   "fa2_attention_flops_per_second": fa2 / step if fa2 is not None and step else None,
                   "fa2_forward_flops": fa2_forward,
                   "fa2_forward_flops_per_second": fa2_forward / fwd if fa2_forward is not None and fwd else None})
  return pd.DataFrame(rows)


def _status_text(row, ok: str | None = None) -> str | None:
  """A point's status as a cell: ``OOM``, ``failed``, ``compiled only``; ``ok`` for a timed point."""
  if row["status"] != "ok":
    return {"oom": "OOM"}.get(row["status"], row["status"])
  return "compiled only" if row["compile_only"] else ok


def _says_nothing(cell: str) -> bool:
  """A cell of ``checks_table`` that carries no measurement (a column of only these is left out)."""
  return cell in ("", "—", "not recorded", "n/a: the step is the whole model") or cell.startswith("peak not known")


STEP_TITLES = {"train": "fwd+bwd+AdamW", "inference": "model forward", "core": "fwd+bwd", "core_forward": "forward"}


def _forward_cell(r: dict, mode: str, status: str | None, has_forward: bool) -> str:
  """The forward column of a ``checks_table`` row: the step itself in mode inference (the model's forward);
  nothing in mode core_forward (its step column, "forward", is the forward); else the forward point's time
  (``checks_frame``), its status where it has no time, — where there is none."""
  if mode == "inference":
    return _seconds(_number(r["step_seconds"])) if status is None else status
  if mode == "core_forward":
    return ""
  if not has_forward:
    return "not recorded"
  forward_status = r.get("forward_status")
  if not isinstance(forward_status, str):
    return "—"
  return _seconds(_number(r["forward_seconds"])) if forward_status == "ok" else forward_status


def checks_table(checks: pd.DataFrame, mode: str, what: str, setting: str, has_forward: bool) -> Table:
  """``checks_frame`` for display: one row per attention and length."""
  step_title = STEP_TITLES.get(mode, "step")
  columns = ["Attention", "L", "forward", step_title, "× flash", "model FLOP/s (XLA)", "of peak",
             "attention FLOP/s (FA2 count)", "forward attention FLOP/s (FA2 count)"]
  rows = []
  for r in checks.to_dict("records"):
    status = _status_text(r)
    forward = _forward_cell(r, mode, status, has_forward)
    fa2_forward = _number(r.get("fa2_forward_flops_per_second"))
    forward_attention = _rate(fa2_forward) if fa2_forward is not None else "—"
    if status is not None and r["status"] != "ok":
      rows.append([r["label"], str(r["length"]), forward if mode != "inference" else status, status, "", "", "", "",
                   forward_attention])
      continue
    step = _seconds(_number(r["step_seconds"])) if status is None else status
    ratio = _number(r["vs_flash"])
    fraction = _number(r["fraction_of_peak"])
    model = _number(r["model_flops_per_second"])
    if fraction is not None:
      of_peak = f"{100 * fraction:.3g} %"
    elif model is None:
      of_peak = "—"
    elif r["peak_compute"] is None:
      of_peak = f"peak not known ({r['peak_compute_note']})"
    else:
      of_peak = "peak not known"
    fa2 = _number(r["fa2_attention_flops_per_second"])
    attention = _rate(fa2) if fa2 is not None else (
        "—" if r["family"] != "exact" else "n/a: the step is the whole model" if mode not in CORE_MODES else "—")
    vs_flash = (f"{ratio:.2f}×" if ratio is not None else "flash OOM" if r["flash_status"] == "oom"
                and r["attention"] != "flash" else "")
    rows.append([r["label"], str(r["length"]), forward, step, vs_flash,
                 _rate(model), of_peak, attention, forward_attention])
  # a column that says nothing in any row (forward never recorded, no flash to compare with, no known peak,
  # no exact attention timed alone, no forward of one) is left out; the caption says why
  empty = [i for i in (2, 4, 6, 7, 8) if all(_says_nothing(row[i]) for row in rows)]
  columns = [c for i, c in enumerate(columns) if i not in empty]
  rows = [[cell for i, cell in enumerate(row) if i not in empty] for row in rows]
  used = checks.dropna(subset=["peak_flops_per_second"]).drop_duplicates(["peak_compute", "device_kind"])
  peaks = "; ".join(f"{r.peak_compute_note}: peak {r.peak_flops_per_second / 1e12:g} TFLOP/s dense "
                    f"({r.peak_source}, published/device_peak_flops.csv)" for r in used.itertuples())
  notes = sorted({r["peak_compute_note"] for r in checks.to_dict("records") if r["peak_compute"] is None})
  read_from = checks.get("compute_dtype_from", pd.Series(dtype=object)).dropna()
  sources = sorted({f for f in read_from if f != "compute_dtype"})
  dtype_text = (f"; compute dtype read from the record's {' / '.join(sources)} (compute_dtype not recorded)"
                if sources else "")
  forward_text = {
      ("core", True): "forward: the core's forward alone (mode core_forward: the same call on the same inputs, "
                      "deterministic=False with attention dropout, of the same batch, device, heads, head dim, "
                      "attention dropout, causality and dtype; — : no such point)",
      ("core", False): "forward: not recorded (no mode-core_forward record of this batch and device; `lra-bench "
                       "bench --mode core_forward` times the core's forward alone)",
      ("core_forward", False): "forward: the step (this mode times the core's forward alone; no mode-core "
                               "record of this batch and device to set it beside)",
      ("train", True): "forward: the model's forward (mode inference, same batch and device; — : no such point)",
      ("train", False): "forward: not recorded (no mode-inference record of this batch and device)",
  }.get((mode, has_forward), "forward: the model's forward (this mode)")
  return Table(columns, rows, left=1, caption=(
      f"Time, ratio to flash and achieved FLOP/s, {what}; {setting}. Median seconds per step; "
      f"{forward_text}. × flash: the {step_title} time over flash's at the same length"
      + ("" if (checks.get("attention", pd.Series(dtype=object)) == "flash").any() else " (no flash records here)")
      + ". Model FLOP/s: XLA's "
      "cost-analysis FLOPs per step over the median step time (XLA may not count the FLOPs inside a fused "
      "custom call such as cuDNN's attention, so a fused flash can be understated). Of peak: that over the "
      f"device's dense peak for the compute dtype{dtype_text}; "
      + (peaks if peaks else "peak not known for this device (none is invented)")
      + (f"; not held against a peak: {'; '.join(notes)}" if notes else "")
      + ". Attention FLOP/s (exact attention timed alone, modes core and core_forward): FlashAttention-2's "
      "count 4·B·H·L²·D forward, ×3.5 forward + backward (the backward's 5 matrix products: FA2 recomputes the "
      "scores), ÷2 causal, over the median time, the rate FA2's Fig. 4 prints for every implementation "
      "(Published anchors); forward attention FLOP/s: the forward count over the forward time. A flash row "
      "whose record does not say the fused kernel ran (attention_implementation cudnn or pallas) is labelled "
      "flash (unfused: …)."))


def _fa_value(flash_ref: pd.DataFrame, implementation: str, head_dim: int, length: int, causal: str = "false"):
  rows = flash_ref[(flash_ref.implementation == implementation) & (flash_ref.head_dim == str(head_dim))
                   & (flash_ref.seq_len == str(length)) & (flash_ref.causal == causal)
                   & (flash_ref.direction == "fwd+bwd")]
  if rows.empty:
    return "—"
  value = rows.iloc[0].tflops
  return f"{value} TFLOP/s" if number(value) is not None else value or "not given"


def anchors_tables(checks: pd.DataFrame, mode: str, setting: str, flash_ref: pd.DataFrame,
                   fla_ref: pd.DataFrame) -> list[Table]:
  """The "Published anchors": FlashAttention-2's forward + backward TFLOP/s per length beside our exact
  rows' attention FLOP/s (FA2's count; mode core only, the measure FA2 reports: a core_forward group's rows
  are forward only), and fla's op timings as a
  reference table of its own (causal, another device: not compared cell by cell)."""
  tables = []
  if flash_ref is not None and not flash_ref.empty:
    fa2 = flash_ref[flash_ref.source == "dao_2023_fa2_fig4"]
    lengths = sorted({int(n) for n in fa2.seq_len if n.isdigit()})
    exact = checks[checks.family == "exact"] if len(checks) else checks
    labels = list(dict.fromkeys(exact.label)) if len(exact) else []
    head_dims = sorted({int(v) for v in exact.get("head_dim", pd.Series(dtype=float)).dropna()}) \
        if "head_dim" in exact else []
    columns = ["L", *[f"ours: {label}" for label in labels], "FA2 hd 64", "FA2 hd 128", "PyTorch standard hd 64"]
    rows = []
    for length in sorted(set(lengths) | set(exact.length.tolist() if len(exact) else [])):
      ours = []
      for label in labels:
        hit = exact[(exact.label == label) & (exact.length == length)]
        value = _number(hit.iloc[0].fa2_attention_flops_per_second) if len(hit) and mode == "core" else None
        ours.append(_rate(value) if value is not None else "—" if mode == "core" else "not comparable")
      rows.append([str(length), *ours, _fa_value(fa2, "FlashAttention-2", 64, length),
                   _fa_value(fa2, "FlashAttention-2", 128, length),
                   _fa_value(fa2, "PyTorch standard attention", 64, length)])
    fa3 = flash_ref[flash_ref.source == "shah_2024_fa3_sec4_1"]
    fa3_text = "; ".join(f"{r.tflops} TFLOP/s {r.direction}" + (f" hd {r.head_dim} L {r.seq_len}" if r.seq_len else "")
                         + f" ({r.note})" for r in fa3.itertuples())
    ours_text = ("ours: attention FLOP/s with FA2's count (non-causal, head dim "
                 f"{'/'.join(map(str, head_dims)) or 'not recorded'}; {setting})" if mode == "core" else
                 "ours: not comparable in mode core_forward (the core's forward only, where the figure is forward "
                 "+ backward; `lra-bench bench --mode core` times both)" if mode == "core_forward" else
                 f"ours: not comparable in mode {mode} (the step is the whole model, not the attention alone; "
                 "`lra-bench bench --mode core` times the core alone)")
    tables.append(Table(columns, rows, left=1, caption=(
        "Published anchors: FlashAttention-2 forward + backward, non-causal (Dao 2023, Fig. 4: A100 80GB "
        "SXM4, 16K tokens in all, hidden 2048; FLOPs 4·L²·D·H forward ×3.5) beside " + ours_text
        + ". A different GPU and software: a row sits beside FA2's figure to show the order of magnitude, "
        "not to rank. — : not in the figure / no record. "
        + (f"FlashAttention-3 (Shah et al. 2024, §4.1, H100 SXM5, the same setup, forward only): {fa3_text}."
           if fa3_text else ""))))
  if fla_ref is not None and not fla_ref.empty:
    ops = list(dict.fromkeys(fla_ref.op))
    shapes = list(dict.fromkeys(zip(fla_ref.direction, fla_ref.batch, fla_ref.seq_len, fla_ref.heads,
                                    fla_ref.head_dim)))
    rows = []
    for direction, b, t, h, d in shapes:
      hit = fla_ref[(fla_ref.direction == direction) & (fla_ref.batch == b) & (fla_ref.seq_len == t)
                    & (fla_ref.heads == h) & (fla_ref.head_dim == d)]
      ms = {r.op: r.ms for r in hit.itertuples()}
      rows.append([direction, b, t, h, d or "not given", *[ms.get(op, "—") for op in ops]])
    first = fla_ref.iloc[0]
    tables.append(Table(["direction", "B", "T", "H", "D", *[f"{op} ({FLA_LAYERS.get(op, '—')}) ms" for op in ops]],
                        rows, left=1, caption=(
        f"Published reference: fla's op timings (fla-org/flash-linear-attention README, {first.hardware}, "
        f"{first.software}), milliseconds; in brackets our layer of the same recurrence. Causal kernels, "
        "where our rows run non-causal (the LRA encoder is bidirectional) on other hardware and shapes: a "
        "reference for the ratios between the layers, not a number to compare ours with.")))
  return tables
