"""Probes shared by the per-core attention tests: random inputs and the effective attention matrix.

Every core is linear in ``value``, so ``value = eye(L)`` (one head, V = L) returns the core's effective
attention matrix P [B, L, L] (docs/ARCHITECTURE.md, "The core"). ``init_and_apply`` and
``effective_matrix`` are the report's own probe (``lra_bench.report.viz``) and ``random_qkv`` the
conformance kit's (``lra_bench.testing``), so these tests, the registry-wide checks and the heatmaps
all feed cores the same inputs.
"""

from __future__ import annotations

import attention_zoo
from lra_bench.report.viz import effective_matrix, init_and_apply
from lra_bench.testing import random_qkv

__all__ = ["create", "effective_matrix", "init_and_apply", "random_qkv"]


def create(name: str, **overrides):
  return attention_zoo.create_attention(name, **overrides)
