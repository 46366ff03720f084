"""Dense masked softmax attention in numpy float64: the O(L^2) reference the sparse cores must equal.

Each method's test builds its exact boolean mask from the closed form of its pattern and compares the
efficient core with :func:`dense_masked_attention` under that mask.
"""

from __future__ import annotations

import numpy as np


def dense_masked_attention(q, k, v, allowed) -> np.ndarray:
  """softmax over allowed keys: q, k [B, L, H, D], v [B, L, H, V], allowed bool broadcastable to
  [B, H, L, L] (query, key) -> [B, L, H, V]; rows with no allowed key are zero."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  allowed = np.broadcast_to(np.asarray(allowed, bool), logits.shape)
  logits = np.where(allowed, logits, -np.inf)
  peak = np.max(logits, axis=-1, keepdims=True)
  weights = np.where(allowed, np.exp(logits - np.where(np.isfinite(peak), peak, 0.0)), 0.0)
  total = weights.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhv->bqhv", weights / np.where(total > 0, total, 1.0), v)


def key_and_causal_mask(mask, causal: bool) -> np.ndarray:
  """bool [B, 1, L, L]: key padding mask, ANDed with j <= i when causal."""
  mask = np.asarray(mask, bool)
  length = mask.shape[1]
  allowed = np.broadcast_to(mask[:, None, None, :], (mask.shape[0], 1, length, length))
  if causal:
    allowed = allowed & np.tril(np.ones((length, length), bool))
  return allowed


def padded_mask(batch: int, length: int, pad: int) -> np.ndarray:
  """bool [B, L]: example 0 has ``pad`` trailing padded positions, the others none."""
  mask = np.ones((batch, length), bool)
  mask[0, length - pad:] = False
  return mask


def run_core(core, q, k, v, mask=None, *, deterministic=True, seed=0, intermediates=False):
  """``core.apply`` under one ``jax.jit`` (the cores here have no parameters): far fewer compiles than
  eager op-by-op dispatch. RNG streams as in ``attention_probe.init_and_apply`` for the same seed.
  With ``intermediates`` returns ``(out, sown intermediates)``."""
  import jax

  rngs = {"dropout": jax.random.key(seed + 1), "attention": jax.random.key(seed + 2)}
  mutable = ["intermediates"] if intermediates else False

  def apply(q, k, v, mask):
    return core.apply({}, q, k, v, mask=mask, deterministic=deterministic, rngs=rngs, mutable=mutable)

  result = jax.jit(apply)(q, k, v, None if mask is None else np.asarray(mask, bool))
  if intermediates:
    return result[0], result[1]["intermediates"]
  return result
