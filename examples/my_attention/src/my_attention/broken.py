"""``my_attention_broken``: a deliberately wrong variant of ``my_attention`` that looks ahead.

It ignores ``causal=True`` (every query sees the keys after it), the bug a hand-written causal mask
most often has. It exists so that ``lra-bench check my_attention_broken --plugin my_attention.broken``
shows what a failing conformance check looks like; the package's entry point does not load it.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from attention_zoo.registry import register_attention
from my_attention.core import CosineAttention, CosineConfig


@dataclasses.dataclass(frozen=True)
class LookAheadConfig(CosineConfig):
  """The same options as ``my_attention``."""


@register_attention("my_attention_broken", LookAheadConfig)
class LookAheadAttention(nn.Module):
  """``my_attention`` with the causal mask dropped: the bug on purpose."""

  config: LookAheadConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    bidirectional = CosineConfig(**{**dataclasses.asdict(self.config), "causal": False})
    return CosineAttention(bidirectional, name="cosine")(query, key, value, mask, deterministic)
