"""Local attention: softmax inside non-overlapping blocks of ``block_size`` tokens. O(L·S) cost.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
groups (blocks), ``S`` tokens per group (``Q`` query / ``K`` key position inside a group).

The (internally padded) sequence of ``L' = N·S`` positions is cut into N groups of S tokens and every
query attends, with one softmax, to the keys of its own group only (ANDed with the key padding mask,
and with ``j ≤ i`` inside the group when causal). Two groupings:

- ``grouping="contiguous"`` (default): group ``⌊t/S⌋``, i.e. blocks of consecutive tokens, as the
  paper (Tay et al. 2021, "Local Attention") describes. ``L'`` = L rounded up to a multiple of S.
- ``grouping="lra_strided"``: what the LRA code (``local/local_attention.py``) computes and therefore
  what LRA Table 1 measured. It reshapes ``[B, L', ...]`` to ``[B, S, N, ...]`` and attends over the
  axis of size S, so a group holds the tokens ``t ≡ r (mod N)`` (stride N, not consecutive). LRA also
  always pads by ``S − (L mod S)`` tokens (a whole extra block when S divides L), which changes N and
  hence the grouping; this mode reproduces that padding so the groups are LRA's.

Differences from LRA ``local_attention.py``:

- Default grouping is contiguous (see above); ``"lra_strided"`` gives LRA's groups.
- Block size: ``block_size=50``, the value ``LocalTransformerEncoder`` passes, which LRA ran on ListOps,
  Text and Retrieval; its Image and Pathfinder configs set 64 (``image/configs/cifar10/local_base.py``,
  ``image/configs/pathfinder32/local_base.py``, forwarded by ``image/train.py``). The attention
  module's own default of 20 is never reached in LRA. The ``lra`` protocol preset (``configs/lra.py``)
  passes the per-task size with ``grouping="lra_strided"``.
- Padding is masked per group. LRA cut its padding mask into *contiguous* blocks while its attention
  groups were strided, so each group was masked with another block's padding pattern (and its own
  alignment padding was filled with -1e9 in a float mask whose products decide what is allowed).
- Causal (``causal=True``): causal inside each group. LRA's causal branch built an L×L mask that does not
  fit its blocked logits (marked untested there).
- Attention dropout drops unnormalised weights with the normalizer kept (inverted, unbiased); LRA
  dropped normalised probabilities, which is equivalent in expectation.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _blocks, _common
from attention_zoo.registry import AttentionConfig, register_attention

GROUPINGS = ("contiguous", "lra_strided")


@dataclasses.dataclass(frozen=True)
class LocalConfig(AttentionConfig):
  """Local attention options.

  Attributes:
    block_size: S, tokens per group (LRA: 50; 64 on Image and Pathfinder).
    grouping: ``"contiguous"`` (blocks of consecutive tokens, default) or ``"lra_strided"`` (LRA's
      reshape: tokens ``t ≡ r mod N`` grouped, with LRA's always-at-least-one-token padding).
  """

  family = "sparse"
  block_size: int = 50
  grouping: str = "contiguous"
  paper_name = "Local Attention"

  def __post_init__(self):
    if self.block_size < 1:
      raise ValueError("local block_size must be >= 1")
    if self.grouping not in GROUPINGS:
      raise ValueError(f"local grouping must be one of {GROUPINGS}, got {self.grouping!r}")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·min(S − 1, L) contiguous: the keys/values of the current block's past positions (at most
    S − 1; the buffer empties at each block boundary); 2·H·D·L for ``lra_strided``: the groups are the
    residues mod N, which every later stretch of N positions visits again, so no past key expires."""
    if self.grouping == "lra_strided":
      return 2 * num_heads * head_dim * length
    return 2 * num_heads * head_dim * min(self.block_size - 1, length)

  def support(self, length: int) -> np.ndarray:
    """bool [L, L]: same group (and j ≤ i when causal)."""
    group = group_index(length, self.block_size, self.grouping)
    allowed = group[:, None] == group[None, :]
    return allowed & np.tril(np.ones_like(allowed)) if self.causal else allowed


def padded_length(length: int, block_size: int, grouping: str) -> int:
  """L' = N·S: L rounded up to a multiple of S (LRA's strided mode always adds S − L mod S)."""
  if grouping == "lra_strided":
    return length + block_size - length % block_size
  return -(-length // block_size) * block_size


def group_index(length: int, block_size: int, grouping: str) -> np.ndarray:
  """int [L]: the group of every position (``t // S`` contiguous, ``t mod N`` strided)."""
  positions = np.arange(length)
  if grouping == "lra_strided":
    return positions % (padded_length(length, block_size, grouping) // block_size)
  return positions // block_size


def to_groups(x: jax.Array, block_size: int, grouping: str) -> jax.Array:
  """[B, L', ...] -> [B, N, S, ...] (L' already padded): contiguous blocks or LRA's strided groups."""
  if grouping == "contiguous":
    return _blocks.to_blocks(x, block_size)
  strided = x.reshape(x.shape[0], block_size, x.shape[1] // block_size, *x.shape[2:])  # [B, S, N, ...]
  return jnp.swapaxes(strided, 1, 2)


def from_groups(x: jax.Array, grouping: str) -> jax.Array:
  """Inverse of :func:`to_groups`: [B, N, S, ...] -> [B, L', ...]."""
  return _blocks.from_blocks(x if grouping == "contiguous" else jnp.swapaxes(x, 1, 2))


@register_attention("local", LocalConfig)
class LocalAttention(nn.Module):
  """Softmax inside non-overlapping groups of S tokens (contiguous or LRA-strided)."""

  config: LocalConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    size = cfg.block_size
    extra = padded_length(length, size, cfg.grouping) - length
    query, key, value = (jnp.pad(x, [(0, 0), (0, extra), (0, 0), (0, 0)]) for x in (query, key, value))
    mask = jnp.pad(mask, [(0, 0), (0, extra)], constant_values=False)
    groups = lambda x: to_groups(x, size, cfg.grouping)
    logits = _common.dot_logits(groups(query), groups(key), "bnqhd,bnkhd->bnqhk")  # [B, N, Q, H, K]
    allowed = groups(mask)[:, :, None, None, :]                                   # [B, N, 1, 1, K]
    if cfg.causal:
      allowed = allowed & _common.causal_allowed(size, size)[:, None, :]          # [Q, 1, K]
    out = _common.masked_attention(logits, allowed, groups(value), "bnqhk,bnkhv->bnqhv",
                                  _common.dropout_callback(cfg.dropout_rate, deterministic))
    return from_groups(out, cfg.grouping)[:, :length]
