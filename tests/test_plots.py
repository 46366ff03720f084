"""Every figure the report makes, rendered at a narrow (under a decade) and a wide (several decades) range.

Each figure is drawn with the Agg backend before it is written and inspected: every visible axes
(colorbars included) has numbers on both axes (major tick labels inside the limits, or minor ones where
there are no major ones), no legend lies over an axes, the bubble labels do not overlap, the pattern
grid's suptitle clears the panel titles, the titles say what was measured, and no warning is emitted.
"""

import warnings

import numpy as np
import pytest

from lra_bench.report import plots, viz

NAMES = ["vanilla", "flash"] + [f"attention_{i:02d}_{'x' * (i % 7)}" for i in range(43)]
NARROW, WIDE = (0.8, 1.3), (1e-3, 1e3)


@pytest.fixture
def captured(monkeypatch):
  """Figures handed to ``plots.save``, drawn (so tick labels and extents are final) before saving."""
  figures, original = [], plots.save

  def save(fig, *paths, **kwargs):
    fig.canvas.draw()
    figures.append((fig, fig.canvas.get_renderer()))
    return original(fig, *paths, **kwargs)

  monkeypatch.setattr(plots, "save", save)
  return figures


def _overlap(a, b) -> bool:
  return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _labels(axis, which: str) -> list[str]:
  """The visible, non-empty tick labels of ``axis`` (major or minor) whose ticks lie inside its limits."""
  lo, hi = sorted(axis.get_view_interval())
  texts = axis.get_majorticklabels() if which == "major" else axis.get_minorticklabels()
  locs = axis.get_majorticklocs() if which == "major" else axis.get_minorticklocs()
  span = (hi - lo) * 1e-9
  return [t.get_text() for t, loc in zip(texts, locs)
          if t.get_visible() and t.get_text().strip() and lo - span <= loc <= hi + span]


def _numbered(axis) -> list[str]:
  """The labels a reader gets on ``axis``: the major ones, or the minor ones when no major one shows."""
  return _labels(axis, "major") or _labels(axis, "minor")


def _check_axes_and_legends(fig, renderer, min_labels: int = 2):
  axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
  assert axes
  for ax in axes:
    assert ax.get_legend() is None, "a legend inside an axes covers data"
    is_colorbar = hasattr(ax, "_colorbar")
    for axis in ((ax.yaxis,) if is_colorbar and ax.get_xlim() == (0.0, 1.0) else (ax.xaxis, ax.yaxis)):
      labels = _numbered(axis)
      assert len(labels) >= min_labels, (ax.get_title(), axis.axis_name, ax.get_xlim(), ax.get_ylim(), labels)
      assert all(any(ch.isdigit() for ch in text) for text in labels), labels
  for legend in fig.legends:
    box = legend.get_window_extent(renderer)
    assert not any(_overlap(box, ax.get_window_extent(renderer)) for ax in axes)


def _series(lengths, values, n=len(NAMES)):
  """Curves from ``values[0]`` to ``values[1]`` over ``lengths`` (time, memory and FLOPs scaled by 1, 1e6, 1e9)."""
  lengths = np.asarray(lengths, float)
  ramp = (np.log(lengths) - np.log(lengths[0])) / max(np.log(lengths[-1] / lengths[0]), 1e-9)
  lo, hi = values
  out = {}
  for i, name in enumerate(NAMES[:n]):
    start = lo * (hi / lo) ** (0.3 * i / n)
    base = start * (hi / start) ** ramp
    out[name] = {"length": lengths, "time": base, "time_lo": 0.97 * base, "time_hi": 1.03 * base,
                 "memory": 1e6 * base, "flops": 1e9 * base, "failed_length": [lengths[-1] * 2] if i % 9 == 0
                 else [], "failed_status": ["oom"] if i % 9 == 0 else []}
  return out


PANELS = [("time", "seconds per step"), ("memory", "bytes"), ("flops", "FLOPs")]


@pytest.mark.parametrize("lengths, values", [([256, 320], NARROW), ([256, 1024, 4096, 16384, 65536], WIDE),
                                             ([256, 1024], NARROW), ([1000, 1200], WIDE)],
                         ids=["narrow", "wide", "narrow-y", "narrow-x"])
def test_scaling_figure_layout(tmp_path, captured, lengths, values):
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    plots.scaling_figure(_series(lengths, values), PANELS, "train, batch 1, cpu", str(tmp_path / "scaling"))
  (fig, renderer), = captured
  _check_axes_and_legends(fig, renderer)
  assert [ax.get_ylabel() for ax in fig.axes] == [label for _, label in PANELS]
  assert "per step vs sequence length" in fig._suptitle.get_text()
  legend, = fig.legends
  texts = [t.get_text() for t in legend.get_texts()]
  assert len(texts) == len(NAMES)
  assert all("t " in t and "m " in t and "f " in t for t in texts)  # the fitted slopes stay visible


def test_scaling_figure_one_length(tmp_path, captured):
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    plots.scaling_figure(_series([256], NARROW), PANELS, "t", str(tmp_path / "scaling"))
  _check_axes_and_legends(*captured[0])


def test_scaling_figure_one_value(tmp_path, captured):
  """Every attention at the same time, memory and FLOPs: a zero-width range still gets numbers."""
  series = {name: {"length": [256, 512], "time": [0.5, 0.5], "memory": [1e6, 1e6], "flops": [1e9, 1e9]}
            for name in NAMES[:3]}
  plots.scaling_figure(series, PANELS, "t", str(tmp_path / "scaling"))
  _check_axes_and_legends(*captured[0])


@pytest.mark.parametrize("speeds, accuracy", [(NARROW, (35.0, 36.0)), (WIDE, (10.0, 90.0)),
                                               ((10.0, 14.0), (35.0, 35.1))],
                         ids=["narrow", "wide", "narrow-both"])
def test_bubble_figure_layout(tmp_path, captured, speeds, accuracy):
  rng = np.random.default_rng(1)
  points = [{"name": name, "speed": float(np.exp(rng.uniform(*np.log(speeds)))),
             "accuracy": float(rng.uniform(*accuracy)), "memory_bytes": float(rng.uniform(1e6, 1e8))}
            for name in NAMES]
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    plots.bubble_figure(points, "title", "examples/s", str(tmp_path / "bubble"))
  (fig, renderer), = captured
  _check_axes_and_legends(fig, renderer)
  labels = [t for t in fig.axes[0].texts if t.get_text() in NAMES]
  assert len(labels) == len(NAMES)
  boxes = [t.get_window_extent(renderer) for t in labels]
  clashes = [(labels[i].get_text(), labels[j].get_text()) for i in range(len(boxes))
             for j in range(i) if _overlap(boxes[i], boxes[j])]
  assert not clashes


@pytest.mark.parametrize("low, high", [(0.1, 1.0), (0.0, 1e6)])
def test_nice_log_ticks_gives_several_ticks(low, high):
  for lo in (1e-3, 0.7, 0.8, 3.3, 10.0, 250.0):
    hi = lo * (1.2 if high == 1.0 else high)
    ticks = plots.nice_log_ticks(lo, hi)
    assert 2 <= len(ticks) <= 9 and all(lo <= t <= hi for t in ticks)


def _matrices(values, signed: bool):
  """A random [L, L] matrix per call with entries in ``values`` (half of them negated if ``signed``)."""
  rng = np.random.default_rng(2)

  def make(name, length, seed=0):
    m = np.exp(rng.uniform(*np.log(values), size=(length, length)))
    return m * np.where(rng.uniform(size=m.shape) < 0.5, -1.0, 1.0) if signed else m

  return make


@pytest.mark.parametrize("values", [NARROW, WIDE], ids=["narrow", "wide"])
@pytest.mark.parametrize("signed", [False, True], ids=["weights", "signed"])
def test_attention_heatmap_layout(tmp_path, captured, monkeypatch, values, signed):
  monkeypatch.setattr(viz, "effective_attention", _matrices(values, signed))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    viz.plot_attention("vanilla", str(tmp_path / "vanilla.png"), length=16)
  (fig, renderer), = captured
  _check_axes_and_legends(fig, renderer)
  assert "attention" in fig.axes[0].get_title()


@pytest.mark.parametrize("values", [NARROW, WIDE], ids=["narrow", "wide"])
def test_pattern_grid_layout(tmp_path, captured, monkeypatch, values):
  monkeypatch.setattr(viz, "effective_attention", _matrices(values, False))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    paths, errors = viz.plot_attention_grid(NAMES[:9], str(tmp_path / "patterns"), length=16)
  assert paths and not errors
  (fig, renderer), = captured
  _check_axes_and_legends(fig, renderer)
  title = fig._suptitle.get_window_extent(renderer)
  for ax in fig.axes:
    if ax.get_title():
      assert not _overlap(title, ax.title.get_window_extent(renderer)), ax.get_title()


FAMILIES = ["exact", "sparse", "low-rank", "kernel", "learned-pattern", "combiner", "mixing", "other"]


def _family_of(names):
  """vanilla and flash are "exact"; the rest cycle through the other families (sparse gets the most)."""
  rest = FAMILIES[1:]
  return {name: "exact" if name in ("vanilla", "flash") else rest[i % len(rest)] if i % 3 else "sparse"
          for i, name in enumerate(names)}


@pytest.mark.parametrize("lengths, values", [([256, 320], NARROW), ([256, 512, 1024, 2048, 4096], WIDE)],
                         ids=["narrow", "wide"])
@pytest.mark.parametrize("metric", ["time", "memory"])
def test_family_scaling_figure_layout(tmp_path, captured, lengths, values, metric):
  """One panel per family present, every panel with numbered log axes, its own legend outside every axes
  (each attention with its slope), vanilla and flash as grey dashed lines in every other panel."""
  from matplotlib.colors import to_rgb

  series = _series(lengths, values)
  family_of = _family_of(series)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    plots.family_scaling_figure(series, family_of, metric, "seconds", "attention core fwd+bwd, batch 1, cpu",
                                str(tmp_path / "scaling"), families=FAMILIES)
  (fig, renderer), = captured
  _check_axes_and_legends(fig, renderer)
  present = [f for f in FAMILIES if f in family_of.values()]
  assert [ax.get_title().split(" (")[0] for ax in fig.axes] == present
  assert len(fig.legends) == len(present)
  assert "attention core fwd+bwd, batch 1, cpu" in fig._suptitle.get_text()
  for ax, legend, family in zip(fig.axes, fig.legends, present):
    members = sorted(n for n in series if family_of[n] == family)
    texts = [t.get_text() for t in legend.get_texts()]
    references = [] if family == "exact" else ["vanilla", "flash"]
    assert [t.split()[0] for t in texts] == members + references
    assert all(any(ch.isdigit() for ch in t.split()[-1]) for t in texts)  # each with its fitted slope
    dashed = [line for line in ax.get_lines() if line.get_linestyle() not in ("-", "None", "none", "")]
    assert len(dashed) == len(references)
    assert all(len(set(to_rgb(line.get_color()))) == 1 for line in dashed)  # grey


def test_family_scaling_figure_one_family_without_references(tmp_path, captured):
  """A plugin's core alone ("other"): one panel, no reference lines, still numbered axes."""
  series = _series([256, 512], NARROW, n=3)
  series = {f"plugin_{i}": s for i, s in enumerate(series.values())}
  plots.family_scaling_figure(series, {}, "time", "seconds", "t", str(tmp_path / "scaling"))
  (fig, renderer), = captured
  _check_axes_and_legends(fig, renderer)
  assert [ax.get_title() for ax in fig.axes] == ["other (3)"]


def test_state_size_figure_labels_clear_each_other_points_and_panel(tmp_path, captured):
  """The recall trade-off figure (accuracy vs state size): points that share a state size and nearly an
  accuracy (as linear_transformer / rfa / performer at L = 64, and vanilla / longformer at the same
  state), the MLP-less table's L = 128 panel's cluster of five layers at 100 % within 4 160-5 184 scalars, long
  names near the panel's edges: every point's name is in a label (points a reader cannot tell apart share
  one, names comma-separated), no two labels overlap, no label covers a point, no leader line runs through
  another label, and every label stays inside its own panel."""
  import pandas as pd

  from lra_bench.report import recall

  rows = []
  for seq_len, shift in ((64, 0.0), (128, -15.0)):
    for name, state, accuracy in (
        ("vanilla", 8192, 98.0), ("longformer", 8192, 96.9), ("mega", 14000, 100.0),
        ("sparse_fixed", 2500, 44.0), ("memory_compressed", 2700, 28.7), ("local", 6200, 35.6),
        ("cosformer", 8400, 26.3), ("s4d", 8300, 25.8), ("linear_transformer", 16640, 26.5),
        ("rfa", 16900, 25.0), ("performer", 16900, 24.0), ("luna", 34000, 24.9)):
      rows.append({"task": "mqar", "seq_len": seq_len, "attention": name, "state_size": state,
                   "accuracy": max(accuracy + shift, 0.0), "d_model": 64, "rising": name == "local"})
  # reports/cpu_recall/mlp_less_block, L = 128: the modern layers that recall (mamba: its seed-1 cell, mamba_seed/)
  for name, state, accuracy in (
      ("deltanet", 1600, 99.95), ("rwkv6", 4160, 99.99), ("rwkv7", 4160, 100.0), ("mlstm", 4612, 99.99),
      ("kda", 4672, 99.98), ("gated_deltanet", 5184, 100.0), ("mamba2", 8960, 100.0), ("mamba", 2432, 95.0)):
    rows.append({"task": "mqar", "seq_len": 128, "attention": name, "state_size": state, "accuracy": accuracy,
                 "d_model": 64, "rising": False})
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    recall.state_size_figure(pd.DataFrame(rows), "Recall vs causal state", str(tmp_path / "state"))
  (fig, renderer), = captured
  _check_axes_and_legends(fig, renderer)
  for ax, seq_len in zip(fig.axes, (64, 128)):
    labels = [t for t in ax.texts if t.get_text()]
    named = [name for t in labels for name in t.get_text().replace("\n", " ").split(", ")]
    assert sorted(" ".join(named).split()) == sorted(r["attention"] for r in rows if r["seq_len"] == seq_len)
    boxes = [t.get_window_extent(renderer) for t in labels]
    # a leader runs from its label to the label's anchor (the mean of its points): through no other label
    for text, box in zip(labels, boxes):
      start = np.asarray([(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2])
      end = ax.transData.transform(text.xy)
      through = [other.get_text() for other, b in zip(labels, boxes) if other is not text
                 and plots._segment_hits_box(start, end, (b.x0, b.y0, b.x1, b.y1))]
      assert not through, (text.get_text(), through)
    clashes = [(labels[i].get_text(), labels[j].get_text()) for i in range(len(boxes))
               for j in range(i) if _overlap(boxes[i], boxes[j])]
    assert not clashes
    frame = ax.get_window_extent(renderer)
    outside = [t.get_text() for t, b in zip(labels, boxes)
               if not (frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1)]
    assert not outside
    points = ax.transData.transform(ax.collections[0].get_offsets())
    covered = [t.get_text() for t, b in zip(labels, boxes)
               if any(b.x0 - 2 < px < b.x1 + 2 and b.y0 - 2 < py < b.y1 + 2 for px, py in points)]
    assert not covered
    # the one run still rising at its end is drawn open (white inside), the others filled
    filled, open_ = (np.asarray(c.get_facecolors()) for c in ax.collections[:2])
    assert len(open_) == 1 and np.allclose(open_[0], 1.0) and not np.allclose(filled, 1.0)
  assert any(t.get_text().startswith("open marker: still rising") for t in fig.texts)
