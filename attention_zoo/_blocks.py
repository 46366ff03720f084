"""Block and grid helpers shared by the sparse cores (BigBird, Sparse-Fixed, Axial) and Combiner.

Axis legend: ``B`` batch, ``L`` length, ``N`` blocks (or grid rows), ``S`` block size (or grid
columns), ``H`` heads, ``D`` head dim, ``V`` value dim, ``K`` gathered blocks per query block.

Every sparse core pads the sequence to a block (or grid) multiple internally and masks the padding, so
the caller never chooses sizes that must divide the length.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attention_zoo import _common


def sqrt_block_size(length: int, minimum: int = 1) -> int:
  """Default block size ~ sqrt(L) (so that L/S ~ S), at least ``minimum``."""
  return max(minimum, int(math.ceil(math.sqrt(length))))


def grid_shape(length: int, width: int | None = None) -> tuple[int, int]:
  """(rows n, columns m) of the row-major grid holding ``length`` positions.

  ``width`` (e.g. the image width) fixes m; otherwise m = ceil(sqrt(L)). n = ceil(L / m).
  """
  m = width if width else sqrt_block_size(length)
  return int(math.ceil(length / m)), m


def pad_to_multiple(x: jax.Array, mask: jax.Array, multiple: int) -> tuple[jax.Array, jax.Array]:
  """Pads ``x`` [B, L, ...] and ``mask`` [B, L] along L to a multiple; padded positions are masked."""
  return _common.pad_axis(x, multiple, axis=1), _common.pad_axis(mask, multiple, axis=1, value=False)


def pad_qkv_to_multiple(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array,
                        multiple: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """``pad_to_multiple`` of query, key and value [B, L, ...] together; returns (q, k, v, padded mask)."""
  padded = [pad_to_multiple(x, mask, multiple)[0] for x in (query, key, value)]
  return (*padded, _common.pad_axis(mask, multiple, axis=1, value=False))


def to_blocks(x: jax.Array, block: int) -> jax.Array:
  """[B, L, ...] -> [B, N, S, ...] with S = ``block`` (L must already be a multiple)."""
  batch, length = x.shape[:2]
  if length % block:
    raise ValueError(f"length {length} is not a multiple of block size {block}; pad first")
  return x.reshape(batch, length // block, block, *x.shape[2:])


def from_blocks(x: jax.Array) -> jax.Array:
  """[B, N, S, ...] -> [B, N*S, ...]."""
  return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def grid_layouts(x: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
  """Head-major grid views for the axial cores: ``x`` [B, L, H, X] (L a multiple of ``width``) ->
  (row-major [B, H, R, C, X], column-major [B, H, C, R, X]). With heads and the line axis leading, row
  and column contractions are batched matmuls that need no further transposed copies."""
  grid = to_blocks(x, width)                                               # [B, R, C, H, X]
  return jnp.transpose(grid, (0, 3, 1, 2, 4)), jnp.transpose(grid, (0, 3, 2, 1, 4))


def from_grid(row_major: jax.Array) -> jax.Array:
  """Inverse of the row-major view of :func:`grid_layouts`: [B, H, R, C, X] -> [B, R*C, H, X]."""
  return from_blocks(jnp.transpose(row_major, (0, 2, 3, 1, 4)))
