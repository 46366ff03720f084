"""Informer's ProbSparse self-attention (Zhou et al. 2021). O(L log L · (D + V)) time and memory.

Axis legend: ``B`` batch, ``L`` length (query positions), ``K`` key positions, ``H`` heads, ``D``
query/key head dim, ``V`` value dim, ``U`` sampled keys per query, ``T`` active (top) queries.

With ``c`` = ``factor`` = 5 and ``n = min(c·⌈ln L⌉, L)`` (L the padded length, a static shape):

1. every query i draws ``U = n`` keys uniformly with replacement among the real keys and gets the
   sparsity measurement ``M(q_i) = max_u s_iu − Σ_u s_iu / L_real`` of its sampled logits
   ``s_iu = q_i·k_u/√D`` (the original divides the sampled sum by the key count, as here);
2. the ``T = n`` real queries with the largest M are *active*: exact softmax over all real keys;
3. every other ("lazy") query outputs the mean of the values over the real tokens, i.e. uniform weights.

Each row of the effective matrix is therefore non-negative and sums to 1. No L×L matrix is formed: the
sampled logits are [B, L, U, H], the active logits [B, H, T, K].

Differences from the original (zhouhaoyi/Informer2020 ``models/attn.py`` ``ProbAttention``; the
Skyformer repository's copy differs only in choosing ``factor = ⌈128 / ln max_len⌉`` and ignoring the
padding mask):

- **Padding**: the original ignored it (padded keys were sampled, attended and averaged). Here keys are
  sampled among real keys only (rank ``⌊u·L_real⌋`` of the real positions, wherever the padding is),
  active queries attend to real keys only, lazy queries average real values only, and padded queries
  get M = −∞ so they rank last (they are active only when fewer than T queries are real, and then
  every real query is active too).
- **Randomness**: the original drew ``torch.randint`` on every call (one sample pattern for the batch and
  the heads). Here the uniforms [L, U] come from the flax ``"attention"`` stream (``redraw=
  "every_call"``), or, without it or with ``redraw="fixed"``, from ``key(seed)`` folded with the module
  path; like the original they are shared by the batch and the heads.
- **Dropout**: the original defined attention dropout but never applied it. Here the active queries'
  softmax weights are dropped (unnormalized weights, undropped normaliser: unbiased); lazy rows are
  not dropped.
- **Causal** raises ``NotImplementedError``. The original's masked form (decoder self-attention) lets
  lazy queries output ``cumsum(V)`` (a sum, not a mean) and selects active queries by a top-T over ALL
  queries, with keys sampled from the future: which past queries are active depends on future inputs,
  so no causal version of the selection exists without changing the method.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class InformerConfig(AttentionConfig):
  """ProbSparse options (defaults: the original's factor 5, redrawn every call).

  Attributes:
    factor: c; samples per query and active queries are both ``min(c·⌈ln L⌉, L)``.
    redraw: ``"every_call"`` (``"attention"`` RNG stream, falling back to the fixed draw) or ``"fixed"``.
    seed: seed of the fixed draw (folded with the module path, so layers differ).
  """

  family = "low-rank"
  no_causal_form = ("the top-u query selection ranks all queries, so future inputs decide which past queries "
                    "are active")
  factor: int = 5
  redraw: str = "every_call"
  seed: int = 0

  def __post_init__(self):
    if self.factor < 1:
      raise ValueError(f"informer factor must be >= 1, got {self.factor}")
    if self.redraw not in ("every_call", "fixed"):
      raise ValueError(f"informer redraw must be 'every_call' or 'fixed', got {self.redraw!r}")


def top_count(length: int, factor: int) -> int:
  """``min(c·⌈ln L⌉, L)``: sampled keys per query, and active queries."""
  return min(factor * math.ceil(math.log(length)), length)


def sampled_keys(mask: jax.Array, uniforms: jax.Array) -> jax.Array:
  """Real key positions of rank ``⌊u·L_real⌋``: mask bool [B, K], uniforms [L, U] -> int [B, L, U]
  (position 0 for an example without real tokens)."""
  count = jnp.sum(mask, axis=1)[:, None, None]                                 # [B, 1, 1]
  rank = jnp.clip(jnp.floor(uniforms[None] * count).astype(jnp.int32), 0, jnp.maximum(count - 1, 0))
  order = jnp.argsort(~mask, axis=1, stable=True)                              # real positions first
  return jax.vmap(lambda o, r: o[r])(order, rank)


def sparsity(query: jax.Array, key: jax.Array, mask: jax.Array, positions: jax.Array) -> jax.Array:
  """M [B, H, L] = max − sum/L_real of the sampled logits; NEG_INF for padded queries.
  query, key [B, L, H, D]; positions int [B, L, U]."""
  batch, length, samples = positions.shape
  picked = jnp.take_along_axis(key, positions.reshape(batch, -1)[:, :, None, None], axis=1)
  picked = picked.reshape(batch, length, samples, *key.shape[2:])             # [B, L, U, H, D]
  logits = _common.dot_logits(query, picked, "blhd,bluhd->bhlu")               # [B, H, L, U]
  real = jnp.sum(mask, axis=1).astype(logits.dtype)[:, None, None]
  measure = jnp.max(logits, axis=-1) - jnp.sum(logits, axis=-1) / jnp.maximum(real, 1.0)
  return jnp.where(mask[:, None, :], measure, _common.NEG_INF)


@register_attention("informer", InformerConfig)
class InformerAttention(nn.Module):
  """ProbSparse attention: top queries by sparsity get softmax attention, the rest the mean value."""

  config: InformerConfig

  def uniforms(self, shape: tuple[int, ...]) -> jax.Array:
    """u in [0, 1): from the ``"attention"`` stream, or the fixed per-layer draw."""
    cfg = self.config
    rng = _common.draw_key(self, cfg.redraw, cfg.seed)
    return jax.random.uniform(rng, shape)

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("informer has no causal form: the top-u query selection ranks all "
                                "queries, so future inputs decide which past queries are active")
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    count = top_count(length, cfg.factor)
    positions = sampled_keys(mask, self.uniforms((length, count)))             # [B, L, U]
    measure = jax.lax.stop_gradient(sparsity(query, key, mask, positions))
    _, active = jax.lax.top_k(measure, count)                                  # [B, H, T]
    self.sow("intermediates", "sampled_keys", positions)
    self.sow("intermediates", "active_queries", active)
    picked = jnp.take_along_axis(jnp.swapaxes(query, 1, 2), active[..., None], axis=2)   # [B, H, T, D]
    logits = _common.dot_logits(picked, key, "bhtd,bkhd->bhtk")                 # [B, H, T, K]
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    active_out = _common.masked_attention(logits, mask[:, None, None, :], value, "bhtk,bkhv->bhtv", drop)
    real = mask.astype(_common.accum_dtype(value))
    lazy = jnp.einsum("bkhv,bk->bhv", value.astype(real.dtype), real)
    lazy = lazy / jnp.maximum(jnp.sum(real, axis=1), 1.0)[:, None, None]      # [B, H, V]
    out = jnp.broadcast_to(lazy[:, :, None, :], (*lazy.shape[:2], length, lazy.shape[-1]))
    b_index = jnp.arange(batch)[:, None, None]
    h_index = jnp.arange(active.shape[1])[None, :, None]
    out = out.at[b_index, h_index, active].set(active_out.astype(out.dtype))   # [B, H, L, V]
    return jnp.swapaxes(out, 1, 2).astype(value.dtype)
