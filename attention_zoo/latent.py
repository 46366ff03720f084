"""Latent (packed) attention: Luna (Ma et al. 2021) and the Set Transformer's ISAB (Lee et al. 2019).
O(L·l·(D + V)) time and memory for l latents (causal Luna: chunked prefix sums, also linear in L).

Axis legend: ``B`` batch, ``L`` length (``K`` keys), ``H`` heads, ``D`` query/key head dim, ``V`` value
dim, ``M`` latents (the packed length l of Luna, the m inducing points of ISAB); causal chunks: ``N``
chunks of ``C`` positions (``S`` keys inside a chunk).

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
- ``isab`` — ISAB(X) = MAB(X, MAB(I, X)) with m = 32 inducing points (``num_inds=32``, the default of
  the reference repository's Set Transformer, e.g. its point-cloud model).

Differences from the reference code (Luna: ``fairseq/modules/luna_attention.py`` of the authors'
fairseq fork; Set Transformer: ``modules.py`` of juho-lee/set_transformer):

- **P is a learned per-layer input.** Luna feeds P′ (after its own layer norm and residual) to the next
  layer as that layer's P, starting from one learned [l, d_model] embedding; a core has no cross-layer
  state, so every layer here learns its own P, directly in the head space [H, M, D] (normal(0, 1) init;
  ISAB initialises I [1, m, d] Xavier-uniform and projects it with the MAB's ``fc_q``).
- **ISAB's MAB** is ``O = LN(Q + A·V); O = LN(O + relu(fc_o(O)))`` (LN optional, off by default): the
  intermediate H = MAB(I, X) keeps the residual ``fc_q(I)``, an output layer and a ReLU before being
  projected again as keys and values of the second MAB. Here H is the attention P′ itself: residuals,
  layer norms and the feed-forward are nonlinear in the values (the model adds its own around the core).
- **Scale.** The MAB divides logits by √dim_V, the FULL width (H·D), not the head dim;
  ``mab_scaling=True`` reproduces that (both attentions' logits divided by √(H·D)); the default is √D,
  as in Luna.
- **Projections.** Luna projects P (``pq_proj``), the context (``pc_proj``, shared as packing keys and
  values when ``tie_kv``) and P′ (``c_proj`` for unpacking keys and values). Here the model's K serves
  as packing keys, P′_k = A K as unpacking keys and P′_v = A V as unpacking values: no second projection
  of P′ (it would need the values to build keys). Luna may use another head count for the packing
  (``num_pheads``); here both attentions use the model's H heads.
- **Dropout** (Luna drops both attention maps; ISAB has none): the unpacking weights are dropped, and the
  packing weights only on the value path (P′_v); P′_k uses the undropped packing weights, because a
  dropped P′_k passes through the second softmax and would bias the output. Inverted dropout, unbiased.
- **Padding** is excluded from the packing softmax as in Luna (the Set Transformer code has no mask); a
  fully padded example gets zero output.
- **Causal** (Luna only; ISAB has no causal form and raises NotImplementedError). Luna's causal
  attention (``LunarCausalAttention``) packs position i's prefix with weights
  ``w[t, m] = softplus(p_m · k_t / √D; β = ln 2)`` (no softmax, which would need the future) and DIVIDES
  BY THE POSITION COUNT i + 1; here the prefix is divided by the prefix sum of the weights,
  ``Z[i, m] = Σ_{real t ≤ i} w[t, m]``, so every packed vector is a convex combination of past keys
  (values) and the effective matrix stays non-negative and row-stochastic (with the count, rows would
  sum to ``Σ_m a_im Z_im / (i + 1)``). Padded positions get w = 0 and are not counted. As in Luna the
  causal unpacking keys are the packed keys of the same prefix, ``q_i · P′_k(i)_m``, computed without
  materialising P′(i) per position: inside chunks of ``causal_chunk`` positions the masked C×C products,
  across chunks exclusive prefix sums of the states Σ_t w[t, m] k_t and Σ_t w[t, m] v_t
  ([B, H, L/C, M, D + V]); O(L·(C + M)·(D + M)) time. Luna's own implementation keeps an
  [L, D, M] cumulative tensor instead.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class LatentConfig(AttentionConfig):
  """Packed latent attention (defaults: Luna, l = 256).

  Attributes:
    num_latents: M, the number of learned latent vectors per head (packed length).
    latent_init_scale: standard deviation of the normal initialisation of the latents.
    causal_chunk: chunk length C of the causal prefix sums (causal Luna only).
    mab_scaling: divide logits by √(H·D) (the Set Transformer MAB's √dim_V) instead of √D.
  """

  family = "low-rank"
  num_latents: int = 256
  latent_init_scale: float = 1.0
  causal_chunk: int = 64
  mab_scaling: bool = False
  # Whether the method has a causal form (Luna: yes; ISAB: no).
  has_causal_form: ClassVar[bool] = True

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int | None:
    """H·M·(2D + 1): causal Luna's prefix sums Σ w·k, Σ w·v and Σ w per head and latent (M =
    ``num_latents``); None for ISAB (no causal form)."""
    del length
    if self.no_causal_form:
      return None
    return num_heads * self.num_latents * (2 * head_dim + 1)

  def __post_init__(self):
    if self.num_latents < 1:
      raise ValueError(f"num_latents must be >= 1, got {self.num_latents}")
    if self.latent_init_scale <= 0:
      raise ValueError(f"latent_init_scale must be > 0, got {self.latent_init_scale}")
    if self.causal_chunk < 1:
      raise ValueError(f"causal_chunk must be >= 1, got {self.causal_chunk}")


@dataclasses.dataclass(frozen=True)
class IsabConfig(LatentConfig):
  """ISAB: the same form with m = 32 inducing points."""

  num_latents: int = 32
  has_causal_form = False
  no_causal_form = "ISAB packs the whole set into every inducing point"


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
    if cfg.causal and not cfg.has_causal_form:
      raise NotImplementedError(
          "ISAB packs the whole set into every inducing point: it has no causal form")
    batch, length, heads, dim = query.shape
    mask = _common.default_mask(mask, batch, length)
    latents = self.param("latents", nn.initializers.normal(cfg.latent_init_scale),
                         (heads, cfg.num_latents, dim), jnp.float32).astype(key.dtype)
    if cfg.mab_scaling:  # scaling the latents and the queries scales both attentions' logits
      latents, query = latents * heads ** -0.5, query * jnp.asarray(heads ** -0.5, query.dtype)
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    if cfg.causal:
      return causal_luna(latents, query, key, value, mask, drop, cfg.causal_chunk).astype(value.dtype)
    packed_keys, packed_values = pack(latents, key, value, mask, drop)
    logits = _common.dot_logits(query, packed_keys, "blhd,bhmd->bhlm")       # [B, H, L, M]
    out = _common.masked_attention(logits, True, packed_values, "bhlm,bhmv->bhlv", drop)
    return jnp.einsum("bhlv->blhv", out)


def pack(latents: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array, drop=None):
  """P′_k = A K [B, H, M, D] and P′_v = A V [B, H, M, V] with A = softmax over real keys of
  P Kᵀ/√D; latents [H, M, D]. ``drop`` (dropout callback) applies to the value path only."""
  logits = _common.dot_logits(latents, key, "hmd,bkhd->bhmk")                # [B, H, M, K]
  allowed = mask[:, None, None, :]
  if drop is None and key.dtype == value.dtype:  # one softmax for both paths
    both = _common.masked_attention(logits, allowed, jnp.concatenate([key, value], -1),
                                   "bhmk,bkhe->bhme")
    return both[..., :key.shape[-1]], both[..., key.shape[-1]:]
  packed_keys = _common.masked_attention(logits, allowed, key, "bhmk,bkhd->bhmd")
  return packed_keys, _common.masked_attention(logits, allowed, value, "bhmk,bkhv->bhmv", drop)


def softplus_ln2(x: jax.Array) -> jax.Array:
  """Luna's causal packing activation ``softplus(x; β = ln 2) = log2(1 + 2^x)`` (equals 1 at x = 0)."""
  return jax.nn.softplus(x * math.log(2.0)) / math.log(2.0)


def exclusive_chunk_cumsum(x: jax.Array) -> jax.Array:
  """Sum over the earlier chunks (axis 2 of [B, H, N, ...]), zero for the first chunk."""
  return jnp.cumsum(x, axis=2) - x


def prefix_scores(query: jax.Array, weights: jax.Array, key: jax.Array, chunk: int) -> jax.Array:
  """s[i, m] = Σ_{t ≤ i} w[t, m] (q_i · k_t): query, key [B, H, N, C, D], weights [B, H, N, C, M]
  (chunked). Inside a chunk the masked C×C products, across chunks the prefix states Σ w ⊗ k."""
  intra = jnp.einsum("bhncd,bhnsd->bhncs", query, key) * _common.causal_allowed(chunk, chunk)
  state = exclusive_chunk_cumsum(jnp.einsum("bhnsm,bhnsd->bhnmd", weights, key))  # [B, H, N, M, D]
  return (jnp.einsum("bhncs,bhnsm->bhncm", intra, weights)
          + jnp.einsum("bhncd,bhnmd->bhncm", query, state))


def prefix_unpack(mixing: jax.Array, weights: jax.Array, value: jax.Array, chunk: int) -> jax.Array:
  """out[i] = Σ_m x[i, m] Σ_{t ≤ i} w[t, m] v_t: mixing x, weights [B, H, N, C, M], value
  [B, H, N, C, V] (chunked)."""
  intra = jnp.einsum("bhncm,bhnsm->bhncs", mixing, weights) * _common.causal_allowed(chunk, chunk)
  state = exclusive_chunk_cumsum(jnp.einsum("bhnsm,bhnsv->bhnmv", weights, value))  # [B, H, N, M, V]
  return (jnp.einsum("bhncs,bhnsv->bhncv", intra, value)
          + jnp.einsum("bhncm,bhnmv->bhncv", mixing, state))


def causal_luna(latents, query, key, value, mask, drop, chunk: int) -> jax.Array:
  """Causal Luna with a cumulative packing: for every position i, P′(i) packs the real keys t ≤ i with
  weights w[t, m] = softplus_ln2(p_m · k_t / √D) normalised by their prefix sum Z[i, m], and
  Y_i = softmax_m(q_i · P′_k(i)_m / √D) P′_v(i)_m. Linear in L: chunked prefix sums (see
  :func:`prefix_scores`, :func:`prefix_unpack`); ``drop`` drops the packing weights of the value path
  and the unpacking weights. latents [H, M, D]; query, key [B, L, H, D]; value [B, L, H, V] ->
  [B, L, H, V] (float32 or wider)."""
  dtype = _common.accum_dtype(query, key, value)
  length, dim = query.shape[1], query.shape[-1]
  chunk = min(chunk, length)
  weights = softplus_ln2(_common.dot_logits(key, latents, "bkhd,hmd->bhkm")) * mask[:, None, :, None]
  total = jnp.cumsum(weights, axis=2)                                           # Z [B, H, L, M]
  inverse_total = 1.0 / jnp.where(total > 0, total, 1.0)

  def chunked(x):  # [B, H, L, ...] -> [B, H, N, C, ...]
    x = _common.pad_axis(x, chunk, axis=2)
    return x.reshape(x.shape[0], x.shape[1], -1, chunk, *x.shape[3:])

  q, k, v = (chunked(jnp.einsum("blhd->bhld", x.astype(dtype))) for x in (query, key, value))
  w = chunked(weights)
  scores = prefix_scores(q, w, k, chunk).reshape(*weights.shape[:2], -1, weights.shape[-1])[:, :, :length]
  logits = scores * inverse_total / math.sqrt(dim)                             # [B, H, L, M]
  value_weights = w if drop is None else chunked(drop(weights, 0))

  def contract(mixing):  # unnormalised unpacking weights [B, H, L, M] -> [B, H, L, V]
    out = prefix_unpack(chunked(mixing * inverse_total), value_weights, v, chunk)
    return out.reshape(*out.shape[:2], -1, out.shape[-1])[:, :, :length]

  out = _common.joint_masked_attention([(logits, True, contract)], drop)
  return jnp.einsum("bhlv->blhv", out)
