"""The accuracy tables: ours (mean ± std over seeds, a 95% interval per cell, a mark where a cell does not
differ significantly from vanilla), the published numbers, the deltas, and one note per empty cell with
its reason and the command that fills it.

The smoke protocol tests on a few hundred examples, where ±5 points is sampling noise; the interval and
the mark keep a reader from ranking attentions on that noise.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

import attention_zoo
import tasks as tasks_lib
from lra_bench.experiments import results
from lra_bench.report.reference import (AVG_TASKS, REFERENCE_COLUMN, TASK_ORDER, TASK_TITLES, comparable,
                                        followup_settings, number, paper_name, preset_problem, is_own,
                                        protocol_settings_notes, published_model, reference_accuracy,
                                        row_attention, settings_text)
from lra_bench.report.tables import Table


def report_tasks(records: Iterable[dict]) -> list[str]:
  """Columns: the LRA tasks in paper order (Path-X only if registered or run), then any other
  classification task (the next-token recall tasks have their own section: ``report.recall``)."""
  seen = {r["task"] for r in records}
  known = {t for t in set(tasks_lib.list_tasks()) | seen if not tasks_lib.is_next_token(t)}
  columns = [t for t in TASK_ORDER[:5]] + [t for t in TASK_ORDER[5:] if t in known]
  return columns + sorted(known - set(columns))


def report_attentions(records: Iterable[dict]) -> list[str]:
  """Rows: every registered attention plus any that has records; vanilla first."""
  names = set(attention_zoo.list_layers()) | {r["attention"] for r in records}
  return sorted(names, key=lambda n: (n != "vanilla", n))


def _fix_command(protocol: str, task: str, attention: str, seeds: Sequence[int], results_dir: str,
                 sets: Sequence[str] = (), plugin: str | None = None) -> str:
  """The suite command that fills a cell: its ``--plugin`` and ``--set``s too (``Fix`` of the records)."""
  return shlex.join(["lra-bench", "suite", *(["--plugin", plugin] if plugin else []), "--protocol", protocol,
                     "--tasks", task, "--attentions", attention, "--seeds", ",".join(map(str, seeds)),
                     "--results_dir", results_dir, *[arg for s in sets for arg in ("--set", s)]])


class _Absent:
  def __repr__(self) -> str:
    return "absent"


ABSENT = _Absent()  # a key one of two configs does not have


def _vs_preset(record: dict) -> dict | None:
  vs = record.get("vs_preset")
  return vs if isinstance(vs, dict) else None


def preset_differences(record: dict) -> tuple[dict[str, tuple[object, object]], str | None]:
  """({key: (the record's value, the preset's value)} for every key of the record's stored config that
  differs from what its protocol's preset builds for the same task, attention and seed; why it could not
  be compared, or None).

  Read from the record's ``vs_preset`` (``results.vs_preset``, computed when the record was written):
  the report loads no config. A record without it (written before the field existed, or without a
  stored config) is not compared: ``({}, None)``, so its cell gets no † and its Fix command no ``--set``s.
  """
  vs = _vs_preset(record)
  if vs is None:
    return {}, None
  if vs.get("problem"):
    return {}, str(vs["problem"])
  return {key: (sides.get("record", ABSENT), sides.get("preset", ABSENT))
          for key, sides in (vs.get("differences") or {}).items()}, None


def record_sets(record: dict) -> list[str]:
  """The ``--set``s that rebuild a record's config from its protocol's preset (empty when it matches, or
  for a record without ``vs_preset``)."""
  vs = _vs_preset(record)
  return [] if vs is None or vs.get("problem") else list(vs.get("sets") or [])


def ignored_keys(records: Iterable[dict]) -> list[str]:
  """The keys the records' preset comparisons ignore (logging and checkpoint cadence: they change no
  result, so a record differing from its preset in these only is still the preset), in order."""
  return list(dict.fromkeys(key for r in records for key in ((_vs_preset(r) or {}).get("ignored") or [])))


def _plugin(module: str | None) -> str | None:
  """The ``--plugin`` a run of an attention defined in ``module`` needs (None for the package's own)."""
  return module if module and module.split(".")[0] != "attention_zoo" else None


def _off_preset(records: Sequence[dict]) -> str | None:
  """Why a cell's records are not the protocol's preset ("model.num_layers=2 (preset 4), ..."), or None."""
  for record in records:
    differences, problem = preset_differences(record)
    if problem:
      return f"its preset cannot be built here ({problem})"
    ignored = ignored_keys([record])
    changed = {k: v for k, v in differences.items() if k not in ignored}
    if changed:
      return ", ".join(f"{k}={mine!r} (preset {preset!r})" for k, (mine, preset) in changed.items())
  return None


Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: two-sided 95% intervals


def wilson_interval(p: float | None, n: int | None, z: float = Z95) -> tuple[float, float] | None:
  """Wilson's score interval for a proportion ``p`` observed on ``n`` trials; None without both.

  Unlike p ± z·sqrt(p(1-p)/n) it stays inside [0, 1] and keeps its coverage at p near 0 or 1 and at
  the small n of the smoke protocol.
  """
  p, n = number(p), number(n)
  if p is None or n is None or n <= 0:
    return None
  shrink = 1.0 + z * z / n
  centre = (p + z * z / (2 * n)) / shrink
  half = z / shrink * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_difference(p1: float, n1: int, p2: float, n2: int,
                        z: float = Z95) -> tuple[float, float] | None:
  """Newcombe's hybrid score interval (his method 10) for ``p1 - p2``, from the two Wilson intervals.

  It treats the two accuracies as independent samples. Two runs tested on the same examples are
  positively correlated, which narrows the true interval, so this one errs towards "no difference".
  """
  a, b = wilson_interval(p1, n1, z), wilson_interval(p2, n2, z)
  if a is None or b is None:
    return None
  d = p1 - p2
  return d - math.hypot(p1 - a[0], b[1] - p2), d + math.hypot(a[1] - p1, p2 - b[0])


def test_examples(record: dict) -> int | None:
  """How many test examples a record's accuracy was measured on (None if it does not say).

  ``test_examples`` is written with every run's measurements; older records only have the test
  split's size in ``data``.
  """
  candidates = [record.get("test_examples"), ((record.get("data") or {}).get("test") or {}).get("num_examples")]
  for value in candidates:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
      return int(value)
  return None


def _add_intervals(frame: pd.DataFrame) -> pd.DataFrame:
  """Columns ci_low/ci_high (Wilson, %) per cell and the difference from vanilla's cell on the same task.

  vs_vanilla_low/high: Newcombe's 95% interval of (cell − vanilla) in points; vs_vanilla: "≈" where it
  contains 0 (not significantly different), "higher"/"lower" where it does not, empty without data.
  """
  if frame.empty:
    return frame
  intervals = [wilson_interval(number(m) / 100.0 if number(m) is not None else None, n)
               for m, n in zip(frame["mean"], frame["test_examples"])]
  frame["test_examples"] = frame["test_examples"].astype("Int64")  # a count: no "200.0" in the CSV
  frame["ci_low"] = [100.0 * i[0] if i else None for i in intervals]
  frame["ci_high"] = [100.0 * i[1] if i else None for i in intervals]
  vanilla = {r.task: r for r in frame[frame.attention == "vanilla"].itertuples()}
  low, high, verdict = [], [], []
  for r in frame.itertuples():
    v = vanilla.get(r.task)
    diff = None
    if r.attention != "vanilla" and v is not None and None not in (number(r.mean), number(v.mean)):
      diff = newcombe_difference(r.mean / 100.0, r.test_examples, v.mean / 100.0, v.test_examples)
    low.append(100.0 * diff[0] if diff else None)
    high.append(100.0 * diff[1] if diff else None)
    verdict.append(None if diff is None else "≈" if diff[0] <= 0.0 <= diff[1] else
                   "higher" if diff[0] > 0 else "lower")
  frame["vs_vanilla_low"], frame["vs_vanilla_high"], frame["vs_vanilla"] = low, high, verdict
  return frame


def accuracy_cells(records: Sequence[dict], protocol: str, results_dir: str = "RESULTS_DIR",
                   attentions: Sequence[str] | None = None,
                   task_names: Sequence[str] | None = None) -> pd.DataFrame:
  """One row per (attention, task): seeds, mean/std test accuracy (%), test examples, Wilson 95% interval
  (ci_low/ci_high) and the comparison with vanilla (``_add_intervals``), status, error, fix command.

  ``test_examples`` is the smallest count among the cell's seeds; the seeds reuse the same test
  examples, so the interval is for n = that count, not n × seeds.

  Reads from-scratch runs only (``results.pretrain_objective(r) == "none"``): runs fine-tuned after
  self-pretraining are shown by ``report.pretraining`` (their count: ``frame.attrs["spt_records"]``).
  Uses the latest record of each run; the seeds of a cell are the records sharing one config apart from
  the seed (``results.setting_hash``). When a cell was run under several configs (overrides), the config
  with the most ``ok`` seeds (then the latest) is used and the others are counted in ``ignored``.
  ``off_preset``: how the cell's config differs from its protocol's preset (``preset_differences``, the
  ``ignored_keys`` apart), None when it is the preset; such a cell gets no delta. ``fix``: the
  command that fills an empty cell, with the ``--plugin`` and ``--set``s of its record (of the protocol's
  other records for a cell without any).
  """
  protocol_records = [r for r in results.latest_records(records)
                      if r.get("kind", "train") == "train" and r.get("protocol") == protocol]
  # From scratch only: a run fine-tuned after self-pretraining is another setting of the cell and never one
  # of its seeds (``report.pretraining`` sets the two side by side).
  train_records = [r for r in protocol_records if results.pretrain_objective(r) == "none"]
  attentions = attentions or report_attentions(train_records)
  task_names = task_names or report_tasks(train_records)
  seeds_used = sorted({r["seed"] for r in train_records}) or [0]
  # A cell without records is filled by the suite that made the task's others: their common --sets.
  common_sets = {task: sorted(set.intersection(*sets)) if sets else [] for task in task_names
                 for sets in [[set(record_sets(r)) for r in train_records if r["task"] == task]]}
  rows = []
  for attention in attentions:
    for task in task_names:
      mine = [r for r in train_records if r["attention"] == attention and r["task"] == task]
      by_setting: dict[str | None, list[dict]] = {}  # the seeds of one config share its setting_hash
      for r in mine:
        by_setting.setdefault(results.setting_hash(r), []).append(r)
      chosen: list[dict] = []
      if by_setting:
        chosen = max(by_setting.values(), key=lambda rs: (sum(r["status"] == "ok" for r in rs),
                                                           max(mine.index(r) for r in rs)))
      ok = [r for r in chosen if r["status"] == "ok" and r.get("test_accuracy") is not None]
      accs = np.asarray([100.0 * r["test_accuracy"] for r in ok])
      counts = [test_examples(r) for r in ok]
      row = {"protocol": protocol, "attention": attention, "model": paper_name(attention), "task": task,
             "n": len(ok), "seeds": ",".join(str(r["seed"]) for r in sorted(ok, key=lambda r: r["seed"])),
             "mean": float(accs.mean()) if len(ok) else None,
             "std": float(accs.std(ddof=1)) if len(ok) > 1 else None,
             "test_examples": min(counts) if ok and None not in counts else None,
             "ignored": len(mine) - len(chosen), "status": "ok" if ok else None, "error": None, "fix": None,
             "off_preset": _off_preset(ok)}
      if not ok:
        failed = [r for r in chosen if r["status"] != "ok"]
        last = failed[-1] if failed else None
        row["status"] = last["status"] if last else "missing"
        row["error"] = (last.get("error") or "").strip() if last else None
        sets = record_sets(last) if last else common_sets[task]
        plugin = _plugin(last.get("attention_module") if last else results.attention_module(attention))
        fix = _fix_command(protocol, task, attention, seeds_used, results_dir, sets, plugin)
        if last and last["status"] == "no_data":
          prepare = re.search(r"lra-bench data prepare [^\n]*", row["error"] or "")
          fix = (prepare.group(0) + " && " if prepare else "") + fix
        row["fix"] = fix
      rows.append(row)
  frame = _add_intervals(pd.DataFrame(rows))
  frame.attrs["seeds"], frame.attrs["sets"] = seeds_used, common_sets
  frame.attrs["ignored"] = ignored_keys(train_records)
  frame.attrs["spt_records"] = sum(results.pretrain_objective(r) != "none" and not tasks_lib.is_next_token(r["task"])
                                  for r in protocol_records)
  return frame


def _fmt(mean: float | None, std: float | None = None, signed: bool = False) -> str:
  mean, std = number(mean), number(std)
  if mean is None:
    return ""
  text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
  if std is not None:
    text += f" ± {std:.2f}"
  return text.replace("-", "−") if signed else text


def _fmt_cell(c: pd.Series) -> str:
  """An ok cell: "≈ 61.20 ± 1.30 [56.9, 65.4]" (mark, mean ± std over seeds, Wilson 95% interval)."""
  text = _fmt(c["mean"], c["std"])
  if number(c.get("ci_low")) is not None:
    text += f" [{c['ci_low']:.1f}, {c['ci_high']:.1f}]"
  if isinstance(c.get("off_preset"), str):
    text += f" {OFF_PRESET}"
  return ("≈ " + text) if c.get("vs_vanilla") == "≈" else text


def _interval_notes(cells: pd.DataFrame, task_names: Sequence[str]) -> list[str]:
  """What [a, b] and ≈ mean, how many test examples each task had, and why a cell has no interval."""
  ok = cells[cells.status == "ok"]
  if ok.empty:
    return []
  counts = []
  for t in task_names:
    ns = sorted({int(n) for n in ok[ok.task == t]["test_examples"].dropna()})
    if ns:
      counts.append(f"{TASK_TITLES.get(t, t)} {'–'.join(map(str, [ns[0], ns[-1]] if len(ns) > 1 else ns))}")
  notes = []
  if counts:
    notes.append(
        "Intervals [a, b]: Wilson 95% score interval of the test accuracy for the cell's n test examples (n: "
        + ", ".join(counts) + "; the seeds reuse the same test examples, so n is not multiplied by the "
        "seeds). It covers the sampling noise of a finite test set only; ± is the spread over seeds. The "
        "Avg column has no interval.")
    notes.append(
        "Mark ≈: not significantly different from vanilla on that task: Newcombe's hybrid score interval "
        "(method 10) for the difference of the two accuracies contains 0 at 95%. It treats the two runs "
        "as independent samples; runs tested on the same examples are positively correlated, so it errs "
        "towards ≈. Between two other attentions there is no test: overlapping intervals establish no "
        "ranking. "
        "Per-cell intervals and differences: the CSV (ci_low, ci_high, vs_vanilla_low, vs_vanilla_high).")
  missing = ok[ok["test_examples"].isna()]
  if len(missing) == len(ok):
    notes.append("No confidence intervals: none of these records says how many test examples its accuracy "
                 "was measured on (`test_examples`; records written before it existed). Rerun the cells "
                 "to get one per cell.")
  elif len(missing):
    which = ", ".join(f"{a} / {TASK_TITLES.get(t, t)}" for a, t in zip(missing.attention, missing.task))
    notes.append(f"No interval (and no ≈ test) for {len(missing)} cell(s) whose records do not say how many "
                 f"test examples they were measured on (`test_examples`; records written before it existed): "
                 f"{which if len(missing) <= 8 else which[:400] + ' …'}. Rerun them to get one.")
  return notes


OFF_PRESET = "†"  # the mark of a cell whose config is not its protocol's preset
STATUS_TEXT = {"missing": "no data", "no_data": "no data", "oom": "OOM", "failed": "failed"}


@dataclasses.dataclass
class AccuracyReport:
  protocol: str
  cells: pd.DataFrame          # accuracy_cells + reference and delta columns (the CSV)
  ours: Table
  published: Table
  delta: Table | None
  avg_tasks: list[str]


def accuracy_report(records: Sequence[dict], protocol: str, reference: pd.DataFrame,
                    results_dir: str = "RESULTS_DIR") -> AccuracyReport:
  """Our table, the published one and (for a comparable protocol) the deltas, from ``records``.

  ``reference``: LRA Table 1's rows (``reference.load_reference``), or for a protocol that runs its own
  paper's recipe the rows published there (``reference.own_reference``: Xiong et al.'s Table 3 for
  ``xiong``)."""
  cells = accuracy_cells(records, protocol, results_dir)
  task_names = list(dict.fromkeys(cells["task"]))
  attentions = list(dict.fromkeys(cells["attention"]))
  has_data = {t for t in task_names if (cells[(cells.task == t)]["status"] == "ok").any()}
  avg_tasks = [t for t in AVG_TASKS if t in has_data]
  refs = [reference_accuracy(reference, protocol, a, t) for a, t in zip(cells.attention, cells.task)]
  cells["reference"] = [r[0] for r in refs]
  cells["reference_source"] = [r[1] for r in refs]
  cells["delta"] = [number(m) - number(r) if None not in (number(m), number(r)) and not isinstance(off, str)
                    else None for m, r, off in zip(cells["mean"], cells["reference"], cells["off_preset"])]
  ours = _ours_table(cells, protocol, reference, task_names, attentions, avg_tasks, results_dir)
  published = _published_table(cells, protocol, reference, task_names, attentions)
  delta = _delta_table(cells, reference, task_names, attentions) if comparable(protocol) else None
  return AccuracyReport(protocol, cells, ours, published, delta, avg_tasks)


def _model_name(reference: pd.DataFrame, attention: str) -> str:
  """The Model column: the published row's name, else the LRA paper's, else "—"."""
  return published_model(reference, attention) or paper_name(attention) or "—"


def _cell(cells: pd.DataFrame, attention: str, task: str) -> pd.Series:
  return cells[(cells.attention == attention) & (cells.task == task)].iloc[0]


def _chance_row(reference: pd.DataFrame, task_names: Sequence[str], avg_tasks: Sequence[str]) -> list[str]:
  chance, values = ["Chance", ""], {}
  for t in task_names:
    try:
      values[t] = 100.0 * tasks_lib.get_task(t).chance_accuracy
    except (ValueError, AttributeError):
      values[t] = reference_accuracy(reference, "combiner", "__chance__", t)[0]
    chance.append(_fmt(values[t]))
  chance_avg = [v for t, v in values.items() if t in avg_tasks]
  chance.append(_fmt(float(np.mean(chance_avg))) if avg_tasks and None not in chance_avg else "")
  return chance


def _ours_table(cells: pd.DataFrame, protocol: str, reference: pd.DataFrame, task_names: list[str],
                attentions: list[str], avg_tasks: list[str], results_dir: str) -> Table:
  def row_avg(a) -> float | None:
    means = [number(_cell(cells, a, t)["mean"]) for t in avg_tasks]
    return float(np.mean(means)) if avg_tasks and None not in means else None

  # A task none of whose cells has a result or a failure is one line of the notes (``_missing_notes``: what is
  # missing and the command that fills it), not a column of "no data".
  empty = [t for t in task_names if _no_result(cells[cells.task == t])]
  task_names = [t for t in task_names if t not in empty] or task_names
  columns = ["Model", "Attention", *[TASK_TITLES.get(t, t) for t in task_names], "Avg"]
  rows, bold = [_chance_row(reference, task_names, avg_tasks)], set()
  best = {t: cells[(cells.task == t) & (cells.status == "ok")]["mean"].max() for t in task_names}
  avgs = {a: row_avg(a) for a in attentions}
  best_avg = max((v for v in avgs.values() if v is not None), default=None)
  for i, a in enumerate(attentions, start=1):
    row = [_model_name(reference, a), a]
    for j, t in enumerate(task_names, start=2):
      c = _cell(cells, a, t)
      if c["status"] == "ok":
        row.append(_fmt_cell(c))
        if np.isclose(c["mean"], best[t]):
          bold.add((i, j))
      else:
        row.append(STATUS_TEXT.get(c["status"], c["status"]))
    row.append(_fmt(avgs[a]))
    if avgs[a] is not None and np.isclose(avgs[a], best_avg):
      bold.add((i, len(columns) - 1))
    rows.append(row)
  seeds = sorted({int(s) for ss in cells["seeds"] if ss for s in ss.split(",")})
  with_ci = bool(cells["ci_low"].notna().any()) if "ci_low" in cells else False
  if with_ci:
    marks = ("; [a, b] = Wilson 95% interval; ≈ = not significantly different from vanilla (see below the "
             "table); highest mean per column in bold (not necessarily a significant win: see ≈ and [a, b]). ")
  else:
    marks = "; best per column in bold. "
  caption = (f"Test accuracy (%) under protocol `{protocol}`: mean ± std over seeds "
             f"({', '.join(map(str, seeds)) or 'none'}){marks}"
             f"Avg over {', '.join(TASK_TITLES.get(t, t) for t in avg_tasks) or 'no task'}"
             + (" (the tasks with data; the paper averages all five)." if len(avg_tasks) < 5 else ".")
             + (f" Without any result, so not shown as columns: {', '.join(TASK_TITLES.get(t, t) for t in empty)} "
                "(the notes below say why and give the command that fills them)."
                if empty and len(empty) < len(set(cells['task'])) else ""))
  if not comparable(protocol):
    caption = (f"**Protocol `{protocol}` is not the paper's protocol: these numbers are NOT comparable to "
               f"the published ones** (shown below for orientation only, without deltas). " + caption)
  notes = _missing_notes(cells, protocol, results_dir) + _off_preset_notes(cells, protocol)
  if cells.attrs.get("spt_records"):
    notes.append(f"{cells.attrs['spt_records']} run(s) fine-tuned after self-pretraining (SPT) are not in this "
                 "table, which is from scratch only: see \"Self-pretraining (SPT) vs from scratch\".")
  if int(cells["ignored"].sum()):
    notes.append(f"{int(cells['ignored'].sum())} record(s) of other configs (overrides) of the same cells "
                 "are not shown; the config with the most ok seeds is.")
  return Table(columns, rows, bold, caption, notes, left=2, footnotes=_interval_notes(cells, task_names))


def _off_preset_notes(cells: pd.DataFrame, protocol: str) -> list[str]:
  """One line per cell marked †: the keys its config changes from the preset."""
  off = cells[(cells.status == "ok") & cells["off_preset"].map(lambda v: isinstance(v, str))]
  if off.empty:
    return []
  return [f"{OFF_PRESET} = the cell's config is not the `{protocol}` preset (so no delta against the published "
          f"number; ignored keys: {', '.join(cells.attrs.get('ignored', []))}):"] + [
      f"{OFF_PRESET} {c.attention} / {TASK_TITLES.get(c.task, c.task)}: {c.off_preset[:400]}" for c in off.itertuples()]


def _published_table(cells: pd.DataFrame, protocol: str, reference: pd.DataFrame, task_names: list[str],
                     attentions: list[str]) -> Table:
  pub_columns = ["Model", "Attention", *[TASK_TITLES.get(t, t) for t in task_names], "Avg", "Settings", "Source"]
  pub_rows = []
  for a in attentions:
    model = published_model(reference, a)
    if model is None:
      continue
    values = [_cell(cells, a, t)["reference"] for t in task_names]
    avg, _ = reference_accuracy(reference, protocol, a, "avg")
    sources = sorted({s for s in cells[cells.attention == a]["reference_source"] if isinstance(s, str)})
    if all(number(v) is None for v in values):
      continue
    pub_rows.append([model, a, *[_fmt(v) for v in values], _fmt(avg), settings_text(protocol, a),
                     ", ".join(sources)])
  files = sorted(set(reference["file"])) if "file" in reference else ["lra_followups_accuracy.csv"]
  where = (f"the rows published under this protocol's recipe ({', '.join(sorted(set(reference['source'])))}), "
           f"from {', '.join('lra_bench/report/published/' + f for f in files)}, whose README names each source"
           if is_own(reference) else
           "lra_bench/report/published/; lra_paper_table1 = Tay et al. 2021 Table 1, combiner_paper_table5 = Ren "
           "et al. 2021 Table 5")
  return Table(pub_columns, pub_rows, left=2, caption=(
      f"Published test accuracy (%) of the models of these names ({where}). Settings: `same` = our "
      f"runs under `{protocol}` used the original's settings for that model (the same model); `differs` = "
      "they did not, see the protocol notes below."),
      notes=protocol_settings_notes(protocol, attentions, task_names, lambda a: published_model(reference, a)))


def _delta_table(cells: pd.DataFrame, reference: pd.DataFrame, task_names: list[str],
                 attentions: list[str]) -> Table:
  d_rows = []
  for a in attentions:
    values = [number(_cell(cells, a, t)["delta"]) for t in task_names]
    if all(v is None for v in values):
      continue
    d_rows.append([_model_name(reference, a), a, *[_fmt(v, signed=True) for v in values]])
  return Table(["Model", "Attention", *[TASK_TITLES.get(t, t) for t in task_names]], d_rows, left=2,
               caption=f"Δ = ours − published (accuracy points); empty where either side has no number or our "
               f"config is not the protocol's preset ({OFF_PRESET}).")


def _task_problem(protocol: str, task: str) -> str | None:
  """Why a whole column cannot have data in this checkout (None if it can)."""
  if task not in tasks_lib.list_tasks():
    return f"task {task!r} is not implemented in this checkout"
  return preset_problem(protocol, task)


def _local(text: str) -> str:
  """``text`` (a recorded error or fix command) with the data folder of ``--data_dir`` and the paths inside the
  working directory shown relative to it, as the rest of the report shows paths: a cell that ran with
  ``--data_dir /home/me/repo/lra_data`` reads ``--data_dir lra_data`` in a report made in ``/home/me/repo``."""
  text = re.sub(r"(?<=--data_dir )(/\S+)", lambda m: os.path.relpath(m.group(1)), text)
  cwd = os.getcwd()
  if cwd == os.sep:  # every absolute path is inside "/": nothing to shorten
    return text
  # only a path that starts there (not a folder of that name inside another path)
  return re.sub(r"(?<![\w./-])" + re.escape(cwd + os.sep) + r"(\S*)", lambda m: m.group(1) or ".", text)


def _no_result(column: pd.DataFrame) -> bool:
  """Whether a task's cells are all not run or without data (no result, no failure): one note, no column."""
  return set(column.status) <= {"missing", "no_data"}


def _missing_notes(cells: pd.DataFrame, protocol: str, results_dir: str) -> list[str]:
  """One line per empty cell with its reason and fix; one line per column that is empty throughout (recorded
  paths shown relative to the working directory: ``_local``)."""
  notes = []
  for task, col in cells.groupby("task", sort=False):
    missing = col[col.status != "ok"]
    if missing.empty:
      continue
    problem = _task_problem(protocol, task)
    title = TASK_TITLES.get(task, task)
    if problem:
      notes.append(f"{title}: no data — {problem}.")
      continue
    if _no_result(col):
      prepare = next((re.search(r"lra-bench data prepare [^\n]*", e).group(0) for e in missing.error
                      if isinstance(e, str) and re.search(r"lra-bench data prepare", e)), None)
      fix = _fix_command(protocol, task, "all", cells.attrs.get("seeds", [0]), results_dir,
                         cells.attrs.get("sets", {}).get(task, []))
      notes.append(_local(f"{title}: no data for any attention. Fix: `{(prepare + ' && ') if prepare else ''}{fix}`"))
      continue
    for _, c in missing.iterrows():
      reason = f" — {c['error'].splitlines()[0][:160]}" if isinstance(c["error"], str) and c["error"] else ""
      notes.append(_local(f"{c['attention']} / {title}: {STATUS_TEXT.get(c['status'], c['status'])}{reason}. "
                          f"Fix: `{c['fix']}`"))
  return notes


FOLLOWUPS_TITLE = "Published under other protocols (not comparable with LRA Table 1)"


def followups_table(followups: pd.DataFrame) -> Table | None:
  """The rows published under other protocols, each labelled with its protocol and source; never ranked
  with (or merged into) the LRA Table 1 rows."""
  if followups.empty:
    return None
  task_names = list(AVG_TASKS) + ["pathx"]
  rows = []
  for _, r in followups.iterrows():
    attention = row_attention(r)
    rows.append([r["model"], attention or "—", r["protocol"],
                 *[r.get(REFERENCE_COLUMN.get(t, t), "") or "" for t in task_names], r.get("avg5", ""),
                 r["source"], followup_settings(r["source"], attention)])
  columns = ["Model", "Attention", "Protocol", *[TASK_TITLES[t] for t in task_names], "Avg (5)", "Source",
             "Our settings"]
  return Table(columns, rows, left=3, caption=(
      f"{FOLLOWUPS_TITLE}: test accuracy (%) as published, each under the protocol named in its row "
      "(model size, training budget, data handling differ from LRA's), from "
      "lra_bench/report/published/lra_followups_accuracy.csv and, for the modern recurrent layers (each under "
      "its paper's own recipe), lra_bench/report/published/modern_layers_accuracy.csv, whose `note` column says "
      "how each row was read and how its paper averages. Attention: our layer of the same name (a modern layer's by "
      "its config's `paper_name`), — when none. Avg (5): the mean of the five tasks without Path-X, empty "
      "when one is missing. For orientation only: no ranking, no deltas."))
