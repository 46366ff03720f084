"""Plots of the report (matplotlib, Agg backend): scaling curves with fitted slopes and the LRA Fig. 3
bubble chart. Each figure is written as PNG and SVG; colours are fixed per attention across figures.
"""

from __future__ import annotations

import os
import textwrap
from typing import Mapping, Sequence

import numpy as np


def pyplot():
  """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
  import matplotlib

  matplotlib.use("Agg", force=True)
  matplotlib.rcParams["svg.hashsalt"] = "lra-bench"  # the same figure gives the same SVG (ids included)
  import matplotlib.pyplot as plt

  return plt


def save(fig, *paths: str, tight: bool = True) -> list[str]:
  """Writes ``fig`` to every path (format from the extension), closes it, returns the paths.

  ``tight``: crop to the drawn content (one more drawing pass); False for a figure laid out by hand.
  """
  plt = pyplot()
  for path in paths:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight" if tight else None,
                metadata={"Date": None} if path.endswith(".svg") else None)
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


def nice_log_ticks(lo: float, hi: float, max_ticks: int = 8) -> list[float]:
  """At least 2 readable tick values in [lo, hi] (lo > 0) for a log axis, whatever its span.

  Matplotlib's ``LogLocator`` with ever finer ``subs`` (1·10^k, then 1/2/5·10^k, then 1..9·10^k) gives
  the ticks; a choice is taken once it has 3 ticks spreading over at least half the axis (0.8, 0.9, 1
  on 0.8-1.3 would leave the upper half without a number). A span well under a decade falls back to
  ``MaxNLocator``'s evenly spaced round numbers. Wide spans are thinned to ``max_ticks``.
  """
  import matplotlib.ticker as ticker

  def inside(values) -> list[float]:
    return [float(f"{v:.12g}") for v in values if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9) and v > 0]

  for subs in ((1.0,), (1.0, 2.0, 5.0), tuple(range(1, 10))):
    ticks = inside(ticker.LogLocator(10.0, subs=subs, numticks=1000).tick_values(lo, hi))
    if len(ticks) >= 3 and np.log(ticks[-1] / ticks[0]) >= 0.5 * np.log(hi / lo):
      step = int(np.ceil(len(ticks) / max_ticks))
      return ticks[::step]
  linear = inside(ticker.MaxNLocator(5).tick_values(lo, hi))
  return linear if len(linear) >= 2 else [lo, hi]


def tick_formatter(hi: float):
  """Plain numbers (0.05, 20, 1000); engineering prefixes (500M, 20G) once the axis reaches 10^4."""
  import matplotlib.ticker as ticker

  if hi >= 1e4:
    return ticker.EngFormatter(sep="")
  return ticker.FuncFormatter(lambda v, _: f"{v:g}")


def set_log_axis(ax, axis: str, values, base: float = 10.0, ticks: Sequence[float] | None = None,
                 formatter=None) -> None:
  """Log scale on ``axis`` with limits a little wider than ``values`` and plain labelled ticks.

  Matplotlib's own log ticks label only the decades, so an axis spanning less than one (0.8-1.3 s per
  step) shows no number at all; the ticks come from ``nice_log_ticks`` instead (or ``ticks``), the
  labels from ``tick_formatter`` (or ``formatter``).
  """
  import matplotlib.ticker as ticker

  values = np.asarray(values, float)
  values = values[np.isfinite(values) & (values > 0)]
  which = getattr(ax, f"{axis}axis")
  getattr(ax, f"set_{axis}scale")("log", base=base)
  if values.size == 0:
    return
  lo, hi = float(values.min()), float(values.max())
  pad = max(np.log10(hi / lo) * 0.08, 0.05)
  lo, hi = lo / 10 ** pad, hi * 10 ** pad
  getattr(ax, f"set_{axis}lim")(lo, hi)
  ticks = [t for t in ticks if lo <= t <= hi] if ticks is not None else nice_log_ticks(lo, hi)
  which.set_major_locator(ticker.FixedLocator(ticks))
  which.set_major_formatter(formatter or tick_formatter(hi))
  which.set_minor_formatter(ticker.NullFormatter())


def _slope_text(value: float | None) -> str:
  return "  –  " if value is None else f"{round(value, 2) + 0.0:5.2f}"  # + 0.0: never "-0.00"


def scaling_figure(series: Mapping[str, Mapping[str, Sequence]], panels: Sequence[tuple[str, str]],
                   title: str, out_stem: str, legend_columns: int = 3) -> list[str]:
  """Log-log curves vs sequence length, one line per attention, one panel per metric.

  One legend for the whole figure, below the panels: each entry is an attention with its fitted slopes
  (log y on log length), one per panel, abbreviated by the panel metric's first letter
  (``"performer  t 0.98 · m 1.02 · f 1.00"``).

  Args:
    series: ``{attention: {"length": [...], "<metric>": [...], "<metric>_lo"/"_hi": [...] (optional
      error bar), "failed_length": [...], "failed_status": [...]}}``; NaN = no value at that length.
    panels: ``[(metric, y label), ...]``.
    title: figure title.
    out_stem: path without extension (``.png`` and ``.svg`` are written).
    legend_columns: columns of the shared legend.
  """
  plt = pyplot()
  import matplotlib.lines as mlines
  import matplotlib.ticker as ticker
  import matplotlib.transforms as mtransforms

  palette = colors(list(series))
  names = sorted(series)
  rows = int(np.ceil(len(names) / legend_columns))
  panel_h, legend_h = 3.4, 0.35 + 0.16 * rows
  height = panel_h + 1.0 + legend_h
  fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), height), squeeze=False)
  fig.subplots_adjust(left=0.06, right=0.99, wspace=0.28, top=1 - 0.45 / height,
                      bottom=(legend_h + 0.55) / height)
  slopes = {name: [] for name in names}
  lengths = sorted({float(x) for s in series.values() for x in s["length"]}
                   | {float(x) for s in series.values() for x in s.get("failed_length", ())})
  for ax, (metric, label) in zip(axes[0], panels):
    ys = []
    for i, name in enumerate(names):
      s = series[name]
      x = np.asarray(s["length"], float)
      y = np.asarray(s.get(metric, [np.nan] * len(x)), float)
      keep = np.isfinite(y) & (y > 0)
      slopes[name].append(fit_slope(x[keep], y[keep]) if keep.any() else None)
      if keep.any():
        ys += list(y[keep])
        lo, hi = s.get(f"{metric}_lo"), s.get(f"{metric}_hi")
        yerr = None
        if lo is not None and hi is not None:
          yerr = np.abs(np.vstack([y[keep] - np.asarray(lo, float)[keep],
                                   np.asarray(hi, float)[keep] - y[keep]]))
          ys += [v for v in np.asarray(lo, float)[keep] if v > 0] + list(np.asarray(hi, float)[keep])
        ax.errorbar(x[keep], y[keep], yerr=yerr, color=palette[name], marker=MARKERS[i % len(MARKERS)],
                    markersize=4, linewidth=1.4, capsize=2)
      failed = list(zip(s.get("failed_length", ()), s.get("failed_status", ())))
      if failed:  # at the top edge: x in data coordinates, y in axes coordinates
        trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        ax.scatter([f[0] for f in failed], [0.97] * len(failed), transform=trans, marker="x", s=40,
                   color=palette[name], zorder=5, clip_on=False)
    step = int(np.ceil(len(lengths) / 7)) if lengths else 1
    set_log_axis(ax, "x", lengths, base=2, ticks=lengths[::step],
                 formatter=ticker.FuncFormatter(lambda v, _: f"{v:.0f}"))
    set_log_axis(ax, "y", ys)
    ax.set_xlabel("sequence length")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
  handles, labels = [], []
  width = max((len(n) for n in names), default=0)
  for i, name in enumerate(names):
    handles.append(mlines.Line2D([], [], color=palette[name], marker=MARKERS[i % len(MARKERS)], markersize=4))
    labels.append(f"{name:<{width}} " + " · ".join(f"{metric[0]} {_slope_text(v)}"
                                                  for (metric, _), v in zip(panels, slopes[name])))
  if handles:
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.01), ncol=legend_columns,
               fontsize=7, prop={"family": "monospace", "size": 7}, frameon=False, handlelength=1.5,
               columnspacing=1.5, title="fitted slope of log y on log length: "
               + ", ".join(f"{metric[0]} = {metric}" for metric, _ in panels), title_fontsize=8)
  fig.suptitle(f"Cost per step vs sequence length, {title}  (× at the top: OOM or failed at that length)",
               fontsize=10)
  return save(fig, out_stem + ".png", out_stem + ".svg")


REFERENCE_STYLES = {"vanilla": ("0.35", (0, (6, 2))), "flash": ("0.6", (0, (2, 1.5)))}  # grey, dashed


def family_scaling_figure(series: Mapping[str, Mapping[str, Sequence]], family_of: Mapping[str, str],
                          metric: str, ylabel: str, title: str, out_stem: str, *,
                          families: Sequence[str] | None = None, references: Sequence[str] = ("vanilla", "flash"),
                          columns: int = 2) -> list[str]:
  """One metric vs sequence length as small multiples: one log-log panel per family.

  Every panel has the same axes (so panels compare), the lines of its family's attentions (with their
  ``<metric>_lo``/``_hi`` error bars where given), the ``references`` present in ``series`` as grey dashed
  lines (in every panel but the one they belong to), × at the top edge for an attention's OOM or failed
  lengths, and its own legend to its right, outside the data: each attention with its fitted slope (log
  y on log length).

  Args:
    series: ``{attention: {"length": [...], metric: [...], ...}}`` as for ``scaling_figure``.
    family_of: attention -> family (a missing one is "other").
    metric, ylabel: the series key drawn and its axis label.
    title: what was measured and where (the figure's title).
    out_stem: path without extension (``.png`` and ``.svg`` are written).
    families: the panels' order (default: sorted, "other" last); families without a line are left out.
    columns: panels per row.
  """
  plt = pyplot()
  import matplotlib.lines as mlines
  import matplotlib.ticker as ticker
  import matplotlib.transforms as mtransforms

  names = sorted(series)
  family_of = {name: family_of.get(name) or "other" for name in names}
  present = set(family_of.values())
  order = [f for f in (families or sorted(present, key=lambda f: (f == "other", f))) if f in present]
  order += sorted(present - set(order), key=lambda f: (f == "other", f))
  refs = [r for r in references if r in series]

  def curve(name: str):
    s = series[name]
    x = np.asarray(s["length"], float)
    y = np.asarray(s.get(metric, [np.nan] * len(x)), float)
    keep = np.isfinite(y) & (y > 0)
    bars = None
    if s.get(f"{metric}_lo") is not None and s.get(f"{metric}_hi") is not None:
      lo, hi = np.asarray(s[f"{metric}_lo"], float)[keep], np.asarray(s[f"{metric}_hi"], float)[keep]
      bars = np.abs(np.vstack([y[keep] - lo, hi - y[keep]]))
    return x[keep], y[keep], bars

  curves = {name: curve(name) for name in names}
  slopes = {name: fit_slope(*curves[name][:2]) if len(curves[name][0]) else None for name in names}
  ys = [float(v) for _, y, bars in curves.values()
        for v in (y if bars is None else np.concatenate([y, y - bars[0], y + bars[1]])) if v > 0]
  lengths = sorted({float(v) for s in series.values() for v in s["length"]}
                   | {float(v) for s in series.values() for v in s.get("failed_length", ())})
  members = {f: [n for n in names if family_of[n] == f] for f in order}
  name_w = max((len(n) for n in names), default=4)  # legend entries: the name padded to this, its slope
  # Layout in inches: a panel, its legend to the right, then the gap for the next panel's tick labels.
  font = 6.5
  legend_w = 0.45 + (name_w + 7) * font * 0.62 / 72
  entries = max((len(m) + sum(r not in m for r in refs) for m in members.values()), default=1) + 1
  panel_w, panel_h = 3.3, max(2.5, entries * font * 1.55 / 72)
  gap_w, gap_h, left, top, bottom = 0.6, 0.95, 0.75, 0.95, 0.55
  ncols = max(1, min(columns, len(order)))
  nrows = max(1, int(np.ceil(len(order) / ncols)))
  width = left + ncols * (panel_w + legend_w) + (ncols - 1) * gap_w + 0.1
  height = top + nrows * panel_h + (nrows - 1) * gap_h + bottom
  fig = plt.figure(figsize=(width, height))
  for i, family in enumerate(order):
    row, col = divmod(i, ncols)
    x0 = left + col * (panel_w + legend_w + gap_w)
    y0 = height - top - row * (panel_h + gap_h) - panel_h
    ax = fig.add_axes((x0 / width, y0 / height, panel_w / width, panel_h / height))
    handles, labels = [], []
    own = members[family]
    for j, name in enumerate(own):
      x, y, bars = curves[name]
      color, marker = plt.get_cmap("tab10")(j % 10), MARKERS[j % len(MARKERS)]
      if len(x):
        ax.errorbar(x, y, yerr=bars, color=color, marker=marker, markersize=3.5, linewidth=1.3, capsize=1.5,
                    zorder=3)
      failed = list(series[name].get("failed_length", ()))
      if failed:  # at the top edge: x in data coordinates, y in axes coordinates
        trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        ax.scatter(failed, [0.97] * len(failed), transform=trans, marker="x", s=30, color=color, zorder=5,
                   clip_on=False)
      handles.append(mlines.Line2D([], [], color=color, marker=marker, markersize=3.5))
      labels.append(f"{name:<{name_w}} {_slope_text(slopes[name])}")
    for ref in refs:
      if ref in own:
        continue
      color, dashes = REFERENCE_STYLES.get(ref, ("0.5", (0, (4, 2))))
      x, y, _ = curves[ref]
      if len(x):
        ax.plot(x, y, color=color, linestyle=dashes, linewidth=1.2, zorder=2)
      handles.append(mlines.Line2D([], [], color=color, linestyle=dashes, linewidth=1.2))
      labels.append(f"{ref:<{name_w}} {_slope_text(slopes[ref])}")
    step = int(np.ceil(len(lengths) / 7)) if lengths else 1
    set_log_axis(ax, "x", lengths, base=2, ticks=lengths[::step],
                 formatter=ticker.FuncFormatter(lambda v, _: f"{v:.0f}"))
    set_log_axis(ax, "y", ys)
    ax.set_xlabel("sequence length", fontsize=8)
    if col == 0:  # the panels share their axes: one label per row
      ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    ax.set_title(f"{family} ({len(own)})", fontsize=9)
    anchor = ((x0 + panel_w + 0.08) / width, (y0 + panel_h) / height)
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=anchor,
               prop={"family": "monospace", "size": font}, frameon=False, handlelength=2.2, borderaxespad=0.0,
               borderpad=0.0, title="slope", title_fontsize=font, alignment="left")
  fig.suptitle(f"{title}\nlog-log, one panel per family; grey dashed: {' and '.join(refs) or 'no reference'} "
               "(references, in every other panel); legend: fitted slope of log y on log length; "
               "× at the top: OOM or failed", fontsize=9, y=1 - 0.12 / height, va="top")
  return save(fig, out_stem + ".png", out_stem + ".svg")


def pareto_front(points: Sequence[dict]) -> set[str]:
  """Names of the points no other point beats on both speed and accuracy."""
  return {p["name"] for p in points
          if not any(q["speed"] >= p["speed"] and q["accuracy"] >= p["accuracy"]
                     and (q["speed"], q["accuracy"]) != (p["speed"], p["accuracy"]) for q in points)}


def _segment_hits_box(a, b, box) -> bool:
  """Whether the segment a-b meets the open box (x0, y0, x1, y1) (Liang-Barsky clipping)."""
  (ax, ay), (bx, by) = a, b
  dx, dy = bx - ax, by - ay
  lo, hi = 0.0, 1.0
  for p, q in ((-dx, ax - box[0]), (dx, box[2] - ax), (-dy, ay - box[1]), (dy, box[3] - ay)):
    if p == 0:
      if q <= 0:
        return False
    else:
      t = q / p
      if p < 0:
        lo = max(lo, t)
      else:
        hi = min(hi, t)
  return lo < hi


def _boxes_overlap(a, b) -> bool:
  """Whether the open boxes a and b (x0, y0, x1, y1) overlap."""
  return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _segments_cross(a, b, c, d) -> bool:
  """Whether the segments a-b and c-d cross at a point inside both (touching ends do not count)."""
  def side(p, q, r):
    return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
  return side(a, b, c) * side(a, b, d) < 0 and side(c, d, a) * side(c, d, b) < 0


def place_labels(anchors: np.ndarray, sizes: np.ndarray, obstacles: Sequence[tuple] = (),
                 bounds: tuple | None = None) -> np.ndarray:
  """Deterministic label placement in display units (points/pixels): centre per label, no overlaps.

  ``anchors`` [N, 2] are the points, ``sizes`` [N, 2] the label boxes (width, height), ``obstacles``
  extra boxes (x0, y0, x1, y1) to avoid (the points' markers), ``bounds`` a box (x0, y0, x1, y1) every
  label must lie inside (e.g. the axes). Each label in turn takes, among the candidate centres on rings of
  growing radius around its anchor whose box overlaps no label placed before nor an obstacle and lies
  inside ``bounds``, the cheapest: its distance plus a price for each clash of its leader line (centre to
  anchor) with what was placed before: 40 for a line through a label (its own through another's box, or
  another's leader through its box), 8 for a line over another point's marker or across another leader.
  """
  anchors = np.asarray(anchors, dtype=float).reshape(-1, 2)
  sizes = np.asarray(sizes, dtype=float).reshape(-1, 2)
  # The labels are placed one by one, so the order decides the layout: of four orders (as given, by x
  # either way, by falling y), the layout of the lowest total price is kept.
  orders = [np.arange(len(anchors)), np.lexsort((anchors[:, 1], anchors[:, 0])),
            np.lexsort((anchors[:, 0], -anchors[:, 1]))]
  orders.append(orders[1][::-1])
  best_layout = None
  for order in orders:
    centres, score = _place_in_order(anchors, sizes, obstacles, bounds, order)
    if best_layout is None or score < best_layout[0]:
      best_layout = (score, centres)
  return best_layout[1]


def _place_in_order(anchors, sizes, obstacles, bounds, order) -> tuple[np.ndarray, float]:
  """``place_labels`` for one order of the labels: the centres (in the labels' own order), the total price."""
  placed = [tuple(o) for o in obstacles]
  labels, leaders = [], []  # boxes and leader segments of the labels placed so far
  centres = np.zeros_like(anchors, dtype=float)
  total = 0
  angles = np.deg2rad([90, 270, 0, 180, 45, 135, 315, 225, 22.5, 157.5, 202.5, 337.5, 67.5, 112.5, 247.5, 292.5])

  def clashes(anchor, centre, box, markers) -> int:
    """The price of a candidate's clashes, in display units of leader length (``place_labels``)."""
    return (40 * sum(_segment_hits_box(a, c, box) for a, c in leaders)
            + 40 * sum(_segment_hits_box(anchor, centre, b) for b in labels)
            + sum(_segment_hits_box(anchor, centre, o) for o in markers) * 8
            + sum(_segments_cross(anchor, centre, a, c) for a, c in leaders) * 8)

  for i in order:
    (x, y), (w, h) = anchors[i], sizes[i]
    own = (x - 4, y - 4, x + 4, y + 4)
    markers = [o for o in obstacles if not _boxes_overlap(o, own)]  # the other points' markers
    best, best_cost = None, None
    for radius in np.arange(0.0, 400.0, 6.0):
      if best_cost is not None and best_cost <= radius:
        break  # every candidate from here on costs at least its radius
      for angle in (angles if radius else [0.0]):
        # the box's near edge (not its centre) is ``radius`` away: a label beside its point is as close
        # as one above it
        edge = (w / 2, h / 2) if radius else (0.0, 0.0)
        cx, cy = x + (radius + edge[0]) * np.cos(angle), y + (radius + edge[1]) * np.sin(angle)
        box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
        if bounds is not None and not (bounds[0] <= box[0] and box[2] <= bounds[2]
                                       and bounds[1] <= box[1] and box[3] <= bounds[3]):
          continue
        if any(_boxes_overlap(box, b) for b in placed):
          continue
        cost = radius + clashes((x, y), (cx, cy), box, markers)
        if best_cost is None or cost < best_cost:
          best, best_cost = (cx, cy, box), cost
    best = best or (x, y, (x - w / 2, y - h / 2, x + w / 2, y + h / 2))
    total += best_cost or 0.0
    centres[i] = best[:2]
    placed.append(best[2])
    labels.append(best[2])
    leaders.append(((x, y), best[:2]))
  return centres, total


def _near_groups(points: np.ndarray, merge: float) -> list[list[int]]:
  """Indices of ``points`` [N, 2] grouped by single linkage at distance < ``merge``, in first-index order."""
  parent = list(range(len(points)))

  def root(i):
    while parent[i] != i:
      i = parent[i]
    return i

  for i in range(len(points)):
    for j in range(i):
      if np.hypot(*(points[i] - points[j])) < merge:
        parent[root(i)] = root(j)
  groups: dict[int, list[int]] = {}
  for i in range(len(points)):
    groups.setdefault(root(i), []).append(i)
  return sorted(groups.values(), key=min)


def label_points(ax, x: Sequence[float], y: Sequence[float], names: Sequence[str], *, fontsize: float = 7.0,
                 bold: set[str] = frozenset(), inside: bool = False, merge: float = 0.0) -> list:
  """Label every point (x[i], y[i]) of ``ax`` with ``names[i]``, no two labels overlapping and none on a
  point: :func:`place_labels` in display units, with a thin leader line back to a point whose label had
  to move away from it. ``inside``: labels stay inside the axes (for panels side by side). ``merge``:
  points closer than this (display units) share one label, their names comma-separated, its leader to
  their mean. Call after the axes' limits and scales are final (positions are computed in display units).
  Returns the labels.
  """
  fig = ax.figure
  points = ax.transData.transform(np.column_stack([x, y])) if len(names) else np.zeros((0, 2))
  dots = [(px - 3, py - 3, px + 3, py + 3) for px, py in points]
  # Points closer than ``merge`` display units are one spot to a reader: one label lists their names (left
  # to right, comma-separated, wrapped), its anchor their mean.
  groups = _near_groups(points, merge)
  anchors = np.asarray([points[g].mean(axis=0) for g in groups]).reshape(-1, 2)
  to_data = ax.transData.inverted()
  labels = []
  for group, anchor in zip(groups, anchors):
    members = [names[i] for i in sorted(group, key=lambda i: (points[i][0], names[i]))]
    text = textwrap.fill(", ".join(members), width=max(24, max(map(len, members)) + 1), break_on_hyphens=False)
    weight = "bold" if any(names[i] in bold for i in group) else "normal"
    labels.append(ax.annotate(text, tuple(to_data.transform(anchor)), textcoords="data", fontsize=fontsize,
                              ha="center", va="center", zorder=4, fontweight=weight, linespacing=1.0))
  renderer = fig.canvas.get_renderer()
  sizes = np.asarray([[b.width + 3.0, b.height + 2.0] for b in
                      (label.get_window_extent(renderer) for label in labels)]).reshape(-1, 2)
  frame = ax.get_window_extent(renderer)
  bounds = (frame.x0 + 1, frame.y0 + 1, frame.x1 - 1, frame.y1 - 1) if inside else None
  centres = place_labels(anchors, sizes, dots, bounds=bounds)
  for label, anchor, centre in zip(labels, anchors, centres):
    label.xyann = tuple(to_data.transform(centre))
    if np.hypot(*(centre - anchor)) > 1.0:  # a leader line back to the point
      ax.annotate("", (label.xy), xytext=label.xyann, textcoords="data", zorder=3,
                  arrowprops=dict(arrowstyle="-", color="0.4", lw=0.5, shrinkA=3, shrinkB=0))
  return labels


def bubble_figure(points: Sequence[dict], title: str, xlabel: str, out_stem: str) -> list[str]:
  """LRA Fig. 3: average accuracy (y) vs speed (x), bubble area proportional to memory.

  Every bubble is labelled; labels are moved away from each other deterministically (``place_labels``)
  with a leader line back to their bubble. The Pareto front (fastest for its accuracy) is labelled in
  bold. ``points``: ``[{"name", "speed", "accuracy", "memory_bytes"}, ...]``.
  """
  plt = pyplot()
  palette = colors([p["name"] for p in points])
  points = sorted(points, key=lambda p: p["name"])
  fig, ax = plt.subplots(figsize=(9.0, 6.4))
  fig.subplots_adjust(left=0.08, right=0.98, bottom=0.09, top=0.94)
  memories = np.asarray([p["memory_bytes"] or 0.0 for p in points], float)
  scale = 1200.0 / memories.max() if memories.max() > 0 else 0.0
  speeds = np.asarray([p["speed"] for p in points], float)
  accuracy = np.asarray([p["accuracy"] for p in points], float)
  areas = np.maximum(memories * scale, 20.0)
  ax.scatter(speeds, accuracy, s=areas, c=[palette[p["name"]] for p in points], alpha=0.5,
             edgecolors="black", linewidths=0.6, zorder=2)
  set_log_axis(ax, "x", speeds)
  span = float(np.ptp(accuracy)) if len(accuracy) else 0.0
  pad = max(span * 0.12, 0.5)
  ax.set_ylim(float(accuracy.min()) - pad, float(accuracy.max()) + pad)
  ax.set_xlabel(xlabel)
  ax.set_ylabel("average accuracy (%)")
  ax.grid(True, which="both", alpha=0.3)
  ax.set_title(title, fontsize=9)
  front = pareto_front(points) | {"vanilla", "flash"}
  label_points(ax, speeds, accuracy, [p["name"] for p in points], fontsize=6.5, bold=front)
  return save(fig, out_stem + ".png", out_stem + ".svg")
