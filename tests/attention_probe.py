"""Probes shared by attention tests: random inputs and the effective attention matrix.

Every core is linear in ``value``, so ``value = eye(L)`` (one head, V = L) returns the core's effective
attention matrix P [B, L, L] (docs/ARCHITECTURE.md, "The core"). ``init_and_apply`` and
``effective_matrix`` are the report's own probe (``lra_bench.report.viz``), so tests and heatmaps agree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import attention_zoo
from lra_bench.report.viz import effective_matrix, init_and_apply

__all__ = ["create", "effective_matrix", "init_and_apply", "random_qkv"]


def random_qkv(seed: int, batch: int, length: int, heads: int, head_dim: int, value_dim: int,
               dtype=jnp.float32, scale: float = 1.0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  q = scale * jax.random.normal(kq, (batch, length, heads, head_dim), dtype)
  k = scale * jax.random.normal(kk, (batch, length, heads, head_dim), dtype)
  v = jax.random.normal(kv, (batch, length, heads, value_dim), dtype)
  return q, k, v


def create(name: str, **overrides):
  return attention_zoo.create_attention(name, **overrides)
