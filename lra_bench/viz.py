"""Effective attention matrices of the registered cores (the identity probe of CONTRACT 1).

Every core is linear in ``value``, so with one head and ``value = eye(L)`` its output *is* the matrix P
[L, L] it applies to the values: row i holds the weights query i gives every key. The queries and keys
are random (seeded), so the picture shows the core's sparsity pattern and how it spreads weight.

  lra-bench viz attention combiner_fixed --length 64 --out combiner_fixed.png
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

import attention_zoo


def effective_attention(name: str, length: int = 64, *, head_dim: int = 16, seed: int = 0,
                        scale: float = 0.5, **overrides) -> np.ndarray:
  """P [L, L] of core ``name`` (default config + ``overrides``) for one random head.

  ``scale`` multiplies the N(0, 1) queries and keys: below 1 the softmax is soft enough that every
  pair a core lets interact gets visible weight, so the picture shows the core's support.
  """
  import jax
  import jax.numpy as jnp

  core = attention_zoo.create_attention(name, **overrides)
  kq, kk, kp = jax.random.split(jax.random.key(seed), 3)
  q = scale * jax.random.normal(kq, (1, length, 1, head_dim))
  k = scale * jax.random.normal(kk, (1, length, 1, head_dim))
  eye = jnp.eye(length, dtype=q.dtype)[None, :, None, :]   # value [B=1, L, H=1, V=L]
  rngs = {"params": kp, "dropout": jax.random.fold_in(kp, 1), "attention": jax.random.fold_in(kp, 2)}
  variables = core.init(rngs, q, k, eye, mask=None, deterministic=True)
  out = core.apply(variables, q, k, eye, mask=None, deterministic=True,
                   rngs={"dropout": rngs["dropout"], "attention": rngs["attention"]}, mutable=False)
  return np.asarray(out[0, :, 0, :])


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
  from lra_bench import plots

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
  from lra_bench import plots

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
  fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.7 * rows), squeeze=False)
  for ax in axes.flat[len(matrices):]:
    ax.axis("off")
  for ax, (name, matrix) in zip(axes.flat, matrices.items()):
    _draw(ax, matrix, name)
  fig.suptitle(f"Effective attention (one head, random q/k, L={length}; row = query, column = key)",
               fontsize=10)
  fig.tight_layout()
  return plots.save(fig, out_stem + ".png", out_stem + ".svg"), errors


def default_out(name: str, length: int) -> str:
  return os.path.join(os.getcwd(), f"attention_{name}_L{length}.png")
