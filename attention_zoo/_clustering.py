"""Online spherical k-means with EMA centroids, shared by the clustering cores (Combiner-Learnable,
Routing). Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` feature dim, ``K`` clusters.

Centroids live in the non-trainable flax collection :data:`COLLECTION` (``"centroids"``), variable
``means`` [H, K, D]: random unit vectors drawn from the ``params`` RNG at init. They move only when the
caller makes that collection mutable (the train step passes every non-``params`` collection of the
model state as mutable; evaluation passes ``mutable=False``)::

    out, updates = core.apply(variables, q, k, v, mask, deterministic=False, rngs=...,
                              mutable=["centroids"])
    variables = {**variables, **updates}

Update rule (per head): ``means_k <- unit(decay · means_k + (1 − decay) · mean of the unit features
nearest to k)`` over the real tokens of the batch; a centroid with no token keeps its value.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

COLLECTION = "centroids"


def unit(x: jax.Array) -> jax.Array:
  """``x / max(|x|, 1e-6)`` along the last axis."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-6)


def centroid_variable(module: nn.Module, heads: int, clusters: int, dim: int):
  """The module's ``centroids/means`` variable [H, K, D] (random unit vectors at init)."""

  def init_means():
    return unit(jax.random.normal(module.make_rng("params"), (heads, clusters, dim), jnp.float32))

  return module.variable(COLLECTION, "means", init_means)


def stored_clusters(module: nn.Module) -> int | None:
  """K of the module's stored centroids, or None before init."""
  if module.has_variable(COLLECTION, "means"):
    return module.get_variable(COLLECTION, "means").shape[1]
  return None


def similarities(feats: jax.Array, means: jax.Array) -> jax.Array:
  """Cosine scores [B, H, L, K] of unit features [B, L, H, D] and centroids [H, K, D]."""
  return jnp.einsum("blhd,hkd->bhlk", feats, means.astype(feats.dtype))


def nearest(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """Nearest centroid int [B, H, L] of scores [B, H, L, K]; padded tokens (mask [B, L] False) get K."""
  return jnp.where(mask[:, None, :], jnp.argmax(scores, -1), scores.shape[-1])


def may_update(module: nn.Module) -> bool:
  """True when the centroids collection is mutable and the module is not initializing."""
  return module.is_mutable_collection(COLLECTION) and not module.is_initializing()


def ema_update(means, feats: jax.Array, assign: jax.Array, decay: float) -> None:
  """EMA step of the ``means`` variable from unit features [B, L, H, D] and ``nearest`` [B, H, L]."""
  clusters = means.value.shape[1]
  onehot = jax.nn.one_hot(assign, clusters, dtype=feats.dtype)              # padded (K) -> zeros
  sums = jnp.einsum("bhlk,blhd->hkd", onehot, feats)
  counts = jnp.sum(onehot, axis=(0, 2))[..., None]                           # [H, K, 1]
  moved = unit(decay * means.value + (1 - decay) * sums / jnp.maximum(counts, 1))
  means.value = jnp.where(counts > 0, moved, means.value).astype(means.value.dtype)
