"""The comparative report: accuracy and efficiency tables beside the published numbers, plots, index.

Reads only result records (``<results_dir>/results.jsonl``) and the published numbers
(``lra_bench/report/published/*.csv``). Never invents a number: a cell without a record prints ``no data`` and
the report lists the command that fills it.

  lra-bench report --results_dir results/smoke --out results/smoke/report

Writes into ``--out``: ``index.md`` (everything, with the protocol, hardware and versions), and per
table ``.md``/``.csv``/``.tex``, per figure ``.png``/``.svg``.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any, Callable, Iterable, Sequence

import numpy as np

import attention_zoo
from tasks.progress import Progress
from lra_bench.experiments import results
from lra_bench.report import curves, plots, pretraining, recall, summary, viz
from lra_bench.report.accuracy import FOLLOWUPS_TITLE, AccuracyReport, accuracy_report, followups_table
from lra_bench.report.efficiency import (CORE_MODES, Anchors, EfficiencyGroup, dropout_words, efficiency_groups,
                                         family_order, scaling_series)
from lra_bench.report.reference import (DEFAULT_REFERENCE_DIR, FOLLOWUPS_FILE, OWN_PUBLISHED, SPT_FILE,
                                        TASK_TITLES, load_followups, load_reference, load_spt_reference,
                                        own_reference)


# The published numbers a --reference_dir holds (reference.load_reference / load_followups /
# load_spt_reference read them).
REFERENCE_FILES = ("lra_paper_accuracy.csv", "lra_paper_efficiency.csv", FOLLOWUPS_FILE, SPT_FILE)


def shown_path(path: str) -> str:
  """``path`` as a report shows it: relative to the working directory the report was made in (so its commands
  run from there), never the machine's absolute path."""
  return os.path.relpath(os.path.abspath(path))


def reference_problem(reference_dir: str | None) -> str | None:
  """Why ``reference_dir`` holds no published numbers (so every published table would be empty), or
  None; None for the default (the package's ``lra_bench/report/published``)."""
  if reference_dir is None:
    return None
  expected = (f"expected a folder with the published numbers ({', '.join(REFERENCE_FILES)}), as "
              f"{DEFAULT_REFERENCE_DIR}; leave --reference_dir out to use that one")
  if not os.path.exists(reference_dir):
    return f"{reference_dir} does not exist; {expected}"
  if not os.path.isdir(reference_dir):
    return f"{reference_dir} is a file, not a directory; {expected}"
  if not any(os.path.isfile(os.path.join(reference_dir, name)) for name in REFERENCE_FILES):
    return f"{reference_dir} holds no published numbers; {expected}"
  return None


def _environment(records: Sequence[dict]) -> list[str]:
  def unique(values):
    return sorted({v for v in values if v})

  lines = []
  for kind in ("train", "pretrain", "bench"):
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


@dataclasses.dataclass
class _Out:
  """The output directory, the files written so far and the lines of index.md."""

  directory: str
  written: list[str] = dataclasses.field(default_factory=list)
  index: list[str] = dataclasses.field(default_factory=list)

  def rel(self, path: str) -> str:
    return os.path.relpath(path, self.directory)

  def write(self, path: str, text: str) -> str:
    self.written.append(_write(path, text))
    return path

  def section(self, stem: str, md: list[str]) -> None:
    """``md`` as ``<stem>.md`` and as a section of index.md."""
    self.write(stem + ".md", "\n".join(md))
    self.index += md + [""]


def write_report(results_dir: str, out_dir: str, *, reference_dir: str | None = None,
                 attention_length: int = 64, command: str | None = None,
                 protocols: Sequence[str] | None = None,
                 attention_names: Sequence[str] | None = None,
                 attention_compiler: Callable | None = None,
                 attention_fits: Callable[[Any, str, str], None] | None = None,
                 progress: bool = False) -> list[str]:
  """Writes every table and figure of ``results_dir``'s records into ``out_dir``; returns the paths.

  ``attention_names``: the attentions whose effective patterns are drawn into ``attention_patterns.png``
  (None or empty, the default: none, and no patterns section; a report draws them only when asked, for a
  study about the patterns). ``attention_compiler`` / ``attention_fits``: how the attention
  patterns' probe is compiled and checked for memory before it runs (``viz.plot_attention_grid``'s
  ``compiler`` / ``fits``; the command line passes training's). ``progress``: the report's steps (each
  protocol's tables, the recall and curve sections, each benchmark group, each core's pattern, the index)
  on the console (``tasks.progress``)."""
  records, unreadable = results.read_records(results_dir)
  results.warn_unreadable(unreadable)
  reference_acc, reference_eff = load_reference(reference_dir)
  os.makedirs(out_dir, exist_ok=True)
  out = _Out(out_dir)
  train_records = [r for r in records if r.get("kind", "train") == "train"]
  # The recall tables compare runs from scratch (a run fine-tuned after self-pretraining is not one of a
  # sweep's runs); the accuracy tables read from-scratch runs only too (``accuracy_cells``).
  recall_records = [r for r in train_records if recall.is_recall(r.get("task", ""))
                    and results.pretrain_objective(r) == "none"]
  train_records = [r for r in train_records if not recall.is_recall(r.get("task", ""))]
  bench_only = bool(records) and not train_records and not protocols
  # An empty results dir still shows the smoke table ("no data" cells with the commands that fill
  # them); a benchmark-only (or recall-only) dir gets no LRA accuracy section at all.
  protocols = [] if bench_only else _protocol_order(
      protocols or [r["protocol"] for r in train_records] or ["smoke"])
  out.index = ["# lra-bench report", "",
               f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} from "
               f"`{shown_path(os.path.join(results_dir, results.RESULTS_FILE))}` ({len(records)} records"
               + (f", {len(unreadable)} unreadable lines" if unreadable else "") + ")"
               + (f" by `{command}`." if command else "."), ""]
  opening = len(out.index)  # the summary goes here once the tables behind it are made
  out.index += [*_unreadable_section(unreadable),
               (f"Protocols: {', '.join(f'`{p}`' for p in protocols)}. " if protocols else
                "Recall records only (no LRA accuracy section). " if recall_records else
                "Benchmark records only (no accuracy section; train with `lra-bench suite`). ")
               + "Registered layers (attention cores and sequence mixers): "
               + f"{', '.join(attention_zoo.list_layers())}.", "",
               *_environment(records), ""]
  names = list(attention_names or ())
  groups = efficiency_groups(records, reference_eff, Anchors.load(reference_dir))
  steps = Progress(len(protocols) + 1 + len(groups) + len(names) + 1, "report", "steps", enabled=progress)
  try:
    _sections(out, steps, records, protocols, recall_records, groups, names, results_dir, out_dir, reference_dir,
              reference_acc, attention_length, attention_compiler, attention_fits, opening)
  finally:
    steps.close()
  return out.written


def _sections(out: _Out, steps: Progress, records: Sequence[dict], protocols: Sequence[str],
              recall_records: Sequence[dict], groups: Sequence[EfficiencyGroup], names: Sequence[str],
              results_dir: str, out_dir: str, reference_dir: str | None, reference_acc, attention_length: int,
              attention_compiler, attention_fits, opening: int) -> None:
  """Every section of the report after its header, then the summary at ``opening`` and index.md."""
  followups = load_followups(reference_dir)
  # a protocol that runs its own paper's recipe is set beside that paper's rows, any other beside LRA's
  accuracy_reports = []
  for p in protocols:
    steps.set_status(f"accuracy tables of {p}")
    accuracy_reports.append(_accuracy_section(out, accuracy_report(
        records, p, own_reference(followups, p) if p in OWN_PUBLISHED else reference_acc, shown_path(results_dir))))
    steps.advance(note=f"accuracy tables of {p}")
  steps.set_status("recall and training-curve sections")
  spt_protocols = [p for p in protocols if pretraining.has_spt(records, p)]
  for p in spt_protocols:
    _spt_section(out, pretraining.spt_report(records, p, load_spt_reference(reference_dir)))
  recall_reports = _recall_sections(out, recall_records, reference_dir)
  curve_paths, curve_lines = curves.section(records, _protocol_order({r.get("protocol", "") for r in records
                                                                     if r.get("kind", "train") == "train"}),
                                            out_dir)
  out.written += curve_paths
  out.index += curve_lines
  if protocols:
    _followups_section(out, followups)
  steps.advance(note="recall and training-curve sections")
  if not groups:
    out.index += ["## Efficiency", "", "No benchmark records. Measure with "
                  f"`lra-bench bench --results_dir {shown_path(results_dir)}` (see README).", ""]
  for g in groups:
    steps.set_status(f"efficiency tables and plots {g.stem}")
    _efficiency_section(out, g)
    steps.advance(note=f"efficiency tables and plots {g.stem}")
  bubble = _bubble(accuracy_reports, groups, out_dir)
  if bubble:
    out.written += bubble[0]
    out.index += ["## Accuracy vs speed (LRA Fig. 3)", "", f"![bubble]({out.rel(bubble[0][0])})", "",
                  bubble[1], ""]
  if names:  # none asked for: no patterns section
    steps.set_status("effective attention patterns")
    _patterns_section(out, names, attention_length, compiler=attention_compiler, fits=attention_fits,
                      done=lambda name: steps.advance(note=f"pattern of {name}"))
  headline = summary.section(summary.headline(accuracy_reports, groups, recall_reports))
  out.write(os.path.join(out_dir, summary.FILE), "\n".join(headline))
  out.index[opening:opening] = headline
  out.write(os.path.join(out_dir, "index.md"), "\n".join(out.index))
  steps.advance(note="summary and index.md")


def _unreadable_section(unreadable: Sequence[str]) -> list[str]:
  """Lines of the results file that are not records (e.g. cut short by a full disk): said up front,
  since their runs show as ``no data`` below."""
  if not unreadable:
    return []
  return ["## Unreadable lines in the results file", "",
          f"**{len(unreadable)} line(s) could not be read and are left out of every table below** (their "
          "runs show as `no data`; rerun them to record them again):", "",
          *[f"- `{problem}`" for problem in unreadable], ""]


def _accuracy_section(out: _Out, rep: AccuracyReport) -> AccuracyReport:
  stem = os.path.join(out.directory, f"accuracy_{rep.protocol}")
  rep.cells.to_csv(stem + ".csv", index=False)
  out.written.append(stem + ".csv")
  out.write(stem + ".tex", rep.ours.to_latex())
  md = [f"## Accuracy — protocol `{rep.protocol}`", "", rep.ours.to_markdown(), "", rep.published.to_markdown()]
  if rep.delta is not None:
    md += ["", rep.delta.to_markdown()]
  md += ["", f"Files: [{out.rel(stem)}.csv]({out.rel(stem)}.csv) (every cell with seeds, test examples, Wilson "
             f"interval, difference from vanilla, reference, delta), [{out.rel(stem)}.tex]({out.rel(stem)}.tex)."]
  out.section(stem, md)
  return rep


def _spt_section(out: _Out, rep: pretraining.SptReport) -> None:
  """One protocol's SPT-vs-scratch table (``pretraining_<protocol>``) and the published SPT rows."""
  stem = os.path.join(out.directory, f"pretraining_{rep.protocol}")
  rep.cells.to_csv(stem + ".csv", index=False)
  out.written.append(stem + ".csv")
  tables = [rep.ours] + ([rep.published] if rep.published is not None else [])
  out.write(stem + ".tex", "".join(t.to_latex() for t in tables))
  md = [f"## {pretraining.SPT_TITLE} — protocol `{rep.protocol}`", "", rep.ours.to_markdown()]
  if rep.published is not None:
    md += ["", rep.published.to_markdown()]
  md += ["", f"Files: [{out.rel(stem)}.csv]({out.rel(stem)}.csv) (every cell: both sides' seeds, test examples, "
             f"Wilson intervals, the difference with Newcombe's interval, the steps, the pretraining's accuracy), "
             f"[{out.rel(stem)}.tex]({out.rel(stem)}.tex)."]
  out.section(stem, md)


def _recall_sections(out: _Out, records: Sequence[dict], reference_dir: str | None) -> list:
  """One section per protocol with recall records: its tables (one per task) and two figures; returns the
  protocols' ``recall.RecallReport`` (for the summary)."""
  frame = recall.recall_frame(records)
  if frame.empty:
    return []
  reports = []
  reference = recall.load_reference(reference_dir)
  no_causal = recall.no_causal_forms()
  for protocol in _protocol_order(frame["protocol"].unique()):
    rep = recall.recall_tables(frame, protocol, reference, no_causal)
    reports.append(rep)
    stem = os.path.join(out.directory, f"recall_{protocol}")
    rep.frame.to_csv(stem + "_runs.csv", index=False)
    rep.best.to_csv(stem + ".csv", index=False)
    out.written += [stem + "_runs.csv", stem + ".csv"]
    out.write(stem + ".tex", "".join(t.to_latex() for t in rep.tables))
    md = [f"## Recall — protocol `{protocol}`", ""]
    for table in rep.tables:
      md += [table.to_markdown(), ""]
    figure = recall.state_size_figure(rep.best, f"Recall vs causal state ({protocol}): best run per attention",
                                      stem + "_state_size")
    if figure:
      out.written += figure
      md += [f"![recall vs state size]({out.rel(figure[0])})", ""]
    figure = recall.width_figure(rep.best, f"Recall vs width ({protocol}): best over learning rates",
                                 stem + "_width")
    if figure:
      out.written += figure
      md += [f"![recall vs width]({out.rel(figure[0])})", ""]
    md += [f"Files: [{out.rel(stem)}.csv]({out.rel(stem)}.csv) (best of each sweep, Wilson interval, state "
           f"size), [{out.rel(stem)}_runs.csv]({out.rel(stem)}_runs.csv) (every run), "
           f"[{out.rel(stem)}.tex]({out.rel(stem)}.tex)."]
    out.section(stem, md)
  return reports


def _followups_section(out: _Out, followups) -> None:
  table = followups_table(followups)
  if table is not None:
    stem = os.path.join(out.directory, "published_other_protocols")
    out.write(stem + ".tex", table.to_latex())
    out.section(stem, [f"## {FOLLOWUPS_TITLE}", "", table.to_markdown()])


def _efficiency_section(out: _Out, g: EfficiencyGroup) -> None:
  stem = os.path.join(out.directory, f"efficiency_{g.stem}")
  g.frame.to_csv(stem + ".csv", index=False)
  out.written.append(stem + ".csv")
  peak = [] if g.peak_memory is None else [g.peak_memory]
  out.write(stem + ".tex", "".join(t.to_latex() for t in [g.speed, g.memory, *peak, g.flops]))
  crossover = os.path.join(out.directory, f"crossover_{g.stem}")
  g.crossover_frame.to_csv(crossover + ".csv", index=False)
  out.written.append(crossover + ".csv")
  out.write(crossover + ".tex", g.crossover.to_latex())
  out.write(crossover + ".md", g.crossover.to_markdown())
  series = scaling_series(g.frame)
  family_of = dict(zip(g.frame.attention, g.frame.family))
  per_step = {"core": "forward + backward", "core_forward": "forward"}.get(g.mode, "step")
  figures = [plots.family_scaling_figure(
      series, family_of, metric, label, f"{title} vs sequence length: {g.what}; {g.setting}",
      os.path.join(out.directory, f"scaling_{g.stem}_{metric}"), families=family_order(family_of.values()))
      for metric, label, title in (("time", f"seconds per {per_step} (median, IQR)", "Time"),
                                   ("memory", f"bytes per {per_step} ({g.memory_source})", "Memory"))]
  for figure in figures:
    out.written += figure
  dropout = "" if g.attention_dropout is None else f", attention dropout {dropout_words(g.attention_dropout)}"
  md = [f"## Efficiency — {g.mode}, batch {g.batch_size}{dropout}, {g.device_kind}", ""]
  for figure in figures:
    md += [f"![scaling]({out.rel(figure[0])})", ""]
  md += ["Log-log, one panel per attention family, vanilla and flash as grey dashed references in every "
         "panel; legends: fitted slope of log y on log length (numpy.polyfit). SVG: "
         + ", ".join(f"[{out.rel(f[1])}]({out.rel(f[1])})" for f in figures) + ".", "",
         g.crossover.to_markdown(), "",
         f"Files: [{out.rel(crossover)}.csv]({out.rel(crossover)}.csv) (slopes and crossover lengths as "
         f"numbers), [{out.rel(crossover)}.tex]({out.rel(crossover)}.tex).", ""]
  if g.checks is not None:
    checks = os.path.join(out.directory, f"checks_{g.stem}")
    g.checks_frame.to_csv(checks + ".csv", index=False)
    out.written.append(checks + ".csv")
    out.write(checks + ".tex", g.checks.to_latex())
    md += ["### Time, ratio to flash and FLOP/s per length", "", g.checks.to_markdown(), "",
           f"Files: [{out.rel(checks)}.csv]({out.rel(checks)}.csv) (every number of this table, with the shapes, "
           f"the compute dtype and the peak it is held against), [{out.rel(checks)}.tex]({out.rel(checks)}.tex).",
           ""]
  if g.anchors:
    md += ["### Published anchors", ""]
    md += [line for t in g.anchors for line in (t.to_markdown(), "")]
  md += [g.speed.to_markdown(), "", g.memory.to_markdown(), ""]
  md += [line for t in peak for line in (t.to_markdown(), "")] + [g.flops.to_markdown()]
  if g.published is not None:
    md += ["", g.published.to_markdown()]
  md += ["", f"Files: [{out.rel(stem)}.csv]({out.rel(stem)}.csv) (every point: median, quartiles, memory, "
             f"FLOPs, compile time), [{out.rel(stem)}.tex]({out.rel(stem)}.tex)."]
  out.section(stem, md)


def _patterns_section(out: _Out, names: Sequence[str], length: int, **probe: Any) -> None:
  """The effective-attention heatmaps of ``names`` (``probe``: ``viz.plot_attention_grid``'s keywords)."""
  paths, errors = viz.plot_attention_grid(names, os.path.join(out.directory, "attention_patterns"), length=length,
                                          **probe)
  out.written += paths
  out.index += ["## Effective attention patterns", ""]
  if paths:
    out.index += [f"![attention patterns]({out.rel(paths[0])})", "",
                  f"Each panel is the matrix a core applies to the values (one head, random queries and keys, "
                  f"value = identity, L = {length}). One core: `lra-bench viz attention NAME`.", ""]
  out.index += [f"- {name}: could not be probed: {err[:200]}" for name, err in errors.items()]


def _bubble(accuracy_reports: Sequence[AccuracyReport], groups: Sequence[EfficiencyGroup],
            out_dir: str) -> tuple[list[str], str] | None:
  """Average accuracy of the first protocol with data vs training speed at the best-covered length."""
  # The model's steps only: the core modes time the attention core alone, not the model's speed.
  train_groups = [g for g in groups if g.mode == "train"] or [g for g in groups if g.mode not in CORE_MODES]
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
