"""Layout of the report's figures with many attentions, at narrow and wide ranges.

Each figure is rendered with the Agg backend and inspected before it is written: every data axis has
at least two labelled ticks inside its limits, no legend lies over an axes, the bubble labels do not
overlap, the pattern grid's suptitle clears the panel titles, and no warning is emitted.
"""

import warnings

import numpy as np
import pytest

from lra_bench.report import plots, viz

NAMES = ["vanilla", "flash"] + [f"attention_{i:02d}_{'x' * (i % 7)}" for i in range(43)]


@pytest.fixture
def captured(monkeypatch):
  """Figures handed to ``plots.save``, drawn (so tick labels and extents are final) before saving."""
  figures, original = [], plots.save

  def save(fig, *paths):
    fig.canvas.draw()
    figures.append((fig, fig.canvas.get_renderer()))
    return original(fig, *paths)

  monkeypatch.setattr(plots, "save", save)
  return figures


def _overlap(a, b) -> bool:
  return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _labelled_ticks(axis, limits) -> list[str]:
  lo, hi = sorted(limits)
  return [t.get_text() for t, loc in zip(axis.get_majorticklabels(), axis.get_majorticklocs())
          if t.get_visible() and t.get_text().strip() and lo <= loc <= hi]


def _check_axes_and_legends(fig, renderer):
  axes = [ax for ax in fig.axes if ax.get_visible()]
  for ax in axes:
    assert ax.get_legend() is None, "a legend inside an axes covers data"
    assert len(_labelled_ticks(ax.xaxis, ax.get_xlim())) >= 2, ax.get_xticklabels()
    assert len(_labelled_ticks(ax.yaxis, ax.get_ylim())) >= 2, ax.get_yticklabels()
  for legend in fig.legends:
    box = legend.get_window_extent(renderer)
    assert not any(_overlap(box, ax.get_window_extent(renderer)) for ax in axes)


def _series(lengths, span, n=len(NAMES)):
  rng = np.random.default_rng(0)
  lengths = np.asarray(lengths, float)
  out = {}
  for i, name in enumerate(NAMES[:n]):
    slope = 1.0 + i / n
    base = (lengths / lengths[0]) ** slope * (1 + rng.uniform(0, span))
    out[name] = {"length": lengths, "time": 0.01 * base, "time_lo": 0.009 * base, "time_hi": 0.011 * base,
                 "memory": 1e6 * base, "flops": 1e9 * base, "failed_length": [lengths[-1] * 2] if i % 9 == 0
                 else [], "failed_status": ["oom"] if i % 9 == 0 else []}
  return out


PANELS = [("time", "s"), ("memory", "bytes"), ("flops", "FLOPs")]


@pytest.mark.parametrize("lengths, span", [([256, 320], 0.3), ([256, 1024, 4096, 16384, 65536], 1e3)],
                         ids=["narrow", "wide"])
def test_scaling_figure_layout(tmp_path, captured, lengths, span):
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    plots.scaling_figure(_series(lengths, span), PANELS, "t", str(tmp_path / "scaling"))
  (fig, renderer), = captured
  _check_axes_and_legends(fig, renderer)
  legend, = fig.legends
  texts = [t.get_text() for t in legend.get_texts()]
  assert len(texts) == len(NAMES)
  assert all("t " in t and "m " in t and "f " in t for t in texts)  # the fitted slopes stay visible


def test_scaling_figure_one_length(tmp_path, captured):
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    plots.scaling_figure(_series([256], 0.5), PANELS, "t", str(tmp_path / "scaling"))
  _check_axes_and_legends(*captured[0])


@pytest.mark.parametrize("speeds, accuracy", [((10.0, 14.0), (35.0, 36.0)), ((0.1, 1e4), (10.0, 90.0))],
                         ids=["narrow", "wide"])
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
  for lo in (1e-3, 0.7, 3.3, 10.0, 250.0):
    hi = lo * (1.2 if high == 1.0 else high)
    ticks = plots.nice_log_ticks(lo, hi)
    assert 2 <= len(ticks) <= 9 and all(lo <= t <= hi for t in ticks)


def test_pattern_grid_suptitle_clears_panel_titles(tmp_path, captured, monkeypatch):
  rng = np.random.default_rng(2)
  monkeypatch.setattr(viz, "effective_attention", lambda name, length, seed=0: rng.uniform(size=(length, length)))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    paths, errors = viz.plot_attention_grid(NAMES[:9], str(tmp_path / "patterns"), length=16)
  assert paths and not errors
  (fig, renderer), = captured
  title = fig._suptitle.get_window_extent(renderer)
  for ax in fig.axes:
    if ax.get_title():
      assert not _overlap(title, ax.title.get_window_extent(renderer)), ax.get_title()
