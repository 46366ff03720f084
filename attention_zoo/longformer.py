"""Longformer sliding-window attention (Beltagy et al. 2020) with optional global tokens. O(L·w) cost.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``E`` projected head dim
of the global queries/keys (= D), ``V`` value dim, ``N`` query blocks of ``S`` positions (``Q`` query
position inside a block), ``K`` keys gathered per query block (the 3·S keys of the previous, own and
next block; 2·S when causal), ``G`` global positions.

Window ``w`` (``window``): query i sees ``⌈w/2⌉`` keys to its left including itself and ``⌊w/2⌋`` to its
right, i.e. ``i − ⌈w/2⌉ < j ≤ i + ⌊w/2⌋`` (as LRA's ``_build_sliding_window_mask``: for even w the left
side gets one more). Causal: only the left part, ``i − ⌈w/2⌉ < j ≤ i``.

Global tokens (``num_global`` = G, the first G positions, e.g. a CLS position): every query also attends
to the G global keys, and the G global queries attend to every key. As in Longformer (and LRA), the
global rows use their own query/key projections: here learned per-head maps ``W_q, W_k [H, D, E]`` of
the core applied to the model's query/key (initialised to the identity). Non-global rows use the
ordinary q, k, v for window and global keys in one softmax; a global key inside the window is counted
once.

Efficient form (never an L×L mask): the sequence is padded to a multiple of ``S = min(L,
max(⌈w/2⌉ − 1, ⌊w/2⌋, 1))``, so the window of every query in block b lies in key blocks b−1, b, b+1;
these 3·S keys are gathered per query block and masked with the exact band (a static [S, 3S] offset
mask). Causal: ``S = ⌈w/2⌉ − 1`` and only blocks b−1, b (2·S keys). A window longer than the input
simply covers everything (S = L, one block).

``global_local`` is ETC's global-local attention (Ainslie et al. 2020) in this core: one global token
(position 0) and a local window of 128 (``⌈w/2⌉ = 64`` left, 64 right). ETC's relative position
encodings and CPC pre-training are outside the attention core and not part of it.

Differences from LRA ``longformer/longformer_attention.py`` (and allenai/longformer):

- Banded blocks instead of a dense L×L mask (LRA's mask made it quadratic, hence untimed in LRA Table 2).
- Global positions are the first ``num_global`` (a config value; LRA passed no ``global_mask``, so its
  runs were a pure window, as ``num_global=0`` here). The global projections are maps on top of the
  model's q/k (the core owns no input projections); the global rows share the model's values: a
  separate global value projection would make the effective matrix non-stochastic (P·W_v).
- Causal with global tokens raises ``NotImplementedError`` (a global query sees the future by
  definition). LRA ANDed the causal mask into both parts.
- No dilation (neither LRA nor the Hugging Face port has it).
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
class LongformerConfig(AttentionConfig):
  """Longformer options.

  Attributes:
    window: w, the sliding window (LRA: 512): ``⌈w/2⌉`` keys to the left including self, ``⌊w/2⌋`` to
      the right. Any w ≥ 1; a window longer than the input is dense.
    num_global: G, the first G positions are global (own query/key projections, attend to and are
      attended by every position). LRA: 0.
  """

  family = "sparse"
  window: int = 512
  num_global: int = 0
  paper_name = "Longformer"

  def __post_init__(self):
    if self.window < 1:
      raise ValueError("longformer window must be >= 1")
    if self.num_global < 0:
      raise ValueError("longformer num_global must be >= 0")

  @property
  def no_causal_form(self) -> str | None:  # type: ignore[override]
    """Global tokens attend to the whole sequence (causal needs ``num_global=0``)."""
    if self.num_global:
      return "global tokens attend to the whole sequence, future included (causal needs num_global=0)"
    return None

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int | None:
    """2·H·D·min(⌈w/2⌉ − 1, L): the causal window's past keys/values (⌈w/2⌉ keys to the left including
    the query itself); None with global tokens (no causal form)."""
    if self.no_causal_form:
      return None
    return 2 * num_heads * head_dim * min(window_sides(self.window)[0] - 1, length)

  def support(self, length: int) -> np.ndarray:
    """bool [L, L]: the band ``−⌈w/2⌉ < j − i ≤ ⌊w/2⌋`` (``≤ 0`` when causal), global rows/columns."""
    left, right = window_sides(self.window)
    offset = np.arange(length)[None, :] - np.arange(length)[:, None]
    allowed = (offset > -left) & (offset <= (0 if self.causal else right))
    is_global = np.arange(length) < self.num_global
    return allowed | is_global[:, None] | is_global[None, :]


@dataclasses.dataclass(frozen=True)
class GlobalLocalConfig(LongformerConfig):
  """ETC-style global-local attention: one global token (position 0) and a local window of 128."""

  window: int = 128
  num_global: int = 1
  paper_name = None


def window_sides(window: int) -> tuple[int, int]:
  """(left including self, right) = (⌈w/2⌉, ⌊w/2⌋)."""
  return window - window // 2, window // 2


def band_block_size(length: int, window: int, causal: bool = False) -> int:
  """S: the largest one-sided reach of the window (so it fits in blocks b−1..b+1), at most L."""
  left, right = window_sides(window)
  return max(1, min(length, max(left - 1, 0 if causal else right)))


def neighbour_blocks(x: jax.Array, size: int, count: int = 3) -> jax.Array:
  """[B, N·S, ...] -> [B, N, count·S, ...]: for block b the positions of blocks b−1, b (and b+1 when
  ``count`` = 3), zeros outside the sequence."""
  num_blocks = x.shape[1] // size
  padded = jnp.pad(x, [(0, 0), (size, size)] + [(0, 0)] * (x.ndim - 2))
  shifted = [_blocks.to_blocks(padded[:, i * size:(i + num_blocks) * size], size) for i in range(count)]
  return jnp.concatenate(shifted, axis=2)


@register_attention("global_local", GlobalLocalConfig)
@register_attention("longformer", LongformerConfig)
class LongformerAttention(nn.Module):
  """Sliding window in banded blocks, plus optional global tokens with their own projections."""

  config: LongformerConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    if cfg.causal and cfg.num_global:
      raise NotImplementedError("longformer: global tokens attend to the whole sequence, so they cannot "
                                "be causal; use num_global=0 with causal=True")
    mask = _common.default_mask(mask, batch, length)
    num_global = min(cfg.num_global, length)
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    out = self._window_rows(query, key, value, mask, num_global, drop)
    if num_global:
      out = out.at[:, :num_global].set(self._global_rows(query, key, value, mask, num_global, drop))
    return out

  def _window_rows(self, query, key, value, mask, num_global, drop):
    """Every row: band keys (global keys excluded) and the G global keys, one softmax. [B, L, H, V]."""
    cfg = self.config
    length = query.shape[1]
    size = band_block_size(length, cfg.window, cfg.causal)
    left, right = window_sides(cfg.window)
    query, key, value, mask = _blocks.pad_qkv_to_multiple(query, key, value, mask, size)
    num_blocks, count = query.shape[1] // size, 2 if cfg.causal else 3   # causal: no next block
    near = lambda x: neighbour_blocks(x, size, count)
    key_pos = (np.arange(num_blocks)[:, None] - 1) * size + np.arange(count * size)   # [N, K]
    offset = np.arange(count * size)[None, :] - size - np.arange(size)[:, None]        # [Q, K]
    band = (offset > -left) & (offset <= (0 if cfg.causal else right))
    allowed = (near(mask)[:, :, None, None, :]                                           # [B, N, 1, 1, K]
               & band[None, :, None, :] & (key_pos >= num_global)[:, None, None, :])   # [N, Q, 1, K]
    q_blocks = _blocks.to_blocks(query, size)                                             # [B, N, Q, H, D]
    logits = _common.dot_logits(q_blocks, near(key), "bnqhd,bnkhd->bnqhk")
    parts = [(logits, allowed, _common.contraction("bnqhk,bnkhv->bnqhv", near(value)))]
    if num_global:
      g_logits = _common.dot_logits(q_blocks, key[:, :num_global], "bnqhd,bghd->bnqhg")
      parts.append((g_logits, mask[:, None, None, None, :num_global],
                    _common.contraction("bnqhg,bghv->bnqhv", value[:, :num_global])))
    out = _common.joint_masked_attention(parts, drop).astype(value.dtype)                # [B, N, Q, H, V]
    return _blocks.from_blocks(out)[:, :length]

  def _global_rows(self, query, key, value, mask, num_global, drop):
    """The G global queries attend to every key with the core's own projections. [B, G, H, V]."""
    heads, dim = query.shape[2:]
    identity = lambda _, shape, dtype=jnp.float32: jnp.broadcast_to(jnp.eye(dim, dtype=dtype), shape)
    w_query = self.param("global_query", identity, (heads, dim, dim)).astype(query.dtype)
    w_key = self.param("global_key", identity, (heads, dim, dim)).astype(key.dtype)
    g_query = jnp.einsum("bghd,hde->bghe", query[:, :num_global], w_query)
    g_key = jnp.einsum("blhd,hde->blhe", key, w_key)
    logits = _common.dot_logits(g_query, g_key, "bghe,blhe->bghl")                       # [B, G, H, L]
    return _common.masked_attention(logits, mask[:, None, None, :], value, "bghl,blhv->bghv", drop)
