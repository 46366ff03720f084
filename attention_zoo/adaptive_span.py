"""Adaptive attention span (Sukhbaatar et al. 2019): softmax attention with a learned soft span per head.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
query blocks of ``S`` positions (``Q`` query inside a block), ``K`` the 3·S keys of blocks n−1, n, n+1.

Each head h learns ``z_h = max_span · current_val_h``; the weight of distance ``x = |i − j|`` is scaled by
the ramp mask ``m(x) = clamp((R + z_h − x) / R, 0, 1)`` (R = ``ramp``) AFTER the softmax and the row is
renormalised:

    a_ij = softmax_j(q_i·k_j/√D) · m(|i − j|) / Σ_j' softmax_j'(q_i·k_j'/√D) · m(|i − j'|)

over keys at distance ``x < max_span``. That equals ONE masked softmax with logits ``q·k/√D + log m``
(allowed where m > 0), which is how it is computed (``_common.joint_masked_attention``), on banded blocks:
queries in blocks of S = min(max_span, L rounded up to a multiple of 8) attend the keys of their own
and both neighbouring blocks, so the cost is O(L·3S) — linear in L for a fixed ``max_span``.

The span regulariser ``loss_coeff · max_span · mean_h(current_val_h)`` (upstream ``get_loss``) is sown
to the ``"losses"`` collection as ``span_penalty``: a training loop must apply with
``mutable=["losses"]`` and add the sum of that collection to the loss, or the spans never shrink.

Defaults follow facebookresearch/adaptive-span ``adaptive_span.py`` and its enwik8 script: ``ramp=32``,
``init_val=0``, ``loss_coeff=5e-7`` (``--adapt-span-loss 0.0000005``); ``max_span=256`` (upstream used
8192 on enwik8; LRA has no adaptive-span runs).

Differences from the reference code:

- **Bidirectional by default**: the distance is symmetric, ``x = |i − j|``, and keys on both sides within
  ``max_span − 1`` are visible (upstream is a causal language model: keys j ≤ i only).
  ``causal=True`` gives upstream's form (j ≤ i, distance i − j).
- Upstream clamps ``current_val`` to [0, 1] after every optimizer step (``clamp_param``); a core cannot
  touch the optimizer, so the forward pass uses the clamped value with a straight-through gradient (the
  mask sees clip(current_val, 0, 1), the gradient is the unclipped one, as upstream between clamps).
- Renormalisation is exact (upstream adds 1e-8 to the denominator) and **padded keys are masked**
  (upstream had no padding).
- No relative position embeddings ``key_pe`` (the harness's models own positions) and no cache trimming
  (``adapt_span_cache``): the window is always ``max_span`` wide.
- Attention dropout drops unnormalised weights (normalised by the undropped sum): unbiased, like upstream
  dropout of the renormalised probabilities.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _blocks, _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class AdaptiveSpanConfig(AttentionConfig):
  """Adaptive-span options.

  Attributes:
    max_span: the largest span M: keys at distance x < M are computed (window 2M − 1 bidirectional).
    ramp: R, the length of the mask's linear ramp from 1 to 0.
    init_val: initial ``current_val`` (span z = init_val · max_span) of every head.
    loss_coeff: coefficient of the sown span penalty ``loss_coeff · max_span · mean(current_val)``.
  """

  family = "sparse"
  max_span: int = 256
  ramp: int = 32
  init_val: float = 0.0
  loss_coeff: float = 5e-7

  def __post_init__(self):
    if self.max_span < 1 or self.ramp < 1:
      raise ValueError("adaptive_span max_span and ramp must be >= 1")
    if not 0.0 <= self.init_val <= 1.0:
      raise ValueError(f"adaptive_span init_val must be in [0, 1], got {self.init_val}")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·min(M − 1, L): the keys/values at distance 1..M − 1 (M = ``max_span``; the learned spans
    z_h ≤ M could shrink it after training, upstream's cache trimming, but the config bounds it by M)."""
    return 2 * num_heads * head_dim * min(self.max_span - 1, length)

  def support(self, length: int) -> np.ndarray | None:
    delta = np.arange(length)[:, None] - np.arange(length)[None, :]
    return (np.abs(delta) < self.max_span) & ((delta >= 0) if self.causal else True)


def ramp_mask(distance: jax.Array, span: jax.Array, ramp: int) -> jax.Array:
  """m(x) = clamp((R + z − x) / R, 0, 1): ``distance`` x [...] and ``span`` z broadcastable."""
  return jnp.clip((ramp + span - distance) / ramp, 0.0, 1.0)


def neighbour_blocks(x: jax.Array, size: int) -> jax.Array:
  """[B, N·S, ...] -> [B, N, 3S, ...]: for block n the positions of blocks n−1, n, n+1 (zeros/False
  beyond the ends)."""
  padded = jnp.pad(x, [(0, 0), (size, size)] + [(0, 0)] * (x.ndim - 2))
  length = x.shape[1]
  parts = [_blocks.to_blocks(padded[:, shift * size: shift * size + length], size) for shift in range(3)]
  return jnp.concatenate(parts, axis=2)


def neighbour_positions(num_blocks: int, size: int) -> tuple[np.ndarray, np.ndarray]:
  """(query positions [N, S], key positions [N, 3S]) of :func:`neighbour_blocks`; keys may be < 0 or
  ≥ N·S at the ends (never real)."""
  queries = np.arange(num_blocks * size).reshape(num_blocks, size)
  keys = (np.arange(num_blocks)[:, None] - 1) * size + np.arange(3 * size)[None, :]
  return queries, keys


def band_allowed(mask: jax.Array, size: int, max_distance: int, causal: bool):
  """(allowed [B, N, Q, K], signed distance i − j [N, Q, K]) of banded blocks: real keys with
  |i − j| ≤ max_distance (and j ≤ i when causal). ``mask`` [B, N·S]."""
  num_blocks = mask.shape[1] // size
  q_pos, k_pos = neighbour_positions(num_blocks, size)
  delta = q_pos[:, :, None] - k_pos[:, None, :]                              # [N, Q, K]
  geometric = (np.abs(delta) <= max_distance) & (delta >= 0 if causal else True)
  allowed = neighbour_blocks(mask, size)[:, :, None, :] & geometric
  return allowed, delta


@register_attention("adaptive_span", AdaptiveSpanConfig)
class AdaptiveSpanAttention(nn.Module):
  """Banded softmax attention with a learned per-head soft span; see the module docstring."""

  config: AdaptiveSpanConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length, heads, _ = query.shape
    mask = _common.default_mask(mask, batch, length)
    current_val = self.param("current_val", nn.initializers.constant(cfg.init_val), (heads,), jnp.float32)
    self.sow("losses", "span_penalty", cfg.loss_coeff * cfg.max_span * jnp.mean(current_val))
    clamped = current_val + jax.lax.stop_gradient(jnp.clip(current_val, 0.0, 1.0) - current_val)

    size = min(cfg.max_span, -(-length // 8) * 8)
    query, key, value, mask = _blocks.pad_qkv_to_multiple(query, key, value, mask, size)
    allowed, delta = band_allowed(mask, size, cfg.max_span - 1, cfg.causal)   # [B, N, Q, K], [N, Q, K]
    dtype = _common.accum_dtype(query, key)
    soft = ramp_mask(jnp.abs(delta).astype(dtype)[None], (cfg.max_span * clamped).astype(dtype)[:, None, None, None],
                     cfg.ramp)                                                 # [H, N, Q, K]
    allowed = allowed[:, None] & (soft > 0)                                    # [B, H, N, Q, K]
    logits = _common.dot_logits(_blocks.to_blocks(query, size), neighbour_blocks(key, size),
                               "bnqhd,bnkhd->bhnqk") + jnp.log(jnp.where(soft > 0, soft, 1.0))
    out = _common.joint_masked_attention(
        [(logits, allowed, _common.contraction("bhnqk,bnkhv->bhnqv", neighbour_blocks(value, size)))],
        _common.dropout_callback(cfg.dropout_rate, deterministic))                # [B, H, N, Q, V]
    out = jnp.transpose(out, (0, 2, 3, 1, 4)).astype(value.dtype)
    return _blocks.from_blocks(out)[:, :length]
