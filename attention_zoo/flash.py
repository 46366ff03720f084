"""Exact softmax attention through a fused kernel: ``jax.nn.dot_product_attention`` (or Pallas).

Axis legend: ``B`` batch, ``L`` length, ``Q`` query positions, ``K`` key positions, ``H`` heads, ``D``
query/key head dim, ``V`` value dim, ``F`` the common feature width the Pallas kernel needs.

The same function as ``vanilla`` (softmax(q kᵀ/√D) v over the allowed keys, O(L²) FLOPs: slope ≈ 2), the
exact baseline users compare efficient attentions against today. ``implementation`` picks the kernel:

- ``None`` (default): whatever ``jax.nn.dot_product_attention`` chooses. In JAX 0.10 that is ALWAYS its
  XLA path (the library leaves automatic cuDNN selection as a TODO), on every backend.
- ``"xla"``: XLA's dense attention (materializes the [B, H, Q, K] logits; XLA may fuse the softmax).
- ``"cudnn"``: cuDNN's fused flash-attention kernel; NVIDIA GPUs only, float16/bfloat16 inputs only,
  head dim ≤ 256 (Hopper) or ≤ 128 and a multiple of 8, even lengths when training with a mask/bias;
  JAX raises otherwise (cuDNN itself takes V ≠ D only on Hopper with cuDNN ≥ 9.10; this core always
  passes V = D, see below).
- ``"pallas"``: the Pallas GPU flash-attention kernel (``jax.experimental.pallas.ops.gpu.attention``,
  Triton). Never a silent default. Raises ``NotImplementedError`` off GPU unless ``pallas_interpret``
  (the Pallas interpreter: any backend, very slow, for tests only).

Padding. The key mask is a general bool [B, L] (LRA's image tasks mask black pixels in the middle of the
sequence), so it is passed as ``mask=`` [B, 1, 1, K] (the XLA path broadcasts it; exactly zero weight on
masked keys). ``key_value_seq_lengths`` only expresses a real PREFIX followed by padding; ``padding=
"lengths"`` uses it (number of real tokens) and is correct only for trailing padding — it exists because
cuDNN takes a bias only with the full [Q, K] extent, so ``padding="mask"`` under cuDNN materializes a
[B, 1, L, L] additive bias (O(L²) memory again), while lengths need none. The Pallas kernel expresses
the general mask with segment ids (real tokens segment 1, padding segment 0). Outputs of padded queries
are set to zero, so rows of fully padded examples are finite whatever the kernel does with them.

Dropout. Fused kernels here have no attention dropout. With ``dropout_rate > 0`` in training
(``deterministic=False``) the call falls back to the explicit ``vanilla`` core (same function, inverted
dropout on the probabilities from the ``"dropout"`` stream); evaluation always uses the fused path.

What CPU numbers can and cannot say: on CPU only the XLA path runs (``None`` and ``"xla"``; ``"cudnn"``
raises, ``"pallas"`` needs the interpreter): XLA's dense attention, same O(L²) FLOPs and memory as
``vanilla``, no fusion benefit, so CPU timings of ``flash`` measure nothing about
flash attention. Its advantage is memory traffic on GPU/TPU: the fused kernel never writes the L×L
probabilities to HBM (O(L) extra memory, fewer bytes moved), which is where it beats most "efficient"
attentions in wall time up to several thousand tokens. Those claims need GPU runs with
``implementation="cudnn"`` or ``"pallas"`` and half-precision inputs. The cuDNN and native Pallas paths
are not exercised by the CPU test suite; the Pallas kernel is tested through its interpreter.

Differences from ``jax.nn.dot_product_attention`` used directly (and from ``vanilla``):

- Padded query rows are zeroed (``vanilla`` lets them attend to the real keys; real rows are equal).
- Training dropout falls back to the explicit ``vanilla`` path (above).
- The kernels need V = D: query/key and value are zero-padded to one head width max(D, V) (the Pallas
  path: a power of two ≥ 16, and the length to a multiple of its block size in the padding segment),
  with the scale kept at 1/√D. This changes no real output, only costs the padded columns.
- The XLA path always runs its softmax in float32, so float64 inputs give float32-accurate results
  (``vanilla`` keeps float64); tests compare the two at float32 tolerance.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention
from attention_zoo.vanilla import VanillaAttention, VanillaConfig

IMPLEMENTATIONS = (None, "xla", "cudnn", "pallas")


@dataclasses.dataclass(frozen=True)
class FlashConfig(AttentionConfig):
  """Fused exact attention options.

  Attributes:
    implementation: None (JAX's choice: XLA in JAX 0.10), "xla", "cudnn" or "pallas" (see module doc).
    padding: "mask" (general key mask, default) or "lengths" (``key_value_seq_lengths``; correct only
      when every example's real tokens precede its padding). Ignored by "pallas" (segment ids).
    pallas_interpret: run the Pallas kernel in the interpreter (any backend; tests only, very slow).
  """

  family = "exact"
  implementation: str | None = None
  padding: str = "mask"
  pallas_interpret: bool = False

  def __post_init__(self):
    if self.implementation not in IMPLEMENTATIONS:
      raise ValueError(f"flash implementation must be one of {IMPLEMENTATIONS}, got {self.implementation!r}")
    if self.padding not in ("mask", "lengths"):
      raise ValueError(f"flash padding must be 'mask' or 'lengths', got {self.padding!r}")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·L: exact attention, the keys and values of every past position (the KV cache)."""
    return 2 * num_heads * head_dim * length

  def support(self, length: int) -> np.ndarray:
    """Every pair (exact attention), or j ≤ i when causal."""
    full = np.ones((length, length), bool)
    return np.tril(full) if self.causal else full


def _next_pow2(n: int, minimum: int = 16) -> int:
  return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def pallas_attention(query, key, value, mask, causal: bool, interpret: bool) -> jax.Array:
  """Pallas GPU flash attention with a general key mask (segment ids): [B, L, H, D|V] -> [B, L, H, V].

  Pads L to a multiple of the block size (padded positions in the padding segment) and the head dims to
  one power of two F ≥ 16 with zeros (zero features change no dot product; zero value columns are cut).
  """
  from jax.experimental.pallas.ops.gpu import attention as pallas_gpu  # GPU-only module, import lazily

  if jax.default_backend() != "gpu" and not interpret:
    raise NotImplementedError("flash implementation='pallas' needs a GPU (Triton kernel); "
                              "pallas_interpret=True runs it in the interpreter")
  length, head_dim, value_dim = query.shape[1], query.shape[-1], value.shape[-1]
  block = min(128, _next_pow2(length))
  query, key, value = (_common.pad_axis(x, block, axis=1)
                       for x in common_width(query, key, value, _next_pow2(max(head_dim, value_dim))))
  segments = _common.pad_axis(mask, block, axis=1, value=False).astype(jnp.int32)     # [B, L']
  sizes = pallas_gpu.BlockSizes(block_q=block, block_k=block, block_q_dkv=block, block_kv_dkv=block,
                                block_q_dq=block, block_kv_dq=block)
  out = pallas_gpu.mha(query, key, value, segments, sm_scale=1.0 / math.sqrt(head_dim),
                       causal=causal, block_sizes=sizes, interpret=interpret)
  return out[:, :length, :, :value_dim]


def common_width(query, key, value, width: int | None = None):
  """Zero-pads the head dims of query/key [B, L, H, D] and value [B, L, H, V] to one width F (default
  max(D, V)): the kernels need V = D. Zero features change no dot product; extra value columns are 0."""
  width = width or max(query.shape[-1], value.shape[-1])
  return tuple(jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])]) for x in (query, key, value))


@register_attention("flash", FlashConfig)
class FlashAttention(nn.Module):
  """softmax(q kᵀ/√D + mask) v through a fused kernel (explicit ``vanilla`` path for training dropout)."""

  config: FlashConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    if cfg.dropout_rate > 0.0 and not deterministic:
      explicit = VanillaAttention(VanillaConfig(causal=cfg.causal, dropout_rate=cfg.dropout_rate))
      return explicit(query, key, value, mask, deterministic=False)
    if cfg.implementation == "pallas":
      out = pallas_attention(query, key, value, mask, cfg.causal, cfg.pallas_interpret)
    else:
      out = self._fused(query, key, value, mask)
    return jnp.where(mask[:, :, None, None], out, 0).astype(value.dtype)   # [B, Q, H, V]

  def _fused(self, query, key, value, mask):
    """``jax.nn.dot_product_attention`` with the key mask as ``mask=`` or ``key_value_seq_lengths``."""
    cfg = self.config
    batch, length, _, value_dim = value.shape
    padding = {}
    if cfg.padding == "lengths":
      padding["key_value_seq_lengths"] = jnp.sum(mask, axis=1, dtype=jnp.int32)    # [B]
    else:
      keys = mask[:, None, None, :]                                                 # [B, 1, 1, K]
      if cfg.implementation == "cudnn":   # cuDNN takes a bias only with the full [Q, K] extent
        keys = jnp.broadcast_to(keys, (batch, 1, length, length))
      padding["mask"] = keys
    dtype, scale = jnp.result_type(query, key, value), 1.0 / math.sqrt(query.shape[-1])
    query, key, value = common_width(*(x.astype(dtype) for x in (query, key, value)))
    out = jax.nn.dot_product_attention(query, key, value, scale=scale,
                                       is_causal=cfg.causal, implementation=cfg.implementation,
                                       **padding)
    return out[..., :value_dim]
