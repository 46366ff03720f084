"""Probes shared by attention tests: random inputs and the effective attention matrix.

Every core is linear in ``value``, so ``value = eye(L)`` (one head, V = L) returns the core's effective
attention matrix P [B, L, L] (ARCHITECTURE.md, CONTRACT 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import attention_zoo


def random_qkv(seed: int, batch: int, length: int, heads: int, head_dim: int, value_dim: int,
               dtype=jnp.float32, scale: float = 1.0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  q = scale * jax.random.normal(kq, (batch, length, heads, head_dim), dtype)
  k = scale * jax.random.normal(kk, (batch, length, heads, head_dim), dtype)
  v = jax.random.normal(kv, (batch, length, heads, value_dim), dtype)
  return q, k, v


def init_and_apply(core, q, k, v, mask=None, *, deterministic=True, seed=0, variables=None):
  """Initializes ``core`` on these inputs (unless ``variables`` is given) and applies it."""
  rngs = {"params": jax.random.key(seed), "dropout": jax.random.key(seed + 1),
          "attention": jax.random.key(seed + 2)}
  if variables is None:
    variables = core.init(rngs, q, k, v, mask=mask, deterministic=True)
  out = core.apply(variables, q, k, v, mask=mask, deterministic=deterministic,
                   rngs={"dropout": rngs["dropout"], "attention": rngs["attention"]},
                   mutable=False)
  return out, variables


def effective_matrix(core, q, k, mask=None, variables=None, seed=0) -> np.ndarray:
  """P [B, L, L] of ``core`` for one-head ``q, k`` [B, L, 1, D]."""
  batch, length = q.shape[:2]
  eye = jnp.broadcast_to(jnp.eye(length, dtype=q.dtype)[None, :, None, :], (batch, length, 1, length))
  out, _ = init_and_apply(core, q, k, eye, mask, variables=variables, seed=seed)
  return np.asarray(out[:, :, 0, :])


def create(name: str, **overrides):
  return attention_zoo.create_attention(name, **overrides)
