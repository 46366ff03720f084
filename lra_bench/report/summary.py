"""The headline of a run: what its records found, in a few lines.

``headline(accuracy_reports, groups)`` is the one source of the summary that ``index.md`` opens with and
that ``lra-bench report`` (the last stage of ``run_all.sh``) prints on the terminal: the report writes it to
``summary.md`` and into ``index.md``, and the command prints that file. Every figure is one of the report's
own: accuracies and intervals from the accuracy tables' cells (``accuracy_<protocol>.csv``), slopes and
crossover lengths from the crossover tables (``crossover_<group>.csv``), formatted as there.

Per protocol and task: vanilla's test accuracy with its Wilson 95% interval, the attentions significantly
better or worse than vanilla (Newcombe's interval of the difference excludes 0; ``accuracy._add_intervals``),
how many are not significantly different and how many cells have no result. Per recall protocol and setting
(``recall_lines``): vanilla's accuracy, the attentions that recall (>= 90 %) and those at a blind choice among
the context's values or below, from the recall table's cells. Per benchmark group: the lowest
and highest fitted slope of time against length, and the crossovers against vanilla (the length from which
an attention is faster).
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from lra_bench.experiments.grid import name_list
from lra_bench.report.accuracy import AccuracyReport
from lra_bench.report.efficiency import EfficiencyGroup, _slope_text
from lra_bench.report.reference import TASK_TITLES, number

TITLE = "Summary"
FILE = "summary.md"


def headline(accuracy_reports: Sequence[AccuracyReport], groups: Sequence[EfficiencyGroup],
             recall_reports: Sequence = ()) -> list[str]:
  """The summary's lines (Markdown bullets that read as plain text on a terminal)."""
  lines: list[str] = []
  for rep in accuracy_reports:
    lines += _accuracy_lines(rep)
  for rep in recall_reports:
    lines += recall_lines(rep.protocol, rep.best)
  for group in groups:
    lines += _efficiency_lines(group)
  return lines or ["- No accuracy, recall or benchmark records yet."]


def section(lines: Sequence[str]) -> list[str]:
  """The summary as a section of ``index.md`` (and the whole of ``summary.md``)."""
  return [f"## {TITLE}", "", *lines, ""]


def _accuracy_text(cell: pd.Series) -> str:
  """``37.05 [34.1, 40.1]``: the mean over seeds and the Wilson interval, as the accuracy table prints them."""
  text = f"{cell['mean']:.2f}"
  if number(cell.get("std")) is not None:
    text += f" ± {cell['std']:.2f}"
  if number(cell.get("ci_low")) is not None:
    text += f" [{cell['ci_low']:.1f}, {cell['ci_high']:.1f}]"
  else:
    text += " (no interval: the records do not say how many test examples)"
  return text


def _named(frame: pd.DataFrame, ascending: bool) -> str:
  ranked = frame.sort_values(["mean", "attention"], ascending=[ascending, True])
  return name_list([f"{r.attention} {r.mean:.2f}" for r in ranked.itertuples()])


def _accuracy_lines(rep: AccuracyReport) -> list[str]:
  cells = rep.cells
  lines, empty = [], []
  for task in dict.fromkeys(cells["task"]):
    title = TASK_TITLES.get(task, task)
    column = cells[cells.task == task]
    ok = column[column.status == "ok"]
    if ok.empty:
      empty.append(title)
      continue
    where = f"- Accuracy, protocol {rep.protocol}, {title}"
    vanilla = ok[ok.attention == "vanilla"]
    missing = column[column.status != "ok"]
    counts = missing.status.replace({"missing": "not run"}).value_counts()
    tail = "".join(f"; {status}: {int(counts[status])}" for status in sorted(counts.index))
    if vanilla.empty:
      lines.append(f"{where}: vanilla has no result, so nothing is compared with it ({len(ok)} attention"
                   f"{'' if len(ok) == 1 else 's'} with a result{tail})")
      continue
    others = ok[ok.attention != "vanilla"]
    better, worse = others[others.vs_vanilla == "higher"], others[others.vs_vanilla == "lower"]
    same = others[others.vs_vanilla == "≈"]
    n = vanilla.iloc[0]["test_examples"]
    lines.append(f"{where}: vanilla {_accuracy_text(vanilla.iloc[0])}"
                 + (f" on {int(n)} test examples" if number(n) is not None else "") + "; "
                 + f"significantly better ({len(better)}): {_named(better, False) if len(better) else 'none'}; "
                 + f"significantly worse ({len(worse)}): {_named(worse, True) if len(worse) else 'none'}; "
                 + f"not significantly different: {len(same)}{tail}")
  if empty:
    lines.append(f"- Accuracy, protocol {rep.protocol}: no results for {', '.join(empty)} (the report's notes "
                 "say why and give the command that fills them)")
  return lines


RECALLS = 90.0   # a recall cell at or above this accuracy (%) is "recalls" in the summary
BLIND_MARGIN = 5.0  # ... at or below a blind choice among the kv values of the context plus this: "blind"


def recall_lines(protocol: str, best: pd.DataFrame) -> list[str]:
  """One line per task and setting of a recall table (``recall.best_of_sweep``'s rows): vanilla's accuracy,
  the attentions that recall (>= ``RECALLS`` %), those at or below a blind choice among the kv values of the
  context (100 / kv % + ``BLIND_MARGIN``; the kernel and fixed-state cores' level), and how many sit between."""
  lines = []
  keys = ["task", "seq_len", "kv", "d_model"]
  for key, rows in best.groupby(keys, dropna=False, sort=True):
    task, seq_len, kv, d_model = key
    setting = " ".join(f"{name}={int(value)}" for name, value in (("L", seq_len), ("kv", kv), ("d", d_model))
                       if number(value) is not None)
    ranked = rows.sort_values(["accuracy", "attention"], ascending=[False, True])
    named = lambda frame: name_list([f"{r.attention} {r.accuracy:.1f}" for r in frame.itertuples()])
    vanilla = ranked[ranked.attention == "vanilla"]
    head = f"vanilla {vanilla.iloc[0].accuracy:.1f}" if len(vanilla) else "vanilla not run"
    recall = ranked[ranked.accuracy >= RECALLS]
    blind_at = 100.0 / kv + BLIND_MARGIN if number(kv) is not None and kv > 0 else None
    blind = ranked[ranked.accuracy <= blind_at] if blind_at is not None else ranked.iloc[:0]
    between = len(ranked) - len(recall) - len(blind)
    text = (f"- Recall, protocol {protocol}, {task} {setting} ({len(ranked)} attention"
            f"{'' if len(ranked) == 1 else 's'}): {head}; recall {RECALLS:.0f} % or more ({len(recall)}): "
            f"{named(recall) if len(recall) else 'none'}")
    if blind_at is not None:
      text += (f"; blind choice or worse, {blind_at:.0f} % or less (1 of the {int(kv)} values + "
               f"{BLIND_MARGIN:.0f} points; {len(blind)}): {named(blind.iloc[::-1]) if len(blind) else 'none'}")
    lines.append(text + f"; between: {between}")
  return lines


def _efficiency_lines(group: EfficiencyGroup) -> list[str]:
  frame = group.crossover_frame
  where = f"- Efficiency, {group.mode}, batch {group.batch_size}, {group.device_kind}"
  if frame is None or frame.empty:
    return [f"{where}: no points"]
  lengths = sorted({int(n) for n in group.frame.length})
  span = f"{lengths[0]}–{lengths[-1]}" if lengths else "no lengths"
  slopes = frame[frame.time_slope.notna()].sort_values(["time_slope", "attention"])
  if slopes.empty:
    slope_text = f"time slope: none (fewer than 2 timed lengths in {span})"
  else:
    low, high = slopes.iloc[0], slopes.iloc[-1]
    vanilla = frame[frame.attention == "vanilla"]
    own = (f", vanilla {_slope_text(vanilla.iloc[0].time_slope)}" if len(vanilla) and "vanilla" not in
           (low.attention, high.attention) and number(vanilla.iloc[0].time_slope) is not None else "")
    slope_text = (f"time slope over {span} (fitted exponent of seconds per step in length): lowest "
                  f"{low.attention} {_slope_text(low.time_slope)}, highest {high.attention} "
                  f"{_slope_text(high.time_slope)}{own}")
  if not (frame.attention == "vanilla").any() or "faster_than_vanilla_from" not in frame:
    return [f"{where}: {slope_text}; no vanilla points, so no crossovers"]
  others = frame[frame.attention != "vanilla"]
  crossing = others[others.faster_than_vanilla_from.notna()].sort_values(["faster_than_vanilla_from", "attention"])
  never = others[others.faster_than_vanilla.astype(str).str.startswith("never")]
  cross_text = (f"faster than vanilla from ({len(crossing)}): "
                + (name_list([f"{r.attention} {int(r.faster_than_vanilla_from)}" for r in crossing.itertuples()])
                   if len(crossing) else "none")
                + f"; never faster at the longest length compared: {len(never)}")
  return [f"{where}: {slope_text}; {cross_text}"]
