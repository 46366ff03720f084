"""RetNet's multi-scale retention (Sun, Dong, Huang, Ma, Xia, Xue, Wang, Wei, "Retentive Network: A Successor to
Transformer for Large Language Models", 2023): linear attention with a fixed per-head exponential decay
γ_h = 1 − 2^(−5−h), rotary position embeddings on q and k, a per-head RMSNorm and a swish output gate.

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``H`` heads, ``K`` key dim per head, ``V`` value dim per
head, ``P`` rotated pairs per head (K/2).

Equations (one layer, input ``x [B, L, D]``; per head the state ``S_t [K, V]``)::

    q_t = RoPE(W_q x_t, n_t)·K^(-1/2),  k_t = RoPE(W_k x_t, n_t)   [B, L, H, K]
    v_t = W_v x_t                                                 [B, L, H, V]
    γ_h = 1 − 2^(−5−h),  h = 0..H−1                                [H]   (fixed, not trained)
    S_t = γ_h S_{t-1} + k_t v_t^T                                 (fla's [K, V] state)
    o_t = S_t^T q_t                                               [B, L, H, V]
    y_t = W_o (RMSNorm_V(o_t) ⊙ w_norm ⊙ swish(W_g x_t))          [B, L, D]

RoPE (GPT-NeoX "rotate half" layout, base 10000): with θ_p = 10000^(−2p/K), p = 0..P−1, and the halves
a = z[:P], b = z[P:2P] of a head's vector z at position n_t: RoPE(z, n) = [a cos nθ − b sin nθ, a sin nθ +
b cos nθ, z[2P:]]. ``n_t`` is the index of token t among the real tokens of its row (the count of real tokens
before it), as fla's unpadded (``cu_seqlens``) call numbers them.

The recurrence is the shared engine's (``attention_zoo.mixers._linear_recurrence.linear_recurrence``, decay kind
"fixed per head"): ``mode="chunk"`` its chunked-parallel form, ``mode="recurrent"`` its token-by-token scan.
Computed in float32 (float64 for float64 inputs); the output is cast back to the input's dtype.

Defaults and initialisation, from fla-org/flash-linear-attention (read at bc3b101):

- ``fla/layers/multiscale_retention.py`` ``MultiScaleRetention``: expand_k 1.0, expand_v 2.0, num_heads 8,
  feature_map None, use_short_conv False, use_output_gate True, gate_fn swish, elementwise_affine True, norm_eps
  1e-5, fuse_norm True (``FusedRMSNormGated`` over the head's value dim, one weight [V] shared by the heads),
  projections without bias, ``RotaryEmbedding(dim=head_k_dim)`` on q and k.
- ``fla/modules/rotary.py`` ``RotaryEmbedding``: base 10000, not interleaved (rotate half), no xPos scale
  (``scale_base`` None), inv_freq = 1 / base^(arange(0, K, 2)/K).
- ``fla/ops/retention/chunk.py`` / ``fused_recurrent.py`` / ``naive.py``: the decays
  ``log γ = log(1 − 2^(−5 − arange(H)))`` (one per head index) and the scale K^(-1/2); ``naive_retention`` is the
  parallel form the tests transcribe (o = ((q K^(-1/2)) k^T ⊙ Γ) v, Γ_ij = γ^(i−j) for j ≤ i).
- ``fla/models/retnet/modeling_retnet.py`` ``_init_weights``: every Linear weight ~ N(0, 0.02²); the norm's
  weight 1.

Head count (``num_heads`` is a maximum): key dim ``int(D·expand_k)`` and value dim ``int(D·expand_v)`` must
split into equal heads, so H is the largest h <= num_heads dividing both, preferring an even K (RoPE rotates
pairs): 8 heads at d_model 16, 64, 128, 512 (K = 2, 8, 16, 64). The decays are those of head indices 0..H−1 (γ_0 =
0.96875 ... γ_7 ≈ 0.99976), so a width with fewer heads keeps the faster-forgetting ones.
With an odd K (only when no head count gives an even one) the last channel is not rotated.

Bidirectional (``causal=False``, the LRA default): the engine's two passes over the same q, k, v, γ: a forward
pass reading S_t and a backward pass over the reversed sequence reading before its write, so token t is counted
once: o_i = Σ_j γ_h^|i−j| (q_i·k_j) v_j over the real tokens (LION-D's fixed-decay form with RetNet's γ and RoPE,
Afzal et al. 2025).

Differences from the original:

- The bidirectional form (above) is not in fla or in the paper (retention is causal); ``causal=True`` is fla's
  layer.
- Padding: a padded position (mask False) neither decays nor writes the state in either direction, its output is
  0, and RoPE positions count real tokens only, so real outputs do not depend on the number, place (padding inside
  a row included) or content of padded positions; fla unpads through ``cu_seqlens`` (same outputs at real
  positions).
- ``num_heads`` is a maximum (derived to divide, above); fla asserts divisibility. An odd K leaves its last
  channel unrotated (fla's kernel requires an even rotary dim).
- The paper's xPos (RoPE with a per-channel length scaling, torchscale's ``XPOS``) is fla's plain RoPE here, as in
  fla's layer.
- Dropout: fla's layer has none; ``config.dropout_rate`` is applied to the layer's output only.
- ``use_short_conv`` (off, as fla's default): fla's width-4 causal depthwise convolutions, then SiLU, on the q, k
  and v projections before RoPE; the rows are packed (real tokens first, in order, as fla's unpadding) so each
  window holds the previous real tokens, and the convolutions stay causal when ``causal=False``. Parameters
  ``q_conv1d``/``k_conv1d``/``v_conv1d`` N(0, 0.02²) (fla's ``_init_weights`` covers ``nn.Conv1d``).
- Left out: fla's options ``num_kv_heads``, ``feature_map``, a non-swish ``gate_fn`` /
  ``fuse_norm=False``, and the model-level ``prenorm_residual_strategy`` rescaling of ``o_proj``.
- Parameters are created in the compute dtype (float32; float64 for float64 inputs). Initialisation uses fla's
  model-level ``_init_weights`` (N(0, 0.02²)); a bare fla layer would keep PyTorch's default Linear init.

State for causal generation (``state_size``): H·K·V floats per example and layer (RoPE needs only the position
counter, which is not counted, as in Zoology); with the defaults H·(D/H)·(2D/H) = 2D²/H (H = 8 at widths divisible
by 8); with ``use_short_conv`` also the convolutions' last W − 1 inputs, (W − 1)·H·(2K + V).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo.mixers._layer_common import (QKVConvStateSize, check_mode, fla_short_convs, common_heads, finish,
                                                fla_gated_output, fla_heads, gather, layer_input, pack, recurrence)
from attention_zoo.registry import MixerConfig, register_mixer


def retention_log_decay(heads: int) -> np.ndarray:
  """log γ_h = log(1 − 2^(−5−h)) for h = 0..heads−1 (float64 numpy)."""
  return np.log1p(-np.exp2(-5.0 - np.arange(heads, dtype=np.float64)))


def rotary(z: jax.Array, positions: jax.Array, base: float) -> jax.Array:
  """RoPE, rotate-half layout: z [B, L, H, K], positions [B, L] -> [B, L, H, K] (module docstring)."""
  k_dim = z.shape[-1]
  pairs = k_dim // 2
  inv_freq = 1.0 / base ** (jnp.arange(0, 2 * pairs, 2, dtype=z.dtype) / k_dim)        # [P]
  angle = positions.astype(z.dtype)[..., None, None] * inv_freq                        # [B, L, 1, P]
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  a, b, rest = z[..., :pairs], z[..., pairs:2 * pairs], z[..., 2 * pairs:]
  return jnp.concatenate([a * cos - b * sin, a * sin + b * cos, rest], axis=-1)


@dataclasses.dataclass(frozen=True)
class RetNetConfig(QKVConvStateSize, MixerConfig):
  """Multi-scale retention options (defaults: fla ``fla/layers/multiscale_retention.py``).

  Attributes:
    expand_k: key dim = int(d_model·expand_k) (all heads).
    expand_v: value dim = int(d_model·expand_v) (all heads).
    num_heads: the most heads; the layer uses the largest count ≤ this dividing both dims (even K preferred).
    rope_base: the RoPE base (fla's ``RotaryEmbedding`` default).
    use_output_gate: RMSNorm ⊙ swish(W_g x) (True) or RMSNorm only.
    norm_eps: the RMSNorm's epsilon.
    use_short_conv, conv_size, conv_bias: fla's optional causal depthwise convolutions (then SiLU) on q, k, v
      (off by default, as fla's).
    mode: "chunk" (chunked-parallel, training default) or "recurrent" (token-by-token scan, the reference).
    chunk_size: the chunk length of mode "chunk".
  """

  expand_k: float = 1.0
  expand_v: float = 2.0
  num_heads: int = 8
  rope_base: float = 10000.0
  use_output_gate: bool = True
  norm_eps: float = 1e-5
  use_short_conv: bool = False
  conv_size: int = 4
  conv_bias: bool = False
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "RetNet"
  family: ClassVar[str] = "linear-recurrent"

  def __post_init__(self):
    check_mode("RetNet", self.mode)
    if self.num_heads < 1 or self.chunk_size < 1 or self.conv_size < 1:
      raise ValueError("RetNet: num_heads, chunk_size and conv_size must be positive")

  def dims(self, d_model: int) -> tuple[int, int, int]:
    """(H, K, V): heads and per-head key / value dims at width ``d_model``."""
    key_dim = max(1, int(d_model * self.expand_k))
    value_dim = max(1, int(d_model * self.expand_v))
    heads = common_heads(self.num_heads, key_dim, value_dim, even=key_dim)
    return heads, key_dim // heads, value_dim // heads


@register_mixer("retnet", RetNetConfig)
class RetNet(nn.Module):
  """Multi-scale retention (module docstring): x [B, L, D], mask [B, L] -> [B, L, D] in x's dtype."""

  config: RetNetConfig

  @nn.compact
  def __call__(self, x, mask=None, deterministic=True):
    cfg = self.config
    d_model = x.shape[-1]
    heads, k_dim, v_dim = cfg.dims(d_model)
    dtype, mask, u = layer_input(x, mask)
    if cfg.use_short_conv:  # real tokens first, so each window holds the previous real tokens (as fla's unpadding)
      u, real, dest = pack(u, mask)
    else:
      real = mask
    positions = jnp.cumsum(real, axis=1) - 1                                             # [B, L] real-token index

    q, k, v = fla_heads(u, dtype, heads, q_proj=k_dim, k_proj=k_dim, v_proj=v_dim)   # [B, L, H, K|K|V]
    if cfg.use_short_conv:  # fla's ShortConvolution (SiLU) on each projection, before RoPE
      q, k, v = fla_short_convs(cfg, q=q, k=k, v=v)
    q, k = rotary(q, positions, cfg.rope_base), rotary(k, positions, cfg.rope_base)
    log_decay = jnp.asarray(retention_log_decay(heads), dtype)                          # [H]

    o = recurrence(cfg, q * k_dim ** -0.5, k, v, real, log_decay=log_decay)                   # [B, L, H, V]
    y = fla_gated_output(self, o, u, d_model, dtype, cfg.norm_eps, cfg.use_output_gate)
    if cfg.use_short_conv:
      y = gather(y, dest)
    return finish(y, mask, x.dtype, cfg.dropout_rate, deterministic)
