"""The comparative report: accuracy and efficiency tables beside the published numbers, plots, index.

Reads only result records (``<results_dir>/results.jsonl``) and the published numbers
(``reports/reference/*.csv``). Never invents a number: a cell without a record prints ``no data`` and
the report lists the command that fills it.

  lra-bench report --results_dir results/smoke --out results/smoke/report

Writes into ``--out``: ``index.md`` (everything, with the protocol, hardware and versions), and per
table ``.md``/``.csv``/``.tex``, per figure ``.png``/``.svg``.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import shlex
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

import attention_zoo
import tasks as tasks_lib
from lra_bench import plots, results
from lra_bench.tables import Table

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_REFERENCE_DIR = os.path.join(REPO_ROOT, "reports", "reference")

# The LRA Table 1 columns, in its order; ``Avg`` is over the first five (Path-X failed for everyone).
TASK_ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
AVG_TASKS = TASK_ORDER[:5]
TASK_TITLES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
               "pathfinder": "Pathfinder", "pathx": "Path-X"}
REFERENCE_COLUMN = {"pathx": "path_x"}  # our task name -> column of lra_paper_accuracy.csv

# Our attention names -> the model names of the LRA / Combiner papers (rows of the reference CSVs).
PAPER_NAMES = {"vanilla": "Transformer", "performer": "Performer", "bigbird": "BigBird",
               "sparse_fixed": "Sparse Trans.", "combiner_fixed": "Combiner-Fixed",
               "local": "Local Attention", "longformer": "Longformer", "linformer": "Linformer",
               "reformer": "Reformer", "sinkhorn": "Sinkhorn Trans.", "synthesizer": "Synthesizer",
               "linear_transformer": "Linear Trans."}
PAPER_PREFIXES = {"combiner_axial_": "Combiner-Axial"}

# Which published numbers a protocol is comparable with: (source, columns taken from it; None = all).
# The Combiner paper copies the LRA numbers except Pathfinder, which it reran on the intermediate
# difficulty; so under `lra` its Combiner rows are used for the four other tasks only.
COMPARABLE = {
    "lra": (("lra_paper_table1", None), ("combiner_paper_table5", ("listops", "text", "retrieval", "image"))),
    "combiner": (("combiner_paper_table5", None),),
}


def paper_name(attention: str) -> str | None:
  """The published model name of ``attention`` (its config's ``paper_name``, else the table above)."""
  try:
    declared = attention_zoo.attention_config(attention).paper_name
  except ValueError:  # a record of an attention that is not registered here
    declared = None
  if declared:
    return declared
  if attention in PAPER_NAMES:
    return PAPER_NAMES[attention]
  for prefix, name in PAPER_PREFIXES.items():
    if attention.startswith(prefix):
      return name
  return None


def comparable(protocol: str) -> bool:
  return protocol in COMPARABLE


def load_reference(reference_dir: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
  """(accuracy, efficiency) published numbers; empty frames if the files are missing."""
  reference_dir = reference_dir or DEFAULT_REFERENCE_DIR
  frames = []
  for name in ("lra_paper_accuracy.csv", "lra_paper_efficiency.csv"):
    path = os.path.join(reference_dir, name)
    frames.append(pd.read_csv(path, dtype=str, keep_default_na=False) if os.path.exists(path)
                  else pd.DataFrame(columns=["source", "model"]))
  return frames[0], frames[1]


def _number(text: Any) -> float | None:
  try:
    value = float(text)
  except (TypeError, ValueError):
    return None
  return value if np.isfinite(value) else None


def reference_accuracy(reference: pd.DataFrame, protocol: str, attention: str,
                       task: str) -> tuple[float | None, str | None]:
  """(published accuracy %, source) for one cell; ``task="avg"`` for the average column."""
  model = "Chance" if attention == "__chance__" else paper_name(attention)
  if model is None or reference.empty:
    return None, None
  column = REFERENCE_COLUMN.get(task, task)
  for source, columns in COMPARABLE.get(protocol, COMPARABLE["lra"]):
    if model == "Chance" and source != "combiner_paper_table5":
      continue  # only the Combiner table has a chance row
    rows = reference[(reference["source"] == source) & (reference["model"] == model)]
    if rows.empty or column not in rows:
      continue
    if columns is not None and task not in columns:
      return None, None  # this model's only row is not comparable for this column
    return _number(rows.iloc[0][column]), source
  return None, None


# ----------------------------------------------------------------------------------------------------
# Accuracy


def report_tasks(records: Iterable[dict]) -> list[str]:
  """Columns: the LRA tasks in paper order (Path-X only if registered or run), then any other task."""
  seen = {r["task"] for r in records}
  known = set(tasks_lib.list_tasks()) | seen
  columns = [t for t in TASK_ORDER[:5]] + [t for t in TASK_ORDER[5:] if t in known]
  return columns + sorted(known - set(columns))


def report_attentions(records: Iterable[dict]) -> list[str]:
  """Rows: every registered attention plus any that has records; vanilla first."""
  names = set(attention_zoo.list_attentions()) | {r["attention"] for r in records}
  return sorted(names, key=lambda n: (n != "vanilla", n))


def _fix_command(protocol: str, task: str, attention: str, seeds: Sequence[int], results_dir: str) -> str:
  return shlex.join(["lra-bench", "suite", "--protocol", protocol, "--tasks", task, "--attentions",
                     attention, "--seeds", ",".join(map(str, seeds)), "--results_dir", results_dir])


def accuracy_cells(records: Sequence[dict], protocol: str, results_dir: str = "RESULTS_DIR",
                   attentions: Sequence[str] | None = None,
                   task_names: Sequence[str] | None = None) -> pd.DataFrame:
  """One row per (attention, task): seeds, mean/std test accuracy (%), status, error, fix command.

  Uses the latest record of each run; when a cell was run under several configs (overrides), the
  config with the most ``ok`` seeds (then the latest) is used and the others are counted in ``ignored``.
  """
  train_records = [r for r in results.latest_records(records)
                   if r.get("kind", "train") == "train" and r.get("protocol") == protocol]
  attentions = attentions or report_attentions(train_records)
  task_names = task_names or report_tasks(train_records)
  seeds_used = sorted({r["seed"] for r in train_records}) or [0]
  rows = []
  for attention in attentions:
    for task in task_names:
      mine = [r for r in train_records if r["attention"] == attention and r["task"] == task]
      by_hash: dict[str, list[dict]] = {}
      for r in mine:
        by_hash.setdefault(r.get("config_hash"), []).append(r)
      chosen: list[dict] = []
      if by_hash:
        chosen = max(by_hash.values(), key=lambda rs: (sum(r["status"] == "ok" for r in rs),
                                                        max(mine.index(r) for r in rs)))
      ok = [r for r in chosen if r["status"] == "ok" and r.get("test_accuracy") is not None]
      accs = np.asarray([100.0 * r["test_accuracy"] for r in ok])
      row = {"protocol": protocol, "attention": attention, "model": paper_name(attention), "task": task,
             "n": len(ok), "seeds": ",".join(str(r["seed"]) for r in sorted(ok, key=lambda r: r["seed"])),
             "mean": float(accs.mean()) if len(ok) else None,
             "std": float(accs.std(ddof=1)) if len(ok) > 1 else None,
             "ignored": len(mine) - len(chosen), "status": "ok" if ok else None, "error": None, "fix": None}
      if not ok:
        failed = [r for r in chosen if r["status"] != "ok"]
        last = failed[-1] if failed else None
        row["status"] = last["status"] if last else "missing"
        row["error"] = (last.get("error") or "").strip() if last else None
        fix = _fix_command(protocol, task, attention, seeds_used, results_dir)
        if last and last["status"] == "no_data":
          prepare = re.search(r"lra-bench data prepare [^\n]*", row["error"] or "")
          fix = (prepare.group(0) + " && " if prepare else "") + fix
        row["fix"] = fix
      rows.append(row)
  frame = pd.DataFrame(rows)
  frame.attrs["seeds"] = seeds_used
  return frame


def _fmt(mean: float | None, std: float | None = None, signed: bool = False) -> str:
  mean, std = _number(mean), _number(std)
  if mean is None:
    return ""
  text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
  if std is not None:
    text += f" ± {std:.2f}"
  return text.replace("-", "−") if signed else text


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
  cells = accuracy_cells(records, protocol, results_dir)
  task_names = list(dict.fromkeys(cells["task"]))
  attentions = list(dict.fromkeys(cells["attention"]))
  has_data = {t for t in task_names if (cells[(cells.task == t)]["status"] == "ok").any()}
  avg_tasks = [t for t in AVG_TASKS if t in has_data]
  refs = [reference_accuracy(reference, protocol, a, t) for a, t in zip(cells.attention, cells.task)]
  cells["reference"] = [r[0] for r in refs]
  cells["reference_source"] = [r[1] for r in refs]
  cells["delta"] = [_number(m) - _number(r) if _number(m) is not None and _number(r) is not None else None
                    for m, r in zip(cells["mean"], cells["reference"])]

  def cell(a, t):
    return cells[(cells.attention == a) & (cells.task == t)].iloc[0]

  def row_avg(a) -> float | None:
    means = [_number(cell(a, t)["mean"]) for t in avg_tasks]
    return float(np.mean(means)) if avg_tasks and None not in means else None

  columns = ["Model", "Attention", *[TASK_TITLES.get(t, t) for t in task_names], "Avg"]
  chance = ["Chance", ""]
  chance_values = []
  for t in task_names:
    try:
      value = 100.0 * tasks_lib.get_task(t).chance_accuracy
    except (ValueError, AttributeError):
      value = reference_accuracy(reference, "combiner", "__chance__", t)[0]
    chance.append(_fmt(value))
    chance_values.append((t, value))
  chance_avg = [v for t, v in chance_values if t in avg_tasks]
  chance.append(_fmt(float(np.mean(chance_avg))) if avg_tasks and None not in chance_avg else "")
  rows, bold, notes = [chance], set(), []
  best = {t: cells[(cells.task == t) & (cells.status == "ok")]["mean"].max() for t in task_names}
  avgs = {a: row_avg(a) for a in attentions}
  best_avg = max((v for v in avgs.values() if v is not None), default=None)
  for i, a in enumerate(attentions, start=1):
    row = [paper_name(a) or "—", a]
    for j, t in enumerate(task_names, start=2):
      c = cell(a, t)
      if c["status"] == "ok":
        row.append(_fmt(c["mean"], c["std"]))
        if np.isclose(c["mean"], best[t]):
          bold.add((i, j))
      else:
        row.append(STATUS_TEXT.get(c["status"], c["status"]))
    row.append(_fmt(avgs[a]))
    if avgs[a] is not None and np.isclose(avgs[a], best_avg):
      bold.add((i, len(columns) - 1))
    rows.append(row)
  seeds = sorted({int(s) for ss in cells["seeds"] if ss for s in ss.split(",")})
  caption = (f"Test accuracy (%) under protocol `{protocol}`: mean ± std over seeds "
             f"({', '.join(map(str, seeds)) or 'none'}); best per column in bold. "
             f"Avg over {', '.join(TASK_TITLES.get(t, t) for t in avg_tasks) or 'no task'}"
             + (" (the tasks with data; the paper averages all five)." if len(avg_tasks) < 5 else "."))
  if not comparable(protocol):
    caption = (f"**Protocol `{protocol}` is not the paper's protocol: these numbers are NOT comparable to "
               f"the published ones** (shown below for orientation only, without deltas). " + caption)
  notes = _missing_notes(cells, protocol, results_dir)
  if int(cells["ignored"].sum()):
    notes.append(f"{int(cells['ignored'].sum())} record(s) of other configs (overrides) of the same cells "
                 "are not shown; the config with the most ok seeds is.")
  ours = Table(columns, rows, bold, caption, notes, left=2)

  pub_columns = ["Model", "Attention", *[TASK_TITLES.get(t, t) for t in task_names], "Avg", "Source"]
  pub_rows = []
  for a in attentions:
    if paper_name(a) is None:
      continue
    values = [cell(a, t)["reference"] for t in task_names]
    avg, avg_source = reference_accuracy(reference, protocol, a, "avg")
    sources = sorted({s for s in cells[cells.attention == a]["reference_source"] if isinstance(s, str)})
    if all(_number(v) is None for v in values):
      continue
    pub_rows.append([paper_name(a), a, *[_fmt(v) for v in values], _fmt(avg), ", ".join(sources)])
  published = Table(pub_columns, pub_rows, left=2, caption=(
      "Published test accuracy (%) of the same models (reports/reference/; lra_paper_table1 = Tay et al. "
      "2021 Table 1, combiner_paper_table5 = Ren et al. 2021 Table 5)."))

  delta = None
  if comparable(protocol):
    d_rows = []
    for a in attentions:
      values = [_number(cell(a, t)["delta"]) for t in task_names]
      if all(v is None for v in values):
        continue
      d_rows.append([paper_name(a) or "—", a, *[_fmt(v, signed=True) for v in values]])
    delta = Table(["Model", "Attention", *[TASK_TITLES.get(t, t) for t in task_names]], d_rows, left=2,
                  caption="Δ = ours − published (accuracy points); empty where either side has no number.")
  return AccuracyReport(protocol, cells, ours, published, delta, avg_tasks)


def _task_problem(protocol: str, task: str) -> str | None:
  """Why a whole column cannot have data in this checkout (None if it can)."""
  if task not in tasks_lib.list_tasks():
    return f"task {task!r} is not implemented in this checkout"
  from lra_bench import config as config_lib

  try:
    config_lib.load_config(protocol, task)
  except config_lib.ConfigError as err:
    return str(err)
  return None


def _missing_notes(cells: pd.DataFrame, protocol: str, results_dir: str) -> list[str]:
  """One line per empty cell with its reason and fix; one line per column that is empty throughout."""
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
    if len(missing) == len(col) and set(missing.status) <= {"missing", "no_data"}:
      prepare = next((re.search(r"lra-bench data prepare [^\n]*", e).group(0) for e in missing.error
                      if isinstance(e, str) and re.search(r"lra-bench data prepare", e)), None)
      fix = _fix_command(protocol, task, "all", cells.attrs.get("seeds", [0]), results_dir)
      notes.append(f"{title}: no data for any attention. Fix: `{(prepare + ' && ') if prepare else ''}{fix}`")
      continue
    for _, c in missing.iterrows():
      reason = f" — {c['error'].splitlines()[0][:160]}" if isinstance(c["error"], str) and c["error"] else ""
      notes.append(f"{c['attention']} / {title}: {STATUS_TEXT.get(c['status'], c['status'])}{reason}. "
                   f"Fix: `{c['fix']}`")
  return notes


# ----------------------------------------------------------------------------------------------------
# Efficiency


def bench_frame(records: Sequence[dict]) -> pd.DataFrame:
  """One row per benchmark point (latest record of each)."""
  rows = []
  for r in results.latest_records(x for x in records if x.get("kind") == "bench"):
    memory, source = (r.get("peak_memory_bytes"), "runtime peak") if r.get("peak_memory_bytes") \
        else (r.get("compiled_memory_bytes"), "XLA compiled estimate")
    rows.append({"attention": r["attention"], "mode": r.get("mode"), "batch_size": r.get("batch_size"),
                 "backend": r.get("backend"), "device_kind": r.get("device_kind"), "length": r["max_length"],
                 "status": r["status"], "compile_only": bool(r.get("compile_only")),
                 "steps_per_second": r.get("steps_per_second"), "step_seconds_median": r.get("step_seconds_median"),
                 "step_seconds_q25": r.get("step_seconds_q25"), "step_seconds_q75": r.get("step_seconds_q75"),
                 "examples_per_second": r.get("examples_per_second"),
                 "peak_memory_bytes": r.get("peak_memory_bytes"), "peak_rss_bytes": r.get("peak_rss_bytes"),
                 "compiled_memory_bytes": r.get("compiled_memory_bytes"), "memory_bytes": memory,
                 "memory_source": source if memory else None, "flops_per_step": r.get("flops_per_step"),
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


def _ratio(value, base) -> str:
  if value is None or base is None or not np.isfinite(value) or not np.isfinite(base) or base == 0:
    return ""
  return f" ({value / base:.2f}×)"


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
  memory_source: str

  @property
  def stem(self) -> str:
    return f"{self.mode}_b{self.batch_size}_{re.sub(r'[^A-Za-z0-9]+', '-', self.device_kind).strip('-').lower()}"


def _point(frame: pd.DataFrame, attention: str, length: int) -> pd.Series | None:
  rows = frame[(frame.attention == attention) & (frame.length == length)]
  return rows.iloc[-1] if len(rows) else None


def _efficiency_table(frame: pd.DataFrame, metric: str, fmt, caption: str, lengths: list[int],
                      attentions: list[str]) -> Table:
  columns = ["Attention", *[f"{length:,}".replace(",", " ") for length in lengths]]
  rows = []
  for a in attentions:
    row = [a]
    for length in lengths:
      p = _point(frame, a, length)
      base = _point(frame, "vanilla", length)
      if p is None:
        row.append("—")
      elif p["status"] != "ok":
        row.append({"oom": "OOM"}.get(p["status"], p["status"]))
      elif metric == "steps_per_second" and p["compile_only"]:
        row.append("compiled only")
      else:
        value = p[metric]
        base_value = base[metric] if base is not None and base["status"] == "ok" else None
        if value is None or not np.isfinite(value):
          row.append("n/a")
        else:
          row.append(fmt(value) + ("" if a == "vanilla" else _ratio(value, base_value)))
    rows.append(row)
  return Table(columns, rows, caption=caption)


def efficiency_groups(records: Sequence[dict], reference_eff: pd.DataFrame) -> list[EfficiencyGroup]:
  frame = bench_frame(records)
  if frame.empty:
    return []
  groups = []
  for (mode, batch, device), g in frame.groupby(["mode", "batch_size", "device_kind"], sort=True):
    lengths = sorted(g.length.unique().tolist())
    attentions = sorted(g.attention.unique(), key=lambda n: (n != "vanilla", n))
    what = "training step (forward + backward + AdamW)" if mode == "train" else "inference (forward only)"
    setting = f"LRA Text model (4 layers, emb 256, 4 heads, mlp 1024), batch {batch}, {device}"
    sources = sorted({s for s in g.memory_source if isinstance(s, str)})
    speed = _efficiency_table(g, "steps_per_second", lambda v: f"{v:.2f}",
                              f"Steps per second, {what}; {setting}. Median over repeats; "
                              "(ratio vs vanilla) at the same length.", lengths, attentions)
    memory = _efficiency_table(g, "memory_bytes", _bytes,
                               f"Memory per step ({' / '.join(sources) or 'n/a'}), {what}; {setting}. "
                               "(ratio vs vanilla).", lengths, attentions)
    flops = _efficiency_table(g, "flops_per_step", lambda v: f"{v / 1e9:.1f} G",
                              f"XLA FLOPs per step, {what}; {setting}. (ratio vs vanilla).",
                              lengths, attentions)
    published = _published_efficiency(reference_eff, attentions) if mode == "train" else None
    groups.append(EfficiencyGroup(mode, int(batch), device, g, speed, memory, flops, published,
                                  " / ".join(sources) or "n/a"))
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
    speed = [f"{_number(r[f'steps_per_second_{k}']) / _number(base[f'steps_per_second_{k}']):.2f}×" for k in keys]
    memory = [f"{_number(r[f'peak_memory_gb_{k}']) / _number(base[f'peak_memory_gb_{k}']):.2f}×" for k in keys]
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
# The whole report


def _environment(records: Sequence[dict]) -> list[str]:
  def unique(values):
    return sorted({v for v in values if v})

  lines = []
  for kind in ("train", "bench"):
    rs = [r for r in records if r.get("kind", "train") == kind]
    if not rs:
      continue
    hardware = unique(f"{r.get('backend')} / {r.get('device_kind')} × {r.get('num_devices')}" for r in rs)
    lines.append(f"- {kind} records: {len(rs)}; hardware: {'; '.join(hardware)}")
  versions = {}
  for r in records:
    for k, v in (r.get("versions") or {}).items():
      versions.setdefault(k, set()).add(v)
  if versions:
    lines.append("- versions: " + ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in sorted(versions.items())))
  shas = unique(r.get("git_sha") for r in records)
  if shas:
    lines.append("- code: git " + ", ".join(s[:12] + ("+dirty" if s.endswith("+dirty") else "") for s in shas))
  return lines


def _write(path: str, text: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text if text.endswith("\n") else text + "\n")
  return path


def _protocol_order(protocols: Iterable[str]) -> list[str]:
  preferred = ["lra", "combiner", "xiong", "smoke"]
  return sorted(set(protocols), key=lambda p: (preferred.index(p) if p in preferred else len(preferred), p))


def write_report(results_dir: str, out_dir: str, *, reference_dir: str | None = None,
                 attention_length: int = 64, command: str | None = None,
                 protocols: Sequence[str] | None = None,
                 attention_names: Sequence[str] | None = None) -> list[str]:
  """Writes every table and figure of ``results_dir``'s records into ``out_dir``; returns the paths."""
  from lra_bench import viz

  records = results.load_records(results_dir)
  reference_acc, reference_eff = load_reference(reference_dir)
  os.makedirs(out_dir, exist_ok=True)
  written: list[str] = []
  rel = lambda p: os.path.relpath(p, out_dir)
  train_records = [r for r in records if r.get("kind", "train") == "train"]
  bench_only = bool(records) and not train_records and not protocols
  # An empty results dir still shows the smoke table ("no data" cells with the commands that fill
  # them); a benchmark-only dir gets no accuracy section at all.
  protocols = [] if bench_only else _protocol_order(
      protocols or [r["protocol"] for r in train_records] or ["smoke"])

  index = ["# lra-bench report", "",
           f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} from "
           f"`{os.path.join(results_dir, results.RESULTS_FILE)}` ({len(records)} records)"
           + (f" by `{command}`." if command else "."), "",
           (f"Protocols: {', '.join(f'`{p}`' for p in protocols)}. " if protocols else
            "Benchmark records only (no accuracy section; train with `lra-bench suite`). ")
           + f"Registered attentions: {', '.join(attention_zoo.list_attentions())}.", "",
           *_environment(records), ""]

  accuracy_reports = []
  for protocol in protocols:
    rep = accuracy_report(records, protocol, reference_acc, results_dir)
    accuracy_reports.append(rep)
    stem = os.path.join(out_dir, f"accuracy_{protocol}")
    rep.cells.to_csv(stem + ".csv", index=False)
    written += [stem + ".csv", _write(stem + ".tex", rep.ours.to_latex())]
    md = [f"## Accuracy — protocol `{protocol}`", "", rep.ours.to_markdown(), "", rep.published.to_markdown()]
    if rep.delta is not None:
      md += ["", rep.delta.to_markdown()]
    md += ["", f"Files: [{rel(stem)}.csv]({rel(stem)}.csv) (every cell with seeds, reference, delta), "
               f"[{rel(stem)}.tex]({rel(stem)}.tex)."]
    written.append(_write(stem + ".md", "\n".join(md)))
    index += md + [""]

  groups = efficiency_groups(records, reference_eff)
  if not groups:
    index += ["## Efficiency", "", "No benchmark records. Measure with "
              f"`lra-bench bench --results_dir {results_dir}` (see README).", ""]
  for g in groups:
    stem = os.path.join(out_dir, f"efficiency_{g.stem}")
    g.frame.to_csv(stem + ".csv", index=False)
    written += [stem + ".csv",
                _write(stem + ".tex", g.speed.to_latex() + g.memory.to_latex() + g.flops.to_latex())]
    figure = plots.scaling_figure(
        scaling_series(g.frame), [("time", "seconds per step (median, IQR)"),
                                  ("memory", f"memory per step (bytes; {g.memory_source})"),
                                  ("flops", "XLA FLOPs per step")],
        f"{g.mode}, batch {g.batch_size}, {g.device_kind}", os.path.join(out_dir, f"scaling_{g.stem}"))
    written += figure
    md = [f"## Efficiency — {g.mode}, batch {g.batch_size}, {g.device_kind}", "",
          f"![scaling]({rel(figure[0])})", "", f"Log-log; legend: fitted slope of log y on log length "
          f"(numpy.polyfit). [SVG]({rel(figure[1])})", "",
          g.speed.to_markdown(), "", g.memory.to_markdown(), "", g.flops.to_markdown()]
    if g.published is not None:
      md += ["", g.published.to_markdown()]
    md += ["", f"Files: [{rel(stem)}.csv]({rel(stem)}.csv) (every point: median, quartiles, memory, FLOPs, "
               f"compile time), [{rel(stem)}.tex]({rel(stem)}.tex)."]
    written.append(_write(stem + ".md", "\n".join(md)))
    index += md + [""]

  bubble = _bubble(accuracy_reports, groups, out_dir)
  if bubble:
    written += bubble[0]
    index += ["## Accuracy vs speed (LRA Fig. 3)", "", f"![bubble]({rel(bubble[0][0])})", "", bubble[1], ""]

  stem = os.path.join(out_dir, "attention_patterns")
  paths, errors = viz.plot_attention_grid(attention_names or attention_zoo.list_attentions(), stem,
                                          length=attention_length)
  written += paths
  index += ["## Effective attention patterns", ""]
  if paths:
    index += [f"![attention patterns]({rel(paths[0])})", "",
              f"Each panel is the matrix a core applies to the values (one head, random queries and keys, "
              f"value = identity, L = {attention_length}). One core: `lra-bench viz attention NAME`.", ""]
  index += [f"- {name}: could not be probed: {err[:200]}" for name, err in errors.items()]

  written.append(_write(os.path.join(out_dir, "index.md"), "\n".join(index)))
  return written


def _bubble(accuracy_reports: Sequence[AccuracyReport], groups: Sequence[EfficiencyGroup],
            out_dir: str) -> tuple[list[str], str] | None:
  """Average accuracy of the first protocol with data vs training speed at the best-covered length."""
  train_groups = [g for g in groups if g.mode == "train"] or list(groups)
  if not accuracy_reports or not train_groups:
    return None
  rep = next((r for r in accuracy_reports if r.avg_tasks), None)
  if rep is None:
    return None
  group = max(train_groups, key=lambda g: int(((g.frame.status == "ok") & ~g.frame.compile_only).sum()))
  timed = group.frame[(group.frame.status == "ok") & ~group.frame.compile_only]
  if timed.empty:
    return None
  counts = timed.groupby("length").attention.nunique()
  length = int(max(counts.index, key=lambda n: (counts[n], n)))
  cells = rep.cells
  points = []
  for _, p in timed[timed.length == length].iterrows():
    means = [cells[(cells.attention == p.attention) & (cells.task == t)]["mean"].iloc[0] for t in rep.avg_tasks
             if len(cells[(cells.attention == p.attention) & (cells.task == t)])]
    if len(means) != len(rep.avg_tasks) or any(m is None or not np.isfinite(m) for m in means):
      continue
    points.append({"name": p.attention, "speed": p.examples_per_second, "accuracy": float(np.mean(means)),
                   "memory_bytes": p.memory_bytes})
  if not points:
    return None
  stem = os.path.join(out_dir, f"bubble_{rep.protocol}")
  paths = plots.bubble_figure(points, f"protocol {rep.protocol}: avg accuracy vs speed at L={length} "
                              f"({group.mode}, batch {group.batch_size}, {group.device_kind}); "
                              "area = memory", "examples per second (log)", stem)
  text = (f"Average accuracy over {', '.join(TASK_TITLES.get(t, t) for t in rep.avg_tasks)} "
          f"(protocol `{rep.protocol}`) against {group.mode} examples/s at length {length}; bubble area ∝ "
          f"memory. [SVG]({os.path.relpath(paths[1], out_dir)})")
  return paths, text
