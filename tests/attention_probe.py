"""Probes shared by the per-core attention tests: random inputs and the effective attention matrix.

Every core is linear in ``value``, so ``value = eye(L)`` (one head, V = L) returns the core's effective
attention matrix P [B, L, L] (docs/ARCHITECTURE.md, "The effective matrix"). ``init_and_apply``,
``effective_matrix`` and ``random_qkv`` are the conformance kit's probe (``lra_bench.testing``), so these
tests, the registry-wide checks and the report's heatmaps all feed cores the same inputs through the
same code.
"""

from __future__ import annotations

import attention_zoo
from lra_bench.testing import effective_matrix, init_and_apply, random_qkv

__all__ = ["create", "effective_matrix", "init_and_apply", "random_qkv"]


def create(name: str, **overrides):
  return attention_zoo.create_attention(name, **overrides)
