"""Plots of the report (matplotlib, Agg backend): scaling curves with fitted slopes and the LRA Fig. 3
bubble chart. Each figure is written as PNG and SVG; colours are fixed per attention across figures.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np


def pyplot():
  """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
  import matplotlib

  matplotlib.use("Agg", force=True)
  matplotlib.rcParams["svg.hashsalt"] = "lra-bench"  # the same figure gives the same SVG (ids included)
  import matplotlib.pyplot as plt

  return plt


def save(fig, *paths: str) -> list[str]:
  """Writes ``fig`` to every path (format from the extension), closes it, returns the paths."""
  plt = pyplot()
  for path in paths:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight", metadata={"Date": None} if path.endswith(".svg") else None)
  plt.close(fig)
  return list(paths)


def fit_slope(x: Sequence[float], y: Sequence[float]) -> float | None:
  """Exponent k of y ~ c * x^k: least-squares slope of log y on log x (None with < 2 usable points)."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
  if np.unique(x[keep]).size < 2:
    return None
  slope, _ = np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)
  return float(slope)


def colors(names: Sequence[str]) -> dict[str, tuple]:
  """A stable colour per attention (sorted names over tab20; vanilla always black)."""
  plt = pyplot()
  cmap = plt.get_cmap("tab20")
  others = [n for n in sorted(names) if n != "vanilla"]
  out = {n: cmap(i % 20) for i, n in enumerate(others)}
  out["vanilla"] = (0.0, 0.0, 0.0, 1.0)
  return out


MARKERS = "osD^v<>pPh*X"


def plain_log_ticks(ax, axis: str = "both") -> None:
  """Tick labels like 0.5, 2, 1e+10 instead of 5x10^-1 on log axes."""
  import matplotlib.ticker as ticker

  fmt = ticker.FuncFormatter(lambda v, _: f"{v:g}")
  for name in ("x", "y") if axis == "both" else (axis,):
    which = getattr(ax, f"{name}axis")
    which.set_major_formatter(fmt)
    which.set_minor_formatter(ticker.NullFormatter())


def scaling_figure(series: Mapping[str, Mapping[str, Sequence]], panels: Sequence[tuple[str, str]],
                   title: str, out_stem: str) -> list[str]:
  """Log-log curves vs sequence length, one line per attention, one panel per metric.

  Args:
    series: ``{attention: {"length": [...], "<metric>": [...], "<metric>_lo"/"_hi": [...] (optional
      error bar), "failed_length": [...], "failed_status": [...]}}``; NaN = no value at that length.
    panels: ``[(metric, y label), ...]``.
    title: figure title.
    out_stem: path without extension (``.png`` and ``.svg`` are written).
  """
  plt = pyplot()
  import matplotlib.transforms as mtransforms

  palette = colors(list(series))
  fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.2), squeeze=False)
  for ax, (metric, label) in zip(axes[0], panels):
    drawn = False
    for i, (name, s) in enumerate(sorted(series.items())):
      x = np.asarray(s["length"], float)
      y = np.asarray(s.get(metric, [np.nan] * len(x)), float)
      keep = np.isfinite(y) & (y > 0)
      if keep.any():
        slope = fit_slope(x[keep], y[keep])
        legend = f"{name} (slope {slope:.2f})" if slope is not None else name
        lo, hi = s.get(f"{metric}_lo"), s.get(f"{metric}_hi")
        yerr = None
        if lo is not None and hi is not None:
          yerr = np.abs(np.vstack([y[keep] - np.asarray(lo, float)[keep],
                                   np.asarray(hi, float)[keep] - y[keep]]))
        ax.errorbar(x[keep], y[keep], yerr=yerr, color=palette[name], marker=MARKERS[i % len(MARKERS)],
                    markersize=4, linewidth=1.4, capsize=2, label=legend)
        drawn = True
      failed = [(length, status) for length, status in zip(s.get("failed_length", ()),
                                                          s.get("failed_status", ()))]
      if failed:  # at the top edge: x in data coordinates, y in axes coordinates
        trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        ax.scatter([f[0] for f in failed], [0.97] * len(failed), transform=trans, marker="x", s=40,
                   color=palette[name], zorder=5, clip_on=False)
    ax.set_xscale("log", base=2)
    if drawn:
      ax.set_yscale("log")
      plain_log_ticks(ax, "y")
    ax.set_xlabel("sequence length")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
      ax.legend(fontsize=7, loc="lower right")
  fig.suptitle(title + "  (× at the top: OOM or failed at that length)", fontsize=10)
  fig.tight_layout()
  return save(fig, out_stem + ".png", out_stem + ".svg")


def bubble_figure(points: Sequence[dict], title: str, xlabel: str, out_stem: str) -> list[str]:
  """LRA Fig. 3: average accuracy (y) vs speed (x), bubble area proportional to memory.

  ``points``: ``[{"name", "speed", "accuracy", "memory_bytes"}, ...]``.
  """
  plt = pyplot()
  palette = colors([p["name"] for p in points])
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  memories = np.asarray([p["memory_bytes"] or 0.0 for p in points], float)
  scale = 1500.0 / memories.max() if memories.max() > 0 else 0.0
  for p, memory in zip(points, memories):
    ax.scatter(p["speed"], p["accuracy"], s=max(memory * scale, 20.0), color=palette[p["name"]],
               alpha=0.55, edgecolors="black", linewidths=0.6)
    ax.annotate(p["name"], (p["speed"], p["accuracy"]), fontsize=7, ha="center", va="center")
  ax.set_xscale("log")
  ax.xaxis.set_minor_formatter(__import__("matplotlib.ticker").ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  plain_log_ticks(ax, "x")
  ax.set_xlabel(xlabel)
  ax.set_ylabel("average accuracy (%)")
  ax.grid(True, which="both", alpha=0.3)
  ax.set_title(title, fontsize=10)
  ax.margins(0.15)
  fig.tight_layout()
  return save(fig, out_stem + ".png", out_stem + ".svg")
