"""Learning curves: validation accuracy against the training step, from the ``val_curve`` of the records
(``lra_bench.training.loop.validation_curve``: every evaluation of the run, resumes included). One figure per
protocol, one panel per task, one line per run; a run evaluated fewer than twice has no curve to draw.
"""

from __future__ import annotations

import os
from typing import Sequence

from lra_bench.experiments import results

MIN_POINTS = 2


def curves(records: Sequence[dict], protocol: str) -> dict[str, list[tuple[str, int, list]]]:
  """task -> [(attention, seed, [[step, accuracy], ...]), ...] of the finished from-scratch runs of
  ``protocol`` with at least ``MIN_POINTS`` evaluations (the newest record per run)."""
  out: dict[str, list[tuple[str, int, list]]] = {}
  latest = {}
  for r in records:
    if (r.get("kind", "train") != "train" or r.get("status") != "ok" or r.get("protocol") != protocol
        or results.pretrain_objective(r) != "none"):
      continue
    curve = r.get("val_curve") or []
    if len(curve) < MIN_POINTS:
      continue
    latest[(r["task"], r["attention"], r.get("seed", 0), r.get("config_hash"))] = curve
  for (task, attention, seed, _), curve in sorted(latest.items(), key=lambda kv: (kv[0][0], kv[0][1] != "vanilla",
                                                                                  kv[0][1], kv[0][2])):
    out.setdefault(task, []).append((attention, int(seed), curve))
  return out


def learning_curves_figure(records: Sequence[dict], protocol: str, out_stem: str) -> list[str]:
  """The protocol's figure (PNG and SVG at ``out_stem``); [] when no run has a curve."""
  from lra_bench.report import plots

  by_task = curves(records, protocol)
  if not by_task:
    return []
  plt = plots.pyplot()
  tasks = sorted(by_task)
  fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 3.8), squeeze=False)
  names = sorted({a for runs in by_task.values() for a, _, _ in runs})
  colors = plots.colors(names)
  for ax, task in zip(axes[0], tasks):
    for attention, seed, curve in by_task[task]:
      steps = [p[0] for p in curve]
      accuracy = [100.0 * p[1] for p in curve]
      label = attention if seed == 0 else f"{attention} (seed {seed})"
      ax.plot(steps, accuracy, color=colors[attention], lw=1.4 if attention == "vanilla" else 1.0,
              marker="o" if len(curve) <= 12 else None, ms=3, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(task, fontsize=10)
    ax.grid(alpha=0.3)
    # below its own panel: a legend right of a panel fell on the next panel's tick labels
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), borderaxespad=0.0, frameon=False,
              ncol=2)
  fig.suptitle(f"Validation accuracy vs training step — protocol {protocol}", fontsize=11)
  return plots.save(fig, out_stem + ".png", out_stem + ".svg")


def section(records: Sequence[dict], protocols: Sequence[str], out_dir: str) -> tuple[list[str], list[str]]:
  """(written paths, markdown lines) of the learning-curves section over ``protocols``."""
  written, lines = [], []
  for protocol in protocols:
    stem = os.path.join(out_dir, f"learning_curves_{protocol}")
    paths = learning_curves_figure(records, protocol, stem)
    if paths:
      written += paths
      lines += [f"![learning curves, protocol {protocol}](learning_curves_{protocol}.png)", ""]
  if lines:
    lines = ["## Learning curves", "", "Validation accuracy at every evaluation of each finished run (resumed "
             "runs included), from the records' `val_curve`.", ""] + lines
  return written, lines
