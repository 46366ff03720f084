"""Effective attention matrices of the registered cores (the identity probe; docs/ARCHITECTURE.md, "The core").

Every core is linear in ``value``, so with one head and ``value = eye(L)`` its output *is* the matrix P
[L, L] it applies to the values: row i holds the weights query i gives every key. ``effective_matrix``
is the one probe: the report's heatmaps and the attention tests (``tests/attention_probe.py``) use it. The queries and keys
are random (seeded), so the picture shows the core's sparsity pattern and how it spreads weight.

  lra-bench viz attention combiner_fixed --length 64 --out combiner_fixed.png
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

import attention_zoo


def init_and_apply(core, q, k, v, mask=None, *, deterministic=True, seed=0, variables=None):
  """Initializes ``core`` on these inputs (unless ``variables`` is given) and applies it; (out, variables).

  Streams: ``params`` key(seed), ``dropout`` key(seed + 1), ``attention`` key(seed + 2).
  """
  import jax

  rngs = {"params": jax.random.key(seed), "dropout": jax.random.key(seed + 1),
          "attention": jax.random.key(seed + 2)}
  if variables is None:
    variables = core.init(rngs, q, k, v, mask=mask, deterministic=True)
  out = core.apply(variables, q, k, v, mask=mask, deterministic=deterministic,
                   rngs={"dropout": rngs["dropout"], "attention": rngs["attention"]}, mutable=False)
  return out, variables


def effective_matrix(core, q, k, mask=None, variables=None, seed=0) -> np.ndarray:
  """P [B, L, L] of ``core`` for one-head ``q, k`` [B, L, 1, D]: its output for ``value = eye(L)``."""
  import jax.numpy as jnp

  batch, length = q.shape[:2]
  eye = jnp.broadcast_to(jnp.eye(length, dtype=q.dtype)[None, :, None, :], (batch, length, 1, length))
  out, _ = init_and_apply(core, q, k, eye, mask, variables=variables, seed=seed)
  return np.asarray(out[:, :, 0, :])


def effective_attention(name: str, length: int = 64, *, head_dim: int = 16, seed: int = 0,
                        scale: float = 0.5, **overrides) -> np.ndarray:
  """P [L, L] of core ``name`` (default config + ``overrides``) for one random head.

  ``scale`` multiplies the N(0, 1) queries and keys: below 1 the softmax is soft enough that every
  pair a core lets interact gets visible weight, so the picture shows the core's support.
  """
  import jax

  kq, kk, _ = jax.random.split(jax.random.key(seed), 3)  # the queries and keys of earlier reports
  q = scale * jax.random.normal(kq, (1, length, 1, head_dim))
  k = scale * jax.random.normal(kk, (1, length, 1, head_dim))
  return effective_matrix(attention_zoo.create_attention(name, **overrides), q, k, seed=seed)[0]


def _draw(ax, matrix: np.ndarray, title: str):
  import matplotlib.colors as mcolors

  vmax = float(np.max(np.abs(matrix))) or 1.0
  if float(np.min(matrix)) < -1e-6:  # approximate cores (random features) can give negative weights
    image = ax.imshow(matrix, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
  else:
    # gamma 0.5: small but non-zero weights stay visible next to the large ones; zero stays black
    image = ax.imshow(matrix, cmap="magma", norm=mcolors.PowerNorm(0.5, vmin=0.0, vmax=vmax),
                      interpolation="nearest")
  ax.set_title(title, fontsize=9)
  ax.set_xticks([])
  ax.set_yticks([])
  return image


def plot_attention(name: str, out: str, length: int = 64, seed: int = 0) -> list[str]:
  """Writes the heatmap of one core to ``out`` (its extension picks the format); returns the paths."""
  from lra_bench.report import plots

  plt = plots.pyplot()
  matrix = effective_attention(name, length, seed=seed)
  fig, ax = plt.subplots(figsize=(4.2, 3.8))
  image = _draw(ax, matrix, f"{name} (L={length})")
  ax.set_xlabel("key")
  ax.set_ylabel("query")
  fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
  return plots.save(fig, out)


def plot_attention_grid(names: Sequence[str], out_stem: str, length: int = 64,
                        seed: int = 0) -> tuple[list[str], dict[str, str]]:
  """One panel per core in a grid; returns (paths, {name: error} for cores that could not be probed)."""
  from lra_bench.report import plots

  plt = plots.pyplot()
  matrices, errors = {}, {}
  for name in names:
    try:
      matrices[name] = effective_attention(name, length, seed=seed)
    except Exception as err:  # noqa: BLE001 - one broken core must not hide the others
      errors[name] = f"{type(err).__name__}: {err}"
  if not matrices:
    return [], errors
  cols = min(4, len(matrices))
  rows = math.ceil(len(matrices) / cols)
  # constrained layout reserves room for the suptitle above the first row of panel titles
  fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.7 * rows + 0.4), squeeze=False,
                           layout="constrained")
  for ax in axes.flat[len(matrices):]:
    ax.axis("off")
  for ax, (name, matrix) in zip(axes.flat, matrices.items()):
    _draw(ax, matrix, name)
  fig.suptitle(f"Effective attention (one head, random q/k, L={length}; row = query, column = key)",
               fontsize=10)
  return plots.save(fig, out_stem + ".png", out_stem + ".svg"), errors


def default_out(name: str, length: int) -> str:
  return os.path.join(os.getcwd(), f"attention_{name}_L{length}.png")
