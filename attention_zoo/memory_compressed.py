"""Memory-compressed attention (Liu et al. 2018, "Generating Wikipedia by Summarizing Long Sequences").
O(L·L/S·(D + V)) time and memory: still quadratic, S times cheaper than vanilla.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads (``G`` output heads of the key convolution), ``D``
query/key head dim (``E`` its output index), ``V`` value dim, ``C`` compressed memory slots
(C = ceil(L / S)), ``S`` positions per slot (kernel = stride = ``compression``).

Keys and values are shortened by a learned strided convolution along the length (kernel = stride = S,
no overlap, no bias), then every query attends to the compressed memory with one softmax::

    K̃[c] = Σ_s K[cS + s] · Wk[s]          [B, C, H, D]   (a full convolution over the key features)
    Ṽ[c] = Σ_s w[s] V[cS + s]              [B, C, H, V]   (one length-S filter per head)
    Y = softmax_C(Q K̃ᵀ / √D) Ṽ

Key convolution: ``key_conv="full"`` (default) convolves over all heads' features at once (Wk
[S, H, D, H, D], as the paper's convolution over the d_model-wide projected keys), ``"per_head"`` uses
one [S, D, D] kernel per head; LeCun-normal over the fan-in. Value convolution: one scalar filter w
[H, S] per head, shared by the V features and initialised to 1/S (mean pooling, mesh-tensorflow's
compression). The values must be mixed by the same weights in every feature: the contract of a core is
``out = P · values`` per head, with the effective matrix P read from the ``value = eye(L)`` probe, and a
convolution that mixes value features would mix the probe's columns (padded and future "keys" would
appear used). The model's value projection supplies the feature mixing. The core is linear in the
values; its effective matrix is ``softmax(·) @ conv``, and the learned filters being signed it is
neither non-negative nor row-stochastic (declared).

Padding: padded keys and values are set to zero before the convolution and a slot is masked when its
window holds no real token, so real outputs do not depend on padded contents and padded keys get exactly
zero weight. A partially padded window mixes only its real tokens (the padded ones contribute zero), so
it differs from the slot the same tokens would give without padding. Lengths that are not a multiple of
S are padded internally the same way.

Causal (``causal=True``): slot c may be attended by query i only once its whole window is in the past,
``cS + S − 1 ≤ i`` (mesh-tensorflow's ``mask_right`` rule for its memory-compressed attention). The first
S − 1 queries therefore see no slot and get a zero output (mesh-tensorflow's additive −1e9 mask gives
them a uniform average over all slots, future included).

Differences from the reference code (the paper; tensor2tensor ``common_attention.conv_elems_1d`` for the
convolution, mesh-tensorflow ``multihead_self_attention_memory_compressed`` for the causal mask):

- Compression after the model's projections, per core (the paper's order). The values are compressed
  by a per-head scalar filter, not a full convolution over the value features (see above): between the
  paper's learned convolution and mesh-tensorflow's mean pooling (before the projections), which is its
  initial value. tensor2tensor's ``conv_elems_1d`` has a bias and a ``valid`` convolution that drops a
  trailing partial window; here there is no bias (a value bias would make the core affine, not linear,
  in the values; a key bias adds the same logit to every slot and cancels) and the trailing partial
  window is kept (zero-padded).
- Padding is masked as described above (the originals did not mask padded keys inside windows).
- The paper's decoder alternates memory-compressed layers with local-attention layers (blocks of 256);
  those are other cores (e.g. local/blocked attention), not part of this one.
- Dropout (``dropout_rate``) on the attention weights over slots (unnormalised weights are dropped and
  divided by the undropped sum, so it is unbiased).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class MemoryCompressedConfig(AttentionConfig):
  """Memory-compressed attention (defaults: the paper's kernel = stride = 3, full key convolution).

  Attributes:
    compression: S, kernel size and stride of the convolutions along the length.
    key_conv: ``"full"`` (one key kernel over all heads' features) or ``"per_head"``.
  """

  family = "low-rank"
  compression: int = 3
  key_conv: str = "full"
  nonnegative = False
  rows_sum_to_one = False

  def __post_init__(self):
    if self.compression < 1:
      raise ValueError(f"memory_compressed compression must be >= 1, got {self.compression}")
    if self.key_conv not in ("full", "per_head"):
      raise ValueError(f"memory_compressed key_conv must be 'full' or 'per_head', got {self.key_conv!r}")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·⌈L/S⌉: the compressed key and value of every finished window of S positions, and the
    running sums of the unfinished one (the convolutions are linear, so they accumulate)."""
    return 2 * num_heads * head_dim * -(-length // self.compression)


def windows(x: jax.Array, stride: int) -> jax.Array:
  """x [B, L, H, ...] (L a multiple of S) -> [B, C, S, H, ...]."""
  return x.reshape(x.shape[0], x.shape[1] // stride, stride, *x.shape[2:])


def compress_keys(key: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
  """Strided convolution of key [B, L, H, D] along L -> [B, C, H, D]; kernel [S, H, D, G, E] (full)
  or [H, S, D, E] (per head)."""
  spec = "bcshd,shdge->bcge" if kernel.ndim == 5 else "bcshd,hsde->bche"
  return jnp.einsum(spec, windows(key, stride), kernel.astype(key.dtype))


def compress_values(value: jax.Array, weights: jax.Array, stride: int) -> jax.Array:
  """Ṽ[c] = Σ_s w[h, s] V[cS + s]: value [B, L, H, V], weights [H, S] -> [B, C, H, V]."""
  return jnp.einsum("bcshv,hs->bchv", windows(value, stride), weights.astype(value.dtype))


@register_attention("memory_compressed", MemoryCompressedConfig)
class MemoryCompressedAttention(nn.Module):
  """Softmax attention over strided-convolution-compressed keys and values; see the module docstring."""

  config: MemoryCompressedConfig

  def key_kernel(self, heads: int, dim: int) -> jax.Array:
    """The learned key kernel [S, H, D, H, D] (full) or [H, S, D, D] (per head), LeCun-normal."""
    stride = self.config.compression
    if self.config.key_conv == "full":
      init = nn.initializers.lecun_normal(in_axis=(0, 1, 2), out_axis=(3, 4))
      return self.param("key_kernel", init, (stride, heads, dim, heads, dim), jnp.float32)
    init = nn.initializers.lecun_normal(in_axis=(1, 2), out_axis=3, batch_axis=(0,))
    return self.param("key_kernel", init, (heads, stride, dim, dim), jnp.float32)

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length, heads, dim = query.shape
    stride = cfg.compression
    mask = _common.default_mask(mask, batch, length)
    real = mask[:, :, None, None]
    key, value = (jnp.where(real, x, jnp.zeros((), x.dtype)) for x in (key, value))
    key, value, mask = (_common.pad_axis(x, stride, axis=1) for x in (key, value, mask))
    slots = mask.shape[1] // stride
    value_filter = self.param("value_filter", nn.initializers.constant(1.0 / stride), (heads, stride),
                              jnp.float32)
    memory_keys = compress_keys(key, self.key_kernel(heads, dim), stride)                  # [B, C, H, D]
    memory_values = compress_values(value, value_filter, stride)                           # [B, C, H, V]
    slot_real = jnp.any(mask.reshape(batch, slots, stride), axis=-1)                         # [B, C]
    allowed = slot_real[:, None, None, :]                                                    # [B, 1, 1, C]
    if cfg.causal:
      window_end = jnp.arange(slots) * stride + stride - 1
      allowed = allowed & (window_end[None, :] <= jnp.arange(length)[:, None])[None, None]
    logits = _common.dot_logits(query, memory_keys, "blhd,bchd->bhlc")                       # [B, H, L, C]
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    out = _common.masked_attention(logits, allowed, memory_values, "bhlc,bchv->bhlv", drop)
    return jnp.einsum("bhlv->blhv", out)
