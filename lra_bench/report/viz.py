"""Heatmaps of the registered cores' effective attention matrices: this module only draws.

The matrices come from the conformance kit's probe (``lra_bench.testing.effective_attention``;
docs/ARCHITECTURE.md, "The effective matrix"): with one head and ``value = eye(L)`` a core's output is
the matrix P [L, L] it applies to the values, row i holding the weights query i gives every key. The
queries and keys are random (seeded), so the picture shows the core's sparsity pattern and how it
spreads weight.

  lra-bench viz attention combiner_fixed --length 64 --out combiner_fixed.png

The report imports no part of training: a caller that compiles the probe its own way or checks its memory
first (the command line: ``training.steps.compile_run_once`` and ``training.xla_stats.check_fits``) passes
them as ``compiler`` and ``fits``.
"""

from __future__ import annotations

import math
import os
import textwrap
from typing import Any, Callable, Sequence

import numpy as np

from lra_bench.testing import effective_attention

# What a probe refused by ``fits`` can change.
PROBE_FIX = "use a shorter --length (the probe holds several length x length matrices)"


def _matrix(name: str, length: int, seed: int, compiler: Callable | None = None,
            fits: Callable[[Any, str, str], None] | None = None) -> np.ndarray:
  """``effective_attention(name, length)``, compiled by ``compiler`` and shown to ``fits(compiled, what,
  fix)`` (which raises if it cannot run) where they are given."""
  hooks: dict[str, Callable] = {}
  if compiler is not None:
    hooks["compiler"] = compiler
  if fits is not None:
    hooks["before_run"] = lambda probe: fits(probe, f"effective-attention probe of {name} at length {length}",
                                             PROBE_FIX)
  return effective_attention(name, length, seed=seed, **hooks)


def _draw(ax, matrix: np.ndarray, title: str, fontsize: float = 9):
  """The heatmap of ``matrix`` on ``ax``, numbered query/key positions on its axes; returns the image."""
  import matplotlib.colors as mcolors
  import matplotlib.ticker as ticker

  vmax = float(np.max(np.abs(matrix))) or 1.0
  if float(np.min(matrix)) < -1e-6:  # approximate cores (random features) can give negative weights
    image = ax.imshow(matrix, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
  else:
    # gamma 0.5: small but non-zero weights stay visible next to the large ones; zero stays black
    image = ax.imshow(matrix, cmap="magma", norm=mcolors.PowerNorm(0.5, vmin=0.0, vmax=vmax),
                      interpolation="nearest")
  ax.set_title(title, fontsize=fontsize)
  for axis in (ax.xaxis, ax.yaxis):  # positions 0 .. L-1 at round steps
    axis.set_major_locator(ticker.MaxNLocator(4, integer=True))
  ax.tick_params(labelsize=fontsize - 2, length=2, pad=1)
  return image


def _colorbar(fig, image, ax, fontsize: float = 7, cax=None):
  """The weight scale of one heatmap (each panel has its own, so a small maximum stays visible): beside
  ``ax``, or in ``cax`` where the caller laid it out."""
  bar = fig.colorbar(image, cax=cax) if cax is not None else fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
  bar.ax.tick_params(labelsize=fontsize)
  return bar


def plot_attention(name: str, out: str, length: int = 64, seed: int = 0, *, compiler: Callable | None = None,
                   fits: Callable[[Any, str, str], None] | None = None) -> list[str]:
  """Writes the heatmap of one core to ``out`` (its extension picks the format); returns the paths.
  ``compiler`` / ``fits``: see the module docstring."""
  from lra_bench.report import plots

  plt = plots.pyplot()
  matrix = _matrix(name, length, seed, compiler, fits)
  fig, ax = plt.subplots(figsize=(4.2, 3.8))
  image = _draw(ax, matrix, f"effective attention weights of {name} (one head, L={length})")
  ax.set_xlabel("key position")
  ax.set_ylabel("query position")
  _colorbar(fig, image, ax).set_label("weight", fontsize=8)
  return plots.save(fig, out)


def plot_attention_grid(names: Sequence[str], out_stem: str, length: int = 64, seed: int = 0, *,
                        compiler: Callable | None = None,
                        fits: Callable[[Any, str, str], None] | None = None,
                        done: Callable[[str], None] | None = None) -> tuple[list[str], dict[str, str]]:
  """One panel per core in a grid; returns (paths, {name: error} for cores that could not be probed).
  ``compiler`` / ``fits``: see the module docstring; ``done(name)``: called as each core is probed."""
  from lra_bench.report import plots

  plt = plots.pyplot()
  matrices, errors = {}, {}
  for name in names:
    try:
      matrices[name] = _matrix(name, length, seed, compiler, fits)
    except Exception as err:  # noqa: BLE001 - one broken core must not hide the others
      errors[name] = f"{type(err).__name__}: {err}"
    if done is not None:
      done(name)
  if not matrices:
    return [], errors
  # A fixed layout (inches), computed here rather than by a layout engine: with 46 panels and their
  # colour bars, constrained layout and a tight bounding box took 26 s to draw it; this takes 10 s.
  cols = min(4, len(matrices))
  rows = math.ceil(len(matrices) / cols)
  panel_w, panel_h, side = 3.1, 2.7, 1.95          # panel; the square heatmap inside it
  left, bottom, bar_gap, bar_w = 0.45, 0.3, 0.08, 0.09
  width = panel_w * cols
  title = (f"Effective attention weights (one head, random q/k, L={length}; row = query position, "
           "column = key position; each panel on its own colour scale)")
  title_lines = textwrap.wrap(title, max(20, int(width / 0.085)))  # ~0.085 in per character at 10 pt
  top = 0.2 + 0.19 * len(title_lines)
  height = panel_h * rows + top
  fig = plt.figure(figsize=(width, height))
  for i, (name, matrix) in enumerate(matrices.items()):
    row, col = divmod(i, cols)
    x0, y0 = col * panel_w + left, height - top - (row + 1) * panel_h + bottom
    ax = fig.add_axes((x0 / width, y0 / height, side / width, side / height))
    cax = fig.add_axes(((x0 + side + bar_gap) / width, y0 / height, bar_w / width, side / height))
    _colorbar(fig, _draw(ax, matrix, name, fontsize=8), ax, fontsize=5.5, cax=cax)
  fig.suptitle("\n".join(title_lines), fontsize=10, y=1 - 0.1 / height, va="top")
  return plots.save(fig, out_stem + ".png", out_stem + ".svg", tight=False), errors


def default_out(name: str, length: int) -> str:
  return os.path.join(os.getcwd(), f"attention_{name}_L{length}.png")
