"""Self-pretraining (SPT) against training from scratch (Amos, Berant & Gupta, "Never Train from Scratch:
Fair Comparison of Long-Sequence Models Requires Data-Driven Priors", ICLR 2024).

A cell fine-tuned after masked (or causal) pretraining on the task's own training inputs is set beside the
same protocol/task/attention trained from scratch: both accuracies with their Wilson 95% intervals, the
difference SPT − scratch with Newcombe's interval, the step budgets of both sides (so a reader sees whether
SPT had more steps) and the pretraining's own validation accuracy. The accuracy tables
(``report.accuracy``) read from-scratch runs only; this section is where SPT runs are shown.

Then the published rows of the paper (``lra_bench/report/published/spt_accuracy.csv``), under the paper's own
protocol and never compared with ours.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

import tasks as tasks_lib
from lra_bench.experiments import results
from lra_bench.report.accuracy import ignored_keys, newcombe_difference, test_examples, wilson_interval
from lra_bench.report.reference import REFERENCE_COLUMN, SPT_FILE, TASK_ORDER, TASK_TITLES, number, paper_name
from lra_bench.report.tables import Table

SPT_TITLE = "Self-pretraining (SPT) vs from scratch"
PUBLISHED_TITLE = "Published self-pretraining results"
OBJECTIVE_ORDER = results.PRETRAIN_OBJECTIVES
# What a pretraining's own accuracy counts, per objective.
PRETRAIN_METRIC = {"masked": "masked-position accuracy", "causal": "next-token accuracy"}


def _classification(records: Iterable[dict], protocol: str) -> list[dict]:
  """The latest classification records (kind "train", not a next-token task) of ``protocol``."""
  return [r for r in results.latest_records(records)
          if r.get("kind", "train") == "train" and r.get("protocol") == protocol
          and not tasks_lib.is_next_token(r.get("task", ""))]


def spt_records(records: Iterable[dict], protocol: str) -> list[dict]:
  """The fine-tuning records of ``protocol`` that started from a self-pretraining run."""
  return [r for r in _classification(records, protocol) if results.pretrain_objective(r) != "none"]


def has_spt(records: Iterable[dict], protocol: str) -> bool:
  return bool(spt_records(records, protocol))


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
  if not isinstance(value, dict):
    return {prefix: value}
  out = {}
  for key, item in value.items():
    out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
  return out


# What may differ between an SPT run and the scratch run it is compared with: the seed, the pretraining
# itself and the number of (fine-tuning) steps.
FREE_KEYS = ("seed", "num_train_steps")


def _comparable(config: Any, ignored: Sequence[str]) -> dict[str, Any]:
  """A stored config without the keys a scratch run may differ in from an SPT run (``FREE_KEYS``, the
  ``pretrain`` section, the result-neutral ``ignored`` keys), flattened to dotted keys."""
  flat = _flat(json.loads(json.dumps(config if isinstance(config, dict) else {})))
  return {k: v for k, v in flat.items() if k not in FREE_KEYS and k not in ignored
          and k != "pretrain" and not k.startswith("pretrain.")}


def _planned_steps(record: dict) -> int | None:
  return _int((record.get("config") or {}).get("num_train_steps"))


def _int(value: Any) -> int | None:
  value = number(value)
  return int(value) if value is not None else None


def _train_steps(record: dict) -> int | None:
  """The steps a run trained (its record's ``train_steps``; the config's ``num_train_steps`` without)."""
  return _int(record.get("train_steps")) if _int(record.get("train_steps")) is not None else _planned_steps(record)


def _pretrain_section(record: dict) -> dict:
  section = record.get("pretrain")
  return section if isinstance(section, dict) else {}


def _pretrain_config(record: dict) -> dict:
  config = record.get("config")
  section = config.get("pretrain") if isinstance(config, dict) else None
  return section if isinstance(section, dict) else {}


def _pretrain_steps(record: dict) -> int | None:
  """The pretraining steps behind a fine-tuning record (its ``pretrain.train_steps``, else the config's)."""
  steps = _int(_pretrain_section(record).get("train_steps"))
  return steps if steps is not None else _int(_pretrain_config(record).get("num_train_steps"))


def _groups(records: Sequence[dict]) -> list[list[dict]]:
  """The records grouped by setting (``results.setting_hash``: the seeds of one config), in order."""
  by_setting: dict[str | None, list[dict]] = {}
  for r in records:
    by_setting.setdefault(results.setting_hash(r), []).append(r)
  return list(by_setting.values())


def _ok(records: Sequence[dict]) -> list[dict]:
  return [r for r in records if r.get("status") == "ok" and number(r.get("test_accuracy")) is not None]


def _rank(group: Sequence[dict], order: Sequence[dict]) -> tuple[int, int]:
  """As ``accuracy_cells`` chooses among settings: most ``ok`` seeds, then the latest."""
  return len(_ok(group)), max(next(i for i, o in enumerate(order) if o is r) for r in group)


def _side(chosen: Sequence[dict]) -> dict[str, Any]:
  """n, seeds, mean/std (%), test examples (the smallest over seeds) and Wilson interval of one side."""
  ok = sorted(_ok(chosen), key=lambda r: r["seed"])
  accs = np.asarray([100.0 * float(r["test_accuracy"]) for r in ok])
  counts = [test_examples(r) for r in ok]
  mean = float(accs.mean()) if len(ok) else None
  n_examples = min(counts) if ok and None not in counts else None
  interval = wilson_interval(mean / 100.0 if mean is not None else None, n_examples)
  failed = [r for r in chosen if r.get("status") != "ok"]
  return {"n": len(ok), "seeds": ",".join(str(r["seed"]) for r in ok), "mean": mean,
          "std": float(accs.std(ddof=1)) if len(ok) > 1 else None, "test_examples": n_examples,
          "ci_low": 100.0 * interval[0] if interval else None, "ci_high": 100.0 * interval[1] if interval else None,
          "status": "ok" if ok else (failed[-1].get("status") if failed else "missing")}


def _steps_value(values: Iterable[int | None]) -> int | str | None:
  """One step count when the seeds agree, "a–b" when they do not, None when unknown."""
  known = sorted({v for v in values if v is not None})
  if not known:
    return None
  return known[0] if len(known) == 1 else f"{known[0]}–{known[-1]}"


def _differences(spt: dict, scratch: dict, ignored: Sequence[str]) -> list[str]:
  """"key=scratch value (SPT value)" for the keys the scratch config differs in beyond ``FREE_KEYS``."""
  a, b = _comparable(scratch.get("config"), ignored), _comparable(spt.get("config"), ignored)
  absent = "absent"
  return [f"{k}={a.get(k, absent)!r} (SPT {b.get(k, absent)!r})" for k in sorted(set(a) | set(b))
          if a.get(k, absent) != b.get(k, absent)]


def _choose_scratch(spt_chosen: Sequence[dict], scratch: Sequence[dict], ignored: Sequence[str],
                    total: int | None) -> tuple[list[dict], str | None]:
  """The scratch records an SPT setting is compared with, and a note saying which config they are when
  that is not evident (several scratch settings, or none equal to the SPT config but for its steps).

  Preferred: a setting whose config equals the SPT config without its ``pretrain`` section, apart from
  ``num_train_steps`` (among several such, the one whose steps equal SPT's total budget, then the most ok
  seeds); else the setting with the most ``ok`` seeds, then the latest."""
  groups = _groups(scratch)
  if not groups:
    return [], None
  reference = spt_chosen[0]
  target = _comparable(reference.get("config"), ignored)
  matching = [g for g in groups if _comparable(g[0].get("config"), ignored) == target]
  if matching:
    chosen = max(matching, key=lambda g: (total is not None and _planned_steps(g[0]) == total,
                                          *_rank(g, scratch)))
  else:
    chosen = max(groups, key=lambda g: _rank(g, scratch))
  steps = _planned_steps(chosen[0])
  if not matching:
    differs = _differences(reference, chosen[0], ignored)
    text = "; ".join(differs[:6]) + (f"; … ({len(differs)} keys)" if len(differs) > 6 else "")
    return chosen, (f"no from-scratch config equals the SPT config apart from num_train_steps; used the one with "
                    f"the most ok seeds (num_train_steps={steps}), which differs in: {text or 'nothing else'}")
  if len(groups) > 1:
    return chosen, (f"{len(groups)} from-scratch configs; used the one equal to the SPT config apart from "
                    f"num_train_steps (={steps}"
                    + (", the SPT total budget" if total is not None and steps == total else "") + ")")
  return chosen, None


def spt_cells(records: Sequence[dict], protocol: str) -> pd.DataFrame:
  """One row per (attention, objective, task) of ``protocol`` with SPT records: the SPT side (``spt_*``),
  the from-scratch side (``scratch_*``), both mean over seeds (%) with the Wilson 95% interval, their
  difference SPT − scratch (``diff``, points) with Newcombe's interval (``diff_low``/``diff_high``) and its
  verdict (≈ / higher / lower), the steps (scratch; SPT pretraining + fine-tuning, their total and
  ``budget``: "equal" or the SPT surplus), the pretraining's best validation and test accuracy (%, on the
  masked positions or next tokens), the mask rate and which scratch config was used (``scratch_note``).

  The SPT seeds of a cell are one setting (``results.setting_hash``), the one with the most ok seeds when
  several were run (the others counted in ``spt_ignored``), as ``accuracy_cells`` does."""
  rows_in = _classification(records, protocol)
  spt = [r for r in rows_in if results.pretrain_objective(r) != "none"]
  scratch = [r for r in rows_in if results.pretrain_objective(r) == "none"]
  ignored = ignored_keys(rows_in)
  seen = {r["task"] for r in spt}
  task_names = [t for t in TASK_ORDER if t in seen] + sorted(seen - set(TASK_ORDER))
  pairs = sorted({(r["attention"], results.pretrain_objective(r)) for r in spt},
                 key=lambda p: (p[0] != "vanilla", p[0], OBJECTIVE_ORDER.index(p[1])))
  rows = []
  for attention, objective in pairs:
    for task in task_names:
      mine = [r for r in spt if r["attention"] == attention and r["task"] == task
              and results.pretrain_objective(r) == objective]
      if not mine:
        continue
      chosen = max(_groups(mine), key=lambda g: _rank(g, mine))
      ok = _ok(chosen)
      pretrain_steps = _steps_value(_pretrain_steps(r) for r in ok)
      finetune_steps = _steps_value(_train_steps(r) for r in ok)
      totals = _steps_value(_pretrain_steps(r) + _train_steps(r) for r in ok
                            if None not in (_pretrain_steps(r), _train_steps(r)))
      planned = (_int(_pretrain_config(chosen[0]).get("num_train_steps")), _planned_steps(chosen[0]))
      planned_total = None if None in planned else planned[0] + planned[1]
      base, note = _choose_scratch(chosen, [r for r in scratch if r["attention"] == attention and r["task"] == task],
                                   ignored, planned_total)
      s, b = _side(chosen), _side(base)
      scratch_steps = _steps_value(_train_steps(r) for r in _ok(base))
      budget = None
      if isinstance(scratch_steps, int) and isinstance(totals, int):
        budget = "equal" if totals == scratch_steps else f"SPT {totals - scratch_steps:+d} steps".replace("-", "−")
      diff = None
      if None not in (s["mean"], b["mean"]):
        diff = newcombe_difference(s["mean"] / 100.0, s["test_examples"], b["mean"] / 100.0, b["test_examples"])
      val = [number(_pretrain_section(r).get("best_val_accuracy")) for r in ok]
      test = [number(_pretrain_section(r).get("test_accuracy")) for r in ok]
      rates = {number(_pretrain_section(r).get("mask_rate", _pretrain_config(r).get("mask_rate"))) for r in chosen}
      rows.append({
          "protocol": protocol, "attention": attention, "model": paper_name(attention), "objective": objective,
          "mask_rate": next(iter(rates)) if objective == "masked" and len(rates) == 1 else None, "task": task,
          **{f"spt_{k}": v for k, v in s.items()}, **{f"scratch_{k}": v for k, v in b.items()},
          "diff": s["mean"] - b["mean"] if None not in (s["mean"], b["mean"]) else None,
          "diff_low": 100.0 * diff[0] if diff else None, "diff_high": 100.0 * diff[1] if diff else None,
          "verdict": None if diff is None else "≈" if diff[0] <= 0.0 <= diff[1] else
          "higher" if diff[0] > 0 else "lower",
          "scratch_steps": scratch_steps, "pretrain_steps": pretrain_steps, "finetune_steps": finetune_steps,
          "spt_total_steps": totals, "budget": budget,
          "pretrain_val_accuracy": 100.0 * float(np.mean(val)) if val and None not in val else None,
          "pretrain_test_accuracy": 100.0 * float(np.mean(test)) if test and None not in test else None,
          "spt_ignored": len(mine) - len(chosen), "scratch_note": note})
  frame = pd.DataFrame(rows)
  for column in ("spt_test_examples", "scratch_test_examples", "scratch_steps", "pretrain_steps", "finetune_steps",
                 "spt_total_steps"):
    if column in frame and pd.api.types.is_numeric_dtype(frame[column]):  # not "a–b" step ranges
      frame[column] = frame[column].astype("Int64")  # a count: no "2000.0" in the CSV
  frame.attrs["tasks"] = task_names
  return frame


def _fmt(value: Any, signed: bool = False, digits: int = 2) -> str:
  value = number(value)
  if value is None:
    return ""
  text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
  return text.replace("-", "−") if signed else text


def _accuracy_text(row: pd.Series, side: str) -> str:
  """"40.00 ± 1.20 [37.9, 42.2]" (mean ± std over seeds, Wilson 95%), or the side's status."""
  mean = number(row[f"{side}_mean"])
  if mean is None:
    status = row[f"{side}_status"]
    return {"missing": "no run", "no_data": "no data", "oom": "OOM"}.get(status, status or "no run")
  text = _fmt(mean)
  if number(row[f"{side}_std"]) is not None:
    text += f" ± {row[f'{side}_std']:.2f}"
  if number(row[f"{side}_ci_low"]) is not None:
    text += f" [{row[f'{side}_ci_low']:.1f}, {row[f'{side}_ci_high']:.1f}]"
  return text


def _diff_text(row: pd.Series) -> str:
  if number(row["diff"]) is None:
    return ""
  text = _fmt(row["diff"], signed=True)
  if number(row["diff_low"]) is None:
    return text + " (no interval)"
  interval = f"[{_fmt(row['diff_low'], True, 1)}, {_fmt(row['diff_high'], True, 1)}]"
  return f"≈ {text} {interval}" if row["verdict"] == "≈" else f"{text} {interval} {row['verdict']}"


def _steps_text(row: pd.Series) -> str:
  """"5000 vs 2500 + 2500 (equal)": scratch steps vs SPT pretraining + fine-tuning steps."""
  def value(v):
    return "?" if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)

  if row["spt_n"] == 0:
    return ""
  text = f"{value(row['scratch_steps'])} vs {value(row['pretrain_steps'])} + {value(row['finetune_steps'])}"
  return text + (f" ({row['budget']})" if isinstance(row["budget"], str) else "")


def _objective_text(objective: str, rate: Any) -> str:
  return objective + (f" ({number(rate):g})" if objective == "masked" and number(rate) is not None else "")


def spt_table(cells: pd.DataFrame, protocol: str) -> Table:
  """Our SPT-vs-scratch table of ``protocol`` (``spt_cells``): per task scratch, SPT, Δ, steps and the
  pretraining's validation accuracy."""
  caption = (f"{SPT_TITLE} under protocol `{protocol}`: each fine-tuned after self-pretraining on the task's own "
             "training inputs, beside the same cell trained from scratch (the accuracy table's runs).")
  columns = ["Model", "Attention", "SPT objective"]
  if cells.empty:
    return Table(columns, [], caption=caption + " No SPT records.", left=3)
  task_names = list(cells.attrs.get("tasks") or dict.fromkeys(cells["task"]))
  for t in task_names:
    title = TASK_TITLES.get(t, t)
    columns += [f"{title} scratch", f"{title} SPT", f"{title} Δ SPT − scratch",
                f"{title} steps (scratch vs pre + fine)", f"{title} pretrain val"]
  rows, notes = [], []
  for (attention, objective), group in cells.groupby(["attention", "objective"], sort=False):
    rates = {number(v) for v in group["mask_rate"] if number(v) is not None}
    rate = rates.pop() if len(rates) == 1 else None
    row = [paper_name(attention) or "—", attention, _objective_text(objective, rate)]
    for t in task_names:
      if not (group.task == t).any():  # no SPT run of this attention and objective on the task
        row += ["", "", "", "", ""]
        continue
      c = group[group.task == t].iloc[0]
      row += [_accuracy_text(c, "scratch"), _accuracy_text(c, "spt"), _diff_text(c), _steps_text(c),
              _fmt(c["pretrain_val_accuracy"])]
      where = f"{attention} / {objective} / {TASK_TITLES.get(t, t)}"
      if isinstance(c["scratch_note"], str):
        notes.append(f"{where}: {c['scratch_note']}.")
      if c["scratch_n"] == 0 and c["spt_n"]:
        notes.append(f"{where}: no from-scratch run under `{protocol}` to compare with (the accuracy table's Fix "
                     "command runs it).")
      if int(c["spt_ignored"]):
        notes.append(f"{where}: {int(c['spt_ignored'])} SPT record(s) of other configs are not shown; the config "
                     "with the most ok seeds is.")
    rows.append(row)
  unequal = cells[cells["budget"].map(lambda b: isinstance(b, str) and b != "equal")]
  footnotes = [
      "Accuracy: test accuracy (%), mean ± std over seeds, [a, b] = Wilson 95% score interval for the n test "
      "examples (the smallest n over seeds; per-side n in the CSV). Δ = SPT − scratch in points, [a, b] = "
      "Newcombe's hybrid score interval (method 10); ≈ where it contains 0, else higher / lower. It treats the "
      "two sides as independent samples; runs tested on the same examples are correlated, so it errs towards ≈.",
      "Steps: the training steps the from-scratch run took vs the SPT pretraining steps + fine-tuning steps "
      "(from the records); (equal) when the totals match, else SPT's surplus or deficit. The comparison is fair "
      "on compute only where it says equal.",
      "Pretrain val: the pretraining's best validation accuracy (%) on its own objective — "
      + ", ".join(f"{PRETRAIN_METRIC[o]} for {o}" for o in OBJECTIVE_ORDER)
      + " — not a classification accuracy."]
  if len(unequal):
    footnotes.append(f"{len(unequal)} cell(s) compare unequal step budgets: a gain there may be the extra steps.")
  return Table(columns, rows, caption=caption, notes=notes, left=3, footnotes=footnotes)


def published_table(reference: pd.DataFrame) -> Table | None:
  """The published SPT rows (``spt_accuracy.csv``), labelled with their protocol; None without any."""
  if reference is None or reference.empty:
    return None
  task_names = list(TASK_ORDER)
  columns = ["Model", "Pretraining", "Protocol", "Source", *[TASK_TITLES[t] for t in task_names], "Avg"]
  rows = [[r["model"], r["pretraining"], r["protocol"], r["source"],
           *[r.get(REFERENCE_COLUMN.get(t, t), "") or "" for t in task_names], r.get("avg", "") or ""]
          for _, r in reference.iterrows()]
  notes = [f"{r['model']}, pretraining {r['pretraining']} ({r['source']}): {r['note']}" for _, r in reference.iterrows()
           if r.get("note")]
  protocols = "; ".join(dict.fromkeys(reference["protocol"]))
  return Table(columns, rows, left=4, notes=notes, caption=(
      f"{PUBLISHED_TITLE}: test accuracy (%) as published under the paper's own protocol "
      f"({protocols}); not comparable with ours (another model size, training budget and data handling: "
      f"no deltas). From lra_bench/report/published/{SPT_FILE}; amos_2024_table1 = Amos, Berant & Gupta, "
      "ICLR 2024, Table 1 (its Avg is over the six tasks, Path-X included); lra_paper_table1 = Tay et al., ICLR 2021, "
      "Table 1 (Avg over five tasks)."))


@dataclasses.dataclass
class SptReport:
  protocol: str
  cells: pd.DataFrame     # spt_cells (the CSV)
  ours: Table
  published: Table | None


def spt_report(records: Sequence[dict], protocol: str, reference: pd.DataFrame | None = None) -> SptReport:
  cells = spt_cells(records, protocol)
  return SptReport(protocol, cells, spt_table(cells, protocol), published_table(reference))
