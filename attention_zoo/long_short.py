"""Long-Short Transformer (Zhu et al. 2021): sliding-window attention plus a dynamic low-rank projection
of the keys and values, with one softmax over both. O(L·(2w + r)·(D + V)) time and memory.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
segments of ``w`` queries (``Q`` query inside a segment), ``W`` the w + 2e window keys of a segment
(e = max(⌊w/2⌋, 1)), ``R`` the r projected slots (landmarks), ``C`` = H·D (all heads' key channels).

Short-term attention (NVIDIA transformer-ls ``sliding_chunks_matmul_qk_v2``): the queries of segment n
(positions [n·w, (n+1)·w)) attend the keys in [n·w − e, (n+1)·w + e). Long-term attention: a learned
``dconv_fc`` scores every position for every head and slot, ``P = softmax_L(scores)`` [B, L, H, R] over
the real positions, and the r projected keys/values are ``K̄ = Pᵀ K``, ``V̄ = Pᵀ V``. DualLN: the window
keys are ``LN_l(K)`` and the projected keys ``LN_s(Pᵀ LN_l(K))``, two layer norms over all heads'
channels (C) with their own scale and bias. Each query takes ONE softmax over [window keys ; r projected
keys] (``_common.joint_masked_attention``); rows are non-negative and sum to 1 (P is a softmax).

Causal (segment-wise dynamic projection, as the paper's autoregressive model): the window keeps j ≤ i,
and segment n's projected keys/values compress only the positions of segments < n,
``K̄_n = Σ_{j < n·w} softmax_{j < n·w}(scores) k_j``, computed for all segments at once with a
prefix scan that rescales running sums by a running maximum (no future key changes a past output).

Defaults: ``window_size = 8``, ``num_landmarks = 32`` — "Transformer-LS (w, r) = (8, 32)" of the LRA
scripts (``Transformer-LS-LRA/run_listops.sh``; the paper's best ListOps setting is w = 16, r = 2).

Differences from the reference code (``Transformer-LS-LRA/attention_transformer_ls.py``):

- **Values are not layer-normalised** (upstream applies ``dual_ln_l`` to V and ``dual_ln_s`` to V̄): an
  attention core must be linear in its values, so DualLN acts on the keys only. The window keys and the
  projected keys keep their own norms, which is what DualLN is for (matching the scales of the two key
  families inside the joint softmax).
- The projection scores come from the core's input keys (all heads' channels, before the layer norm)
  through a learned Dense(C → H·r) instead of from the layer input X through ``dconv_fc`` (a core does
  not see X).
- Queries are scaled by 1/√D inside the logits (upstream scales Q before the product: same values).
- Padded keys are masked in the window and in the projection softmax (as upstream); padded queries give
  finite outputs instead of upstream's zeroed rows. Any length works: the sequence is padded to a
  multiple of w internally (upstream needs L divisible by w).
- No CLS-token path (``cls_from_seq``), no optional depthwise convolution of V (``conv_kernel_size``,
  off in the LRA scripts) and no fp32 switch (the softmax always runs in float32 or wider).
- Attention dropout drops unnormalised weights (normalised by the undropped sum): unbiased.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _blocks, _common
from attention_zoo.registry import AttentionConfig, peak_over_prefixes, register_attention


@dataclasses.dataclass(frozen=True)
class LongShortConfig(AttentionConfig):
  """Long-Short options.

  Attributes:
    window_size: w, the segment length of the sliding window (keys [n·w − e, (n+1)·w + e)).
    num_landmarks: r, the number of dynamically projected key/value slots per head.
    dual_ln: layer-normalise window keys and projected keys separately (DualLN, keys only).
    ln_epsilon: epsilon of both layer norms (PyTorch's default 1e-5).
  """

  family = "sparse"
  window_size: int = 8
  num_landmarks: int = 32
  dual_ln: bool = True
  ln_epsilon: float = 1e-5

  def __post_init__(self):
    if self.window_size < 1 or self.num_landmarks < 1:
      raise ValueError("long_short window_size and num_landmarks must be >= 1")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """H·r·(2D + 2) + 2·H·D·(the most over t ≤ L of min(t, e + t mod w)): the projection's running
    sums over the finished segments (Σ w·k, Σ w·v, Σ w and the running max, per head and slot) and the
    raw keys/values of the window, e = max(⌊w/2⌋, 1) before the current segment plus its past part."""
    size, ext = self.window_size, window_extension(self.window_size)
    window = peak_over_prefixes(length, size, lambda t: min(t, ext + t % size))
    return num_heads * self.num_landmarks * (2 * head_dim + 2) + 2 * num_heads * head_dim * window


def window_extension(window_size: int) -> int:
  """e = max(⌊w/2⌋, 1): window keys reach e positions beyond each side of the segment."""
  return max(window_size // 2, 1)


def window_positions(num_segments: int, window_size: int) -> np.ndarray:
  """int [N, W]: key positions n·w − e + t, t < w + 2e (may fall outside [0, N·w))."""
  ext = window_extension(window_size)
  return (np.arange(num_segments)[:, None] * window_size - ext
          + np.arange(window_size + 2 * ext)[None, :])


def gather_windows(x: jax.Array, positions: np.ndarray) -> jax.Array:
  """[B, N·w, ...] -> [B, N, W, ...] at ``positions`` (zero / False outside the sequence)."""
  ext = -int(positions.min())
  padded = jnp.pad(x, [(0, 0), (ext, ext)] + [(0, 0)] * (x.ndim - 2))
  return jnp.take(padded, positions + ext, axis=1)


def prefix_projection(scores: jax.Array, keys: jax.Array, values: jax.Array, size: int):
  """Causal segment-wise projection: for each segment n, softmax over positions j < n·w of ``scores``
  [B, L, H, R] applied to ``keys`` [B, L, H, D] and ``values`` [B, L, H, V] (padded scores NEG_INF).
  Returns (K̄ [B, N, R, H, D], V̄ [B, N, R, H, V], any_real [B, N, H, R])."""
  s, k, v = (_blocks.to_blocks(x, size) for x in (scores, keys, values))       # [B, N, w, ...]
  peak = jax.lax.stop_gradient(jnp.max(s, axis=2))                           # [B, N, H, R]
  peak = jnp.where(peak > 0.5 * _common.NEG_INF, peak, 0.0)
  weights = jnp.exp(s - peak[:, :, None])                                    # [B, N, w, H, R]
  state = (peak, jnp.einsum("bnlhr,bnlhd->bnrhd", weights, k),
           jnp.einsum("bnlhr,bnlhv->bnrhv", weights, v), jnp.sum(weights, axis=2))

  def combine(a, b):
    top = jnp.maximum(a[0], b[0])
    fa, fb = jnp.exp(a[0] - top), jnp.exp(b[0] - top)                       # [B, N, H, R]
    per_slot = lambda x, f: jnp.einsum("bnrhx,bnhr->bnrhx", x, f)
    return top, per_slot(a[1], fa) + per_slot(b[1], fb), per_slot(a[2], fa) + per_slot(b[2], fb), \
        a[3] * fa + b[3] * fb

  _, k_sum, v_sum, total = jax.lax.associative_scan(combine, state, axis=1)
  shift = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)  # exclusive
  k_sum, v_sum, total = shift(k_sum), shift(v_sum), shift(total)
  inv = 1.0 / jnp.where(total > 0, total, 1.0)
  return (jnp.einsum("bnrhd,bnhr->bnrhd", k_sum, inv), jnp.einsum("bnrhv,bnhr->bnrhv", v_sum, inv),
          total > 0)


@register_attention("long_short", LongShortConfig)
class LongShortAttention(nn.Module):
  """Sliding window + dynamic projection, one softmax; see the module docstring."""

  config: LongShortConfig

  def layer_norm(self, x: jax.Array, name: str) -> jax.Array:
    """LayerNorm over all heads' channels of ``x`` [..., H, D] (identity when ``dual_ln`` is off)."""
    if not self.config.dual_ln:
      return x
    flat = x.reshape(*x.shape[:-2], -1)
    return nn.LayerNorm(epsilon=self.config.ln_epsilon, dtype=x.dtype, name=name)(flat).reshape(x.shape)

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length, heads, _ = query.shape
    mask = _common.default_mask(mask, batch, length)
    size = cfg.window_size
    query, key, value, mask = _blocks.pad_qkv_to_multiple(query, key, value, mask, size)
    dtype = _common.accum_dtype(query, key)
    scores = nn.Dense(heads * cfg.num_landmarks, name="dconv_fc")(key.reshape(*key.shape[:2], -1))
    scores = scores.reshape(*key.shape[:3], cfg.num_landmarks).astype(dtype)    # [B, L, H, R]
    scores = jnp.where(mask[:, :, None, None], scores, _common.NEG_INF)
    key_l = self.layer_norm(key, "dual_ln_l")
    q_seg = _blocks.to_blocks(query, size)                                        # [B, N, Q, H, D]
    value_acc = value.astype(dtype)
    if cfg.causal:
      k_bar, v_bar, real = prefix_projection(scores, key_l.astype(dtype), value_acc, size)
      k_bar = self.layer_norm(k_bar.astype(key.dtype), "dual_ln_s")               # [B, N, R, H, D]
      proj_logits = _common.dot_logits(q_seg, k_bar, "bnqhd,bnrhd->bhnqr")
      proj_allowed = jnp.einsum("bnhr->bhnr", real)[:, :, :, None, :]
      proj_contract = _common.contraction("bhnqr,bnrhv->bhnqv", v_bar.astype(value.dtype))
    else:
      probs = jax.nn.softmax(scores, axis=1) * mask[:, :, None, None]           # [B, L, H, R]
      k_bar = self.layer_norm(jnp.einsum("blhr,blhd->brhd", probs, key_l.astype(dtype)).astype(key.dtype),
                              "dual_ln_s")                                       # [B, R, H, D]
      v_bar = jnp.einsum("blhr,blhv->brhv", probs, value_acc)
      proj_logits = _common.dot_logits(q_seg, k_bar, "bnqhd,brhd->bhnqr")
      proj_allowed = jnp.any(mask, axis=1)[:, None, None, None, None]
      proj_contract = _common.contraction("bhnqr,brhv->bhnqv", v_bar.astype(value.dtype))

    positions = window_positions(query.shape[1] // size, size)                  # [N, W]
    win_logits = _common.dot_logits(q_seg, gather_windows(key_l, positions), "bnqhd,bnwhd->bhnqw")
    win_allowed = gather_windows(mask, positions)[:, None, :, None, :]           # [B, 1, N, 1, W]
    if cfg.causal:
      q_pos = np.arange(query.shape[1]).reshape(-1, size)
      win_allowed = win_allowed & (positions[:, None, :] <= q_pos[:, :, None])
    out = _common.joint_masked_attention([
        (win_logits, win_allowed,
         _common.contraction("bhnqw,bnwhv->bhnqv", gather_windows(value, positions))),
        (proj_logits, proj_allowed, proj_contract),
    ], _common.dropout_callback(cfg.dropout_rate, deterministic))                 # [B, H, N, Q, V]
    out = jnp.transpose(out, (0, 2, 3, 1, 4)).astype(value.dtype)
    return _blocks.from_blocks(out)[:, :length]
