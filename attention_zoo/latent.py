"""Latent (packed) attention: Luna (Ma et al. 2021) and the Set Transformer's ISAB (Lee et al. 2019).
O(L·l·(D + V)) time and memory for l latents.

Axis legend: ``B`` batch, ``L`` length (``K`` keys), ``H`` heads, ``D`` query/key head dim, ``V`` value
dim, ``M`` latents (the packed length l of Luna, the m inducing points of ISAB).

A learned packed sequence P [H, M, D] (parameters of the core, one per layer and head) first attends to
the sequence, then the sequence attends to what was packed::

    A = softmax_K(P Kᵀ / √D)              [B, H, M, K]   (padded keys excluded)
    P′_k = A K,  P′_v = A V               [B, H, M, D], [B, H, M, V]
    Y = softmax_M(Q P′_kᵀ / √D) P′_v      [B, L, H, V]

The keys of the second attention are packed with the SAME packing weights as the values and are never
computed from the values, so the core is linear in ``value`` (the effective-matrix probe feeds
``value = eye(L)``). The effective matrix is the product of two row-stochastic maps,
``softmax_M(·) @ A``: non-negative, rows summing to 1, zero on padded keys. Perceiver-style latent
cross-attention (a latent array attending to the inputs, the inputs reading it back) has this form too.

Presets (one class, two configs):

- ``luna`` — Luna's "pack and unpack" attention, l = 256 (the LRA setting of the paper).
- ``isab`` — ISAB(X) = MAB(X, MAB(I, X)) with m = 32 inducing points (the largest m of the paper's
  experiments, which used ISAB16/ISAB32).

Differences from the reference code (Luna: ``fairseq/modules/luna_attention.py`` of the authors'
fairseq fork; Set Transformer: ``modules.py`` of juho-lee/set_transformer):

- **P is a learned per-layer input.** Luna feeds P′ (after its own layer norm and residual) to the next
  layer as that layer's P, starting from one learned [l, d_model] embedding; a core has no cross-layer
  state, so every layer here learns its own P, directly in the head space [H, M, D] (normal(0, 1) init).
  ISAB's intermediate H = LN(I + Attn(I, X)) followed by a feed-forward is likewise reduced to the
  attention P′ itself: residuals, layer norms and feed-forwards are nonlinear in the values.
- **Projections.** Luna projects P (``pq_proj``), the context (``pc_proj``, shared as packing keys and
  values when ``tie_kv``) and P′ (``c_proj`` for unpacking keys and values). Here the model's K serves
  as packing keys, P′_k = A K as unpacking keys and P′_v = A V as unpacking values: no second projection
  of P′ (it would need the values to build keys). Luna may use another head count for the packing
  (``num_pheads``); here both attentions use the model's H heads.
- **Dropout** (Luna drops both attention maps; ISAB has none): the unpacking weights are dropped, and the
  packing weights only on the value path (P′_v); P′_k uses the undropped packing weights, because a
  dropped P′_k passes through the second softmax and would bias the output. Inverted dropout, unbiased.
- **Padding** is excluded from the packing softmax as in Luna; a fully padded example gets zero output.
- **Causal**: Luna's causal form packs with ``softplus(β = ln 2)`` weights divided by the position count
  and per-position prefix sums; it is not implemented here (NotImplementedError). ISAB has no causal
  form.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class LatentConfig(AttentionConfig):
  """Packed latent attention (defaults: Luna, l = 256).

  Attributes:
    num_latents: M, the number of learned latent vectors per head (packed length).
    latent_init_scale: standard deviation of the normal initialisation of the latents.
  """

  num_latents: int = 256
  latent_init_scale: float = 1.0

  def __post_init__(self):
    if self.num_latents < 1:
      raise ValueError(f"num_latents must be >= 1, got {self.num_latents}")
    if self.latent_init_scale <= 0:
      raise ValueError(f"latent_init_scale must be > 0, got {self.latent_init_scale}")


@dataclasses.dataclass(frozen=True)
class IsabConfig(LatentConfig):
  """ISAB: the same form with m = 32 inducing points."""

  num_latents: int = 32


@register_attention("luna", LatentConfig)
@register_attention("isab", IsabConfig)
class LatentAttention(nn.Module):
  """Pack the sequence into M learned latents, then unpack; see the module docstring."""

  config: LatentConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError(
          "latent attention packs the whole sequence into every latent (no causal form here; Luna's "
          "causal softplus packing with prefix sums is not implemented, ISAB has none)")
    batch, length, heads, dim = query.shape
    mask = common.default_mask(mask, batch, length)
    latents = self.param("latents", nn.initializers.normal(cfg.latent_init_scale),
                         (heads, cfg.num_latents, dim), jnp.float32).astype(key.dtype)
    drop = common.dropout_callback(cfg.dropout_rate, deterministic)
    packed_keys, packed_values = pack(latents, key, value, mask, drop)
    logits = common.dot_logits(query, packed_keys, "blhd,bhmd->bhlm")       # [B, H, L, M]
    out = common.masked_attention(logits, True, packed_values, "bhlm,bhmv->bhlv", drop)
    return jnp.einsum("bhlv->blhv", out)


def pack(latents: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array, drop=None):
  """P′_k = A K [B, H, M, D] and P′_v = A V [B, H, M, V] with A = softmax over real keys of
  P Kᵀ/√D; latents [H, M, D]. ``drop`` (dropout callback) applies to the value path only."""
  logits = common.dot_logits(latents, key, "hmd,bkhd->bhmk")                # [B, H, M, K]
  allowed = mask[:, None, None, :]
  if drop is None and key.dtype == value.dtype:  # one softmax for both paths
    both = common.masked_attention(logits, allowed, jnp.concatenate([key, value], -1),
                                   "bhmk,bkhe->bhme")
    return both[..., :key.shape[-1]], both[..., key.shape[-1]:]
  packed_keys = common.masked_attention(logits, allowed, key, "bhmk,bkhd->bhmd")
  return packed_keys, common.masked_attention(logits, allowed, value, "bhmk,bkhv->bhmv", drop)
