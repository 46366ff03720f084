"""The recall section of the report: next-token tasks (MQAR, associative recall, induction heads).

One table per protocol and task: a row per attention, a column per setting (length, key-value pairs,
width), each cell the best test accuracy over the protocol's learning-rate sweep (the recall protocols
report the best run; SSMs solve these tasks only in a narrow window of rates), its 95 % Wilson interval
over the labelled test positions and how many runs were tried. The published value of the same cell
(``lra_bench/report/published/recall_accuracy.csv``, with its source and protocol) sits beside it. Two figures:
accuracy against the recurrent state a causal model keeps (the Based paper's trade-off) and against the
width per length (Zoology's Fig. 2).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import pandas as pd

import attention_zoo
import tasks as tasks_lib
from lra_bench.report.accuracy import wilson_interval
from lra_bench.report.tables import Table

REFERENCE_FILE = "recall_accuracy.csv"
# The published rows name models; ours name attention cores and mixers. These are the ones we have.
PUBLISHED_ATTENTION = {"Transformer": "vanilla", "Attention": "vanilla", "S4D": "s4d", "LRU": "lru"}
# Where a source's model of that name is another layer: seq_icl's "LRU" is its own gated layer
# (``seq_icl_lru``), not the LRU paper's (``lru``).
PROTOCOL_ATTENTION = {"seq_icl": {"LRU": "seq_icl_lru"}}


def published_attention(protocol: str, model: str) -> str | None:
  """Our attention or mixer that is ``model`` of the published rows of ``protocol`` (None: not ours): the
  tables above, else the registered layer whose config's ``paper_name`` names that model
  (``reference.published_layer``: e.g. Kimi Linear's "GDN" is ``gated_deltanet``)."""
  from lra_bench.report.reference import published_layer

  known = PROTOCOL_ATTENTION.get(protocol, {}).get(model, PUBLISHED_ATTENTION.get(model))
  return known if known is not None else published_layer(model)


is_recall = tasks_lib.is_next_token


def _get(config: dict, dotted: str):
  node = config
  for part in dotted.split("."):
    if not isinstance(node, dict) or part not in node:
      return None
    node = node[part]
  return node


def state_size(attention: str, config: dict) -> tuple[int | None, str]:
  """(scalars of causal state per layer and example at the run's length and width, why not when None)."""
  function = getattr(attention_zoo, "state_size", None)
  if function is None:
    return None, "state sizes not available"
  heads = _get(config, "model.num_heads") or 1
  width = _get(config, "model.qkv_dim") or 0
  kwargs = {k: v for k, v in (_get(config, "model.attention_kwargs") or {}).items() if k != "causal"}
  d_model = _get(config, "model.emb_dim")
  try:
    return function(attention, int(_get(config, "data.max_length")), int(heads), int(width) // int(heads),
                    d_model=None if d_model is None else int(d_model), **kwargs)
  except (ValueError, TypeError) as err:
    return None, str(err)


# A run whose last evaluation is its best and this many points above the one before was still climbing
# when its budget ended (MQAR's jumps to recall take ~2 000 steps): its number bounds the method from
# below, it does not measure where the method ends.
RISING_POINTS = 5.0
RISING_MARK = "↑"
# A cell whose run set something differently from the recipe of the published rows beside it
# (``published_difference``); a footnote says what, per difference.
DIFFERS_MARK = "≠"


def still_rising(curve: Sequence | None) -> bool:
  """True when the validation curve ``[[step, accuracy], ...]`` (accuracy a fraction) ends on its best
  evaluation at least ``RISING_POINTS`` points above the previous one; False with fewer than two."""
  accuracy = [100.0 * float(point[1]) for point in curve or []]
  return len(accuracy) >= 2 and accuracy[-1] >= max(accuracy) and accuracy[-1] - accuracy[-2] >= RISING_POINTS


def recall_frame(records: Sequence[dict]) -> pd.DataFrame:
  """One row per finished (``ok``) run of a recall task: its setting, learning rate and accuracy."""
  rows = []
  for r in records:
    if r.get("kind", "train") != "train" or r.get("status") != "ok" or not is_recall(r.get("task", "")):
      continue
    config = r.get("config") or {}
    labels = r.get("test_labels") or r.get("test_examples")
    metric = r.get("metric", "accuracy")
    if metric == "macro":  # a mean of per-class accuracies is not one binomial proportion: no interval
      labels = None
    size, why = state_size(r["attention"], config)
    # The task's length setting, as the papers name it (induction_head 256, assoc_recall 384), not the
    # model's input length (257 and 386: the query and separator tokens ride on top of it).
    seq_len = _get(config, "data.prepare.seq_len")
    seq_len = _get(config, "data.max_length") if _missing(seq_len) else seq_len
    differs = published_difference(r["protocol"], r["attention"], config)
    rows.append({"protocol": r["protocol"], "task": r["task"], "attention": r["attention"], "seed": r["seed"],
                 "seq_len": seq_len, "kv": _get(config, "data.prepare.num_kv_pairs"),
                 "d_model": _get(config, "model.emb_dim"), "lr": _get(config, "optimizer.learning_rate"),
                 "accuracy": 100.0 * float(r["test_accuracy"]), "labels": labels,
                 "train_steps": r.get("train_steps"), "wall_seconds": r.get("wall_seconds"),
                 "state_size": size, "state_note": why, "config_hash": r.get("config_hash"), "metric": metric,
                 "rising": still_rising(r.get("val_curve")), "differs": differs})
  return pd.DataFrame(rows, columns=["protocol", "task", "attention", "seed", "seq_len", "kv", "d_model", "lr",
                                     "accuracy", "labels", "train_steps", "wall_seconds", "state_size",
                                     "state_note", "config_hash", "metric", "rising", "differs"])


def published_difference(protocol: str, attention: str, config: dict) -> str | None:
  """What a run of ``attention`` under ``protocol`` with ``config`` (its record's stored config) set
  differently from the recipe of the published rows beside it (``published_protocol``): the protocol
  module's ``published_difference(attention, config)`` where the record's own config decides it (e.g.
  ``recall_cpu``'s block), else its ``PUBLISHED_DIFFERENCES`` entry; "" = the same recipe, None = not
  stated (a protocol that is its own published source, or an attention its module does not list)."""
  from lra_bench.report.reference import protocol_module, published_differences

  module = protocol_module(protocol)
  function = getattr(module, "published_difference", None)
  if function is not None:
    return function(attention, config)
  return published_differences(protocol).get(attention)


SETTING = ["protocol", "task", "seq_len", "kv", "d_model", "attention"]


def best_of_sweep(frame: pd.DataFrame) -> pd.DataFrame:
  """Per setting and attention: the best accuracy over the swept learning rates (per seed, then the mean
  over seeds), the learning rate that gave it (seed 0's or the first seed's), how many runs, and whether
  a best run was still rising at its end (``still_rising``, any seed)."""
  if frame.empty:
    return frame.assign(runs=[], best_lr=[], ci_low=[], ci_high=[], rising=[])
  keys = [k for k in SETTING]
  filled = frame.assign(kv=frame["kv"].fillna(-1))
  best_per_seed = filled.loc[filled.groupby(keys + ["seed"], dropna=False)["accuracy"].idxmax()]
  rows = []
  for key, group in best_per_seed.groupby(keys, dropna=False):
    tried = filled
    for k, v in zip(keys, key):
      tried = tried[tried[k] == v]
    first = group.sort_values("seed").iloc[0]
    mean = float(group["accuracy"].mean())
    labels = int(group["labels"].min()) if group["labels"].notna().all() else None
    interval = wilson_interval(mean / 100.0, labels) if labels else None
    rows.append({**dict(zip(keys, key)), "accuracy": mean, "seeds": len(group), "runs": len(tried),
                 "best_lr": first["lr"], "labels": labels, "state_size": first["state_size"],
                 "ci_low": None if interval is None else 100.0 * interval[0],
                 "ci_high": None if interval is None else 100.0 * interval[1],
                 "rising": bool(group["rising"].any()),
                 "differs": first["differs"]})
  out = pd.DataFrame(rows)
  out["kv"] = out["kv"].where(out["kv"] != -1, None)
  return out


def load_reference(reference_dir: str | None) -> pd.DataFrame:
  """The published recall accuracies (columns: source, protocol, model, task, seq_len, kv, d_model,
  accuracy, note); empty when the file is absent."""
  from lra_bench.report.reference import DEFAULT_REFERENCE_DIR

  columns = ["source", "protocol", "model", "task", "seq_len", "kv", "d_model", "accuracy", "note"]
  path = os.path.join(reference_dir or DEFAULT_REFERENCE_DIR, REFERENCE_FILE)
  if not os.path.exists(path):
    return pd.DataFrame(columns=columns)
  return pd.read_csv(path)


def _setting_label(seq_len, kv, d_model) -> str:
  parts = [f"L={int(seq_len)}"]
  if not _missing(kv):
    parts.append(f"kv={int(kv)}")
  if d_model is not None:
    parts.append(f"d={int(d_model)}")
  return " ".join(parts)


def _cells_text(cells: Sequence[tuple[str, str]], filled: dict[str, int]) -> str:
  """"every cell", or "`a`, `b` (L=64 kv=4 d=64), `c`": an attention alone where all of its ``filled[a]``
  cells of the table are listed."""
  if len(cells) == sum(filled.values()):
    return "every cell"
  per_attention: dict[str, list[str]] = {}
  for attention, setting in cells:
    per_attention.setdefault(attention, []).append(setting)
  return ", ".join(f"`{a}`" if len(s) == filled[a] else f"`{a}` ({', '.join(s)})" for a, s in per_attention.items())


def _missing(value) -> bool:
  """A setting without this axis (no kv pairs outside MQAR): None, or the NaN pandas turns it into."""
  return value is None or (isinstance(value, float) and math.isnan(value))


def _published(reference: pd.DataFrame, protocol: str, task: str, model: str, seq_len, kv, d_model) -> float | None:
  if reference.empty:
    return None
  rows = reference[(reference["protocol"] == protocol) & (reference["task"] == task) & (reference["model"] == model)]
  for column, value in (("seq_len", seq_len), ("kv", kv), ("d_model", d_model)):
    if _missing(value):
      continue
    rows = rows[rows[column].isna() | (rows[column] == value)]
  return float(rows["accuracy"].iloc[0]) if len(rows) else None


@dataclasses.dataclass
class RecallReport:
  protocol: str
  best: pd.DataFrame
  tables: list[Table]
  frame: pd.DataFrame


def published_protocol(protocol: str) -> str:
  """The protocol whose published rows sit beside ``protocol``'s: its own, or the original it shortens
  (a protocol module's ``PUBLISHED_PROTOCOL``, e.g. ``recall_cpu`` -> ``zoology``: the same data setting,
  trained for less)."""
  import importlib

  try:
    return getattr(importlib.import_module(f"configs.{protocol}"), "PUBLISHED_PROTOCOL", protocol)
  except ImportError:
    return protocol


def no_causal_forms(names: Sequence[str] | None = None) -> dict[str, str]:
  """layer -> why it has no causal form, over the registered attention cores (or ``names``, of either kind)."""
  reasons = {name: attention_zoo.no_causal_form(name) for name in names or attention_zoo.list_attentions()}
  return {name: why for name, why in reasons.items() if why}


def recall_tables(frame: pd.DataFrame, protocol: str, reference: pd.DataFrame,
                  no_causal: dict[str, str] | None = None) -> RecallReport:
  """The protocol's tables (one per task) with the published values beside ours (those of the protocol it
  shortens, ``published_protocol``, labelled with that protocol)."""
  mine = frame[frame["protocol"] == protocol]
  source_protocol = published_protocol(protocol)
  best = best_of_sweep(mine)
  tables = []
  for task in sorted(best["task"].unique()) if not best.empty else []:
    rows_of_task = best[best["task"] == task]
    settings = (rows_of_task[["seq_len", "kv", "d_model"]].drop_duplicates()
                .sort_values(["seq_len", "d_model"], na_position="first").itertuples(index=False))
    settings = list(settings)
    columns = ["Attention"] + [_setting_label(*s) for s in settings]
    rows, bold = [], set()
    attentions = sorted(rows_of_task["attention"].unique(), key=lambda n: (n != "vanilla", n))
    values: dict[tuple[int, int], float] = {}
    differing: dict[str, list[tuple[str, str]]] = {}   # what differs -> the cells (attention, setting)
    filled: dict[str, int] = {}                          # attention -> its cells with a run
    for i, attention in enumerate(attentions):
      row = [attention]
      for j, (seq_len, kv, d_model) in enumerate(settings):
        cell = rows_of_task[(rows_of_task["attention"] == attention) & (rows_of_task["seq_len"] == seq_len)
                            & (rows_of_task["d_model"] == d_model)
                            & (rows_of_task["kv"].isna() if _missing(kv) else rows_of_task["kv"] == kv)]
        if cell.empty:
          row.append("—")
          continue
        c = cell.iloc[0]
        filled[attention] = filled.get(attention, 0) + 1
        interval = "" if c["ci_low"] is None or pd.isna(c["ci_low"]) else f" [{c['ci_low']:.1f}, {c['ci_high']:.1f}]"
        mark = f" {RISING_MARK}" if c["rising"] else ""
        differs = c.get("differs")
        if isinstance(differs, str) and differs:
          mark += f" {DIFFERS_MARK}"
          differing.setdefault(differs, []).append((attention, _setting_label(seq_len, kv, d_model)))
        row.append(f"{c['accuracy']:.1f}{mark}{interval} ({int(c['runs'])} run{'s' if c['runs'] != 1 else ''})")
        values[i, j + 1] = float(c["accuracy"])
      rows.append(row)
    for j in range(1, len(columns)):  # the best of ours per setting in bold
      column = {cell: v for cell, v in values.items() if cell[1] == j}
      bold |= {cell for cell, v in column.items() if v == max(column.values())}
    published_models = [] if reference.empty else sorted(
        reference[(reference["protocol"] == source_protocol) & (reference["task"] == task)]["model"].unique())
    label = "published" if source_protocol == protocol else f"published ({source_protocol})"
    for model in published_models:
      values = [_published(reference, source_protocol, task, model, *s) for s in settings]
      if any(v is not None for v in values):
        ours = published_attention(source_protocol, model)
        rows.append([f"{label}: {model}" + (f" (= {ours})" if ours else "")]
                    + ["—" if v is None else f"{v:.1f}" for v in values])
    footnotes = [
        "Ours: best test accuracy (%) over the runs of the setting (the protocol's learning-rate sweep), the "
        "mean over seeds; [95 % Wilson interval] over the labelled test positions; (runs tried); the best of "
        "ours per setting in bold.",
        "published: the source's value for the same setting (lra_bench/report/published/recall_accuracy.csv: "
        "source and protocol columns); pixel reads of a figure are ±3 points."
        + ("" if source_protocol == protocol else
           f" `{protocol}` shortens `{source_protocol}`'s training: the same data setting, fewer steps.")]
    if rows_of_task["rising"].any():
      footnotes.append(f"{RISING_MARK}: still rising when its training ended (its last validation accuracy is its best "
                       f"and {RISING_POINTS:.0f}+ points above the evaluation before): a lower bound set by the "
                       "budget, not where the method ends.")
    for differs, cells in differing.items():
      footnotes.append(f"{DIFFERS_MARK}: set differently from the recipe of the published rows "
                       f"(`{source_protocol}`'s): {differs} — {_cells_text(cells, filled)}.")
    if (mine[mine["task"] == task]["metric"] == "macro").any():
      footnotes.append("Macro accuracy, as MAD reports it (torchmetrics' default): the mean over the value "
                       "tokens of each one's accuracy on the test labels (a value predicted but never a label "
                       "counts as 0); no interval, as it is not one proportion. Records also carry the micro "
                       "accuracy (`test_accuracy_micro`).")
    if no_causal:
      footnotes.append("No causal form (not run on next-token tasks): " + ", ".join(sorted(no_causal)) + ".")
    tables.append(Table(columns, rows, bold, caption=f"Recall — protocol `{protocol}`, task `{task}`",
                        footnotes=footnotes))
  return RecallReport(protocol, best, tables, mine)


def state_size_figure(best: pd.DataFrame, title: str, out_stem: str) -> list[str]:
  """Accuracy against state size (log x), one panel per (task, length), one labelled point per
  attention (its best width) — the Based paper's trade-off. Labels never overlap each other or a point
  and stay inside their panel (:func:`plots.label_points`)."""
  from lra_bench.report import plots

  data = best.dropna(subset=["state_size"])
  if data.empty:
    return []
  panels = list(data.groupby(["task", "seq_len"]).groups)
  plt = plots.pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
  parts, any_rising = [], False
  for ax, (task, seq_len) in zip(axes[0], panels):
    part = data[(data["task"] == task) & (data["seq_len"] == seq_len)]
    part = part.loc[part.groupby("attention")["accuracy"].idxmax()]
    parts.append(part)
    x = part["state_size"].astype(float).to_numpy()
    y = part["accuracy"].to_numpy()
    rising = part["rising"].to_numpy(bool)
    ax.scatter(x[~rising], y[~rising], s=22, color="tab:blue", zorder=3)
    ax.scatter(x[rising], y[rising], s=22, facecolors="white", edgecolors="tab:blue", zorder=3)
    any_rising = any_rising or bool(rising.any())
    lo, hi = float(x.min()), float(x.max())
    plots.set_log_axis(ax, "x", x, ticks=plots.nice_log_ticks(lo / 1.3, hi * 1.3, max_ticks=5))
    ax.set_ylim(-2, 105)
    ax.set_xlabel("causal state per layer (scalars, log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{task}, L = {int(seq_len)}", fontsize=10)
    ax.grid(alpha=0.3)
  fig.suptitle(title, fontsize=11)
  fig.subplots_adjust(wspace=0.3)
  if any_rising:
    _rising_note(fig)
  for ax, part in zip(axes[0], parts):  # once the layout is final: labels are placed in display units
    plots.label_points(ax, part["state_size"].astype(float).to_numpy(), part["accuracy"].to_numpy(),
                       list(part["attention"]), fontsize=7, inside=True, merge=12.0)
  return plots.save(fig, out_stem + ".png", out_stem + ".svg")


def width_figure(best: pd.DataFrame, title: str, out_stem: str) -> list[str]:
  """Accuracy against the width per length (Zoology's Fig. 2), one line per attention; only where a
  width was swept (two or more widths)."""
  from lra_bench.report import plots

  if best.empty or best["d_model"].nunique() < 2:
    return []
  lengths = sorted(best["seq_len"].unique())
  plt = plots.pyplot()
  fig, axes = plt.subplots(1, len(lengths), figsize=(4.4 * len(lengths), 3.8), squeeze=False)
  names = sorted(best["attention"].unique(), key=lambda n: (n != "vanilla", n))
  colors = plots.colors(names)
  any_rising = False
  for ax, seq_len in zip(axes[0], lengths):
    part = best[best["seq_len"] == seq_len]
    for name in names:
      line = part[part["attention"] == name].sort_values("d_model")
      if not line.empty:
        ax.plot(line["d_model"], line["accuracy"], marker="o", ms=3, color=colors[name], label=name)
        rising = line[line["rising"]]
        if not rising.empty:
          ax.plot(rising["d_model"], rising["accuracy"], ls="none", marker="o", ms=5, color=colors[name],
                  markerfacecolor="white", zorder=3)
          any_rising = True
    widths = sorted(part["d_model"].unique())
    plots.set_log_axis(ax, "x", widths, base=2, ticks=widths)
    ax.set_ylim(-2, 105)
    ax.set_xlabel("model width d_model (log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"L = {int(seq_len)}", fontsize=10)
    ax.grid(alpha=0.3)
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
  fig.suptitle(title, fontsize=11)
  if any_rising:
    _rising_note(fig)
  return plots.save(fig, out_stem + ".png", out_stem + ".svg")


def _rising_note(fig) -> None:
  """The figure's key to its open markers, below the panels."""
  fig.text(0.5, -0.04, f"open marker: still rising when its training ended (last validation accuracy its best, "
           f"{RISING_POINTS:.0f}+ points above the one before): a lower bound set by the budget",
           ha="center", va="top", fontsize=8)
