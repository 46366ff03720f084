"""Sinkhorn Transformer attention (Tay et al. 2020): learned block sorting. O(L·S·(D + V) + N·L·(D + V)).

Axis legend: ``B`` batch, ``L`` length (padded to ``N·S``), ``H`` heads, ``D`` query/key head dim, ``V``
value dim, ``N`` blocks (``I`` query block, ``J`` key block), ``S`` block size (``Q`` query / ``K``
key slot inside a block), ``M`` outputs of the sort net (blocks seen at init).

1. Cut the sequence into N blocks of S positions (``grouping="contiguous"``; ``"strided"`` = LRA's
   reshape, where block n holds positions n, n + N, n + 2N, ...).
2. Block summary = sum of the block's real keys (causal: the block's first key, so a summary never
   contains a position after any query of its block).
3. A dense sort net (kernel [D, M] shared by the heads, bias [M]; a parameter of this core) maps each
   summary to logits over key blocks, ``R [B, H, I, J]`` (the first N of M outputs).
4. Permutation ``P = softmax_J(R)`` (``sort_activation="softmax"``, the LRA default) or the Sinkhorn
   operator: ``n_iters`` alternating row/column log-normalisations of ``R / temperature``, then exp.
   Key blocks without a real token, query blocks without one, and (causal) key blocks ``J >= I`` are
   masked out of P.
5. The sorted block of query block I: at every slot s, the P-weighted sum of the real keys (and
   values) at slot s of the key blocks, the paper's ``P·K``: ``k̃[I, s] = Σ_J P[I, J] m[J, s] k[J, s]``
   (m = key mask); a slot with no real key in any mixed block is masked. It is not renormalised by
   ``Σ_J P[I, J] m[J, s]``: where P concentrates on a partly padded block that weight tends to 0 during
   training, and dividing by it sent the smoke ListOps run to NaN at step 80. So the rows of the
   effective matrix sum to at most 1 (exactly 1 when no mixed block is partly padded).
6. Each query attends to its own block and to its sorted block with ONE softmax over both
   (``_common.joint_masked_attention``); causal: own block by position, sorted part from earlier blocks.

Sizes: S = ceil(√L) by default, so N ≈ √L and the cost grows like L^1.5 (the N×N sorting matrix mixes
N·L keys). The sort net has M = ``max_num_blocks`` outputs, or the number of blocks at init when that
is None; applying it to an input with more blocks raises ``ValueError``.

Differences from the reference code (LRA ``sinkhorn_transformer/sinkhorn_attention.py``):

- **Grouping**: contiguous blocks by default; LRA's reshape ``[B, L] -> [B, S, N]`` groups positions
  strided (``grouping="strided"`` reproduces it; it has no causal form here, since strided blocks mix
  past and future).
- **Sorted keys**: LRA's ``einsum('bskhd,bnhl->bsnhd')`` sums its two block indices separately, so
  every "sorted" block was the sum of ALL key blocks and the sort net had no effect (P's rows sum to 1);
  here the sorted block is the P-mixture above, over real keys only, so padding takes no weight.
- **One softmax**: LRA ran two separate softmaxes (own block, sorted block) and ADDED the outputs
  (rows summing to 2); here one softmax covers both parts, as in the paper.
- **Padding**: summaries exclude padded keys (LRA summed them), padded keys and values never enter a
  mixture, and blocks without a real token are masked in P. The sequence is padded to a block multiple
  internally (LRA required L to be a multiple of the block size).
- **Sinkhorn operator**: LRA clipped the log-matrix to [−1, 1] before exp (so P's entries lie in
  [e⁻¹, e]); not done here. Causal Sinkhorn balancing would leak the future (column normalisation mixes
  later query blocks; LRA's causal version was an unverified TODO with a broken mask reshape): causal
  works with ``sort_activation="softmax"`` only, else ``NotImplementedError``.
- **Causal**: the summary is the block's first key (what LRA's ``cumsum(...)[:, 0]`` computed) and P
  only mixes earlier blocks (``J < I``); LRA added a position-level causal mask to block logits.
- Defaults: S = ceil(√L) and M = blocks at init (LRA: block 50, ``max_num_blocks`` 25; the Image and
  Pathfinder configs block 64); pass ``block_size=50, grouping="strided"`` for LRA's sizes.

**LRA's code as it ran** (``lra_noop_sort=True``, what the ``lra`` protocol runs, so that its deltas
against LRA's "Sinkhorn Trans." row compare the same computation): every sorted block is the slot-wise
sum of the real keys (values) of ALL blocks, ``k̃[I, s] = Σ_J m[J, s] k[J, s]`` for every I (LRA's
einsum times ``Σ_l P = 1``), and the own-block and sorted-block softmaxes are separate and ADDED (rows
of the effective matrix sum to 2). The sort net is still built (LRA built it) but gets no gradient.
Differences that remain: padding is masked per block (LRA reshaped its padding mask into contiguous
blocks while grouping strided, and summed padded keys into the sorted blocks), the sequence is padded
to a block multiple (LRA required L to be a multiple of S), and it has no causal form
(``NotImplementedError``). ``sort_activation``, ``n_iters`` and ``temperature`` have no effect in it.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _blocks, _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class SinkhornConfig(AttentionConfig):
  """Sinkhorn attention options.

  Attributes:
    block_size: S; ``None`` = ceil(√L).
    max_num_blocks: M, outputs of the sort net; ``None`` = the number of blocks at init.
    sort_activation: ``"softmax"`` (LRA default) or ``"sinkhorn"``.
    n_iters: Sinkhorn row/column normalisation rounds (LRA 1).
    temperature: R is divided by it before the Sinkhorn operator (LRA 1.0).
    grouping: ``"contiguous"`` or ``"strided"`` (LRA's reshape).
    lra_noop_sort: LRA's code as it ran: sorted block = slot-wise sum of all blocks, two softmaxes
      added (module docstring).
  """

  family = "learned-pattern"
  block_size: int | None = None
  max_num_blocks: int | None = None
  sort_activation: str = "softmax"
  n_iters: int = 1
  temperature: float = 1.0
  grouping: str = "contiguous"
  lra_noop_sort: bool = False

  paper_name = "Sinkhorn Trans."
  rows_sum_to_one = False  # at most 1: the sorted block is P·K over real keys, not renormalised

  def __post_init__(self):
    for field, allowed in (("sort_activation", ("softmax", "sinkhorn")),
                           ("grouping", ("contiguous", "strided"))):
      if getattr(self, field) not in allowed:
        raise ValueError(f"sinkhorn {field} must be one of {allowed}, got {getattr(self, field)!r}")
    if (self.block_size is not None and self.block_size < 1) or self.n_iters < 0:
      raise ValueError("sinkhorn block_size must be >= 1 and n_iters >= 0")
    if self.max_num_blocks is not None and self.max_num_blocks < 1:
      raise ValueError("sinkhorn max_num_blocks must be >= 1")
    if self.temperature <= 0:
      raise ValueError("sinkhorn temperature must be > 0")

  @property
  def no_causal_form(self) -> str | None:  # type: ignore[override]
    if self.sort_activation == "softmax" and self.grouping == "contiguous" and not self.lra_noop_sort:
      return None
    return ("causal sinkhorn needs sort_activation='softmax' (Sinkhorn column normalisation mixes later "
            "blocks), grouping='contiguous' (strided blocks mix past and future) and lra_noop_sort=False")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int | None:
    """2·H·D·L: a later query block mixes the keys/values of every earlier block with weights P that
    depend on its own first key, so none can be summarised in advance; None without a causal form."""
    if self.no_causal_form:
      return None
    return 2 * num_heads * head_dim * length


def group(x: jax.Array, size: int, grouping: str) -> jax.Array:
  """[B, N·S, ...] -> [B, N, S, ...]: contiguous blocks, or strided (block n = positions n + N·s)."""
  if grouping == "contiguous":
    return _blocks.to_blocks(x, size)
  return jnp.swapaxes(x.reshape(x.shape[0], size, -1, *x.shape[2:]), 1, 2)


def ungroup(x: jax.Array, grouping: str) -> jax.Array:
  """Inverse of :func:`group`: [B, N, S, ...] -> [B, N·S, ...]."""
  if grouping == "contiguous":
    return _blocks.from_blocks(x)
  return _blocks.from_blocks(jnp.swapaxes(x, 1, 2))


def masked_log_normalize(x: jax.Array, allowed: jax.Array, axis: int) -> jax.Array:
  """``x − logsumexp(x)`` along ``axis`` over allowed entries; disallowed entries -> NEG_INF."""
  peak = jax.lax.stop_gradient(jnp.max(jnp.where(allowed, x, _common.NEG_INF), axis, keepdims=True))
  total = jnp.sum(jnp.exp(jnp.where(allowed, x - peak, _common.NEG_INF)) * allowed, axis, keepdims=True)
  return jnp.where(allowed, x - peak - jnp.log(jnp.where(total > 0, total, 1.0)), _common.NEG_INF)


def sinkhorn_operator(logits: jax.Array, allowed: jax.Array, n_iters: int, temperature: float):
  """exp of ``n_iters`` alternating row (last axis) / column log-normalisations of ``logits / T``
  restricted to ``allowed``: logits [..., I, J] -> approximately doubly stochastic [..., I, J]."""
  x = jnp.where(allowed, logits / temperature, _common.NEG_INF)
  for _ in range(n_iters):
    x = masked_log_normalize(masked_log_normalize(x, allowed, -1), allowed, -2)
  return jnp.exp(x) * allowed


@register_attention("sinkhorn", SinkhornConfig)
class SinkhornAttention(nn.Module):
  """Own block + P-sorted block, one softmax; the sort net is a parameter."""

  config: SinkhornConfig

  def num_sort_outputs(self, num_blocks: int) -> int:
    """M: the stored sort net's width, else ``max_num_blocks`` or this input's block count."""
    if self.has_variable("params", "sort_kernel"):
      return self.get_variable("params", "sort_kernel").shape[-1]
    return self.config.max_num_blocks or num_blocks

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal and (cfg.sort_activation != "softmax" or cfg.grouping != "contiguous"
                       or cfg.lra_noop_sort):
      raise NotImplementedError("causal sinkhorn needs sort_activation='softmax' (Sinkhorn column "
                                "normalisation mixes later blocks), grouping='contiguous' "
                                "(strided blocks mix past and future) and lra_noop_sort=False")
    batch, length, _, dim = query.shape
    mask = _common.default_mask(mask, batch, length)
    size = cfg.block_size or _blocks.sqrt_block_size(length)
    query, key, value, mask = _blocks.pad_qkv_to_multiple(query, key, value, mask, size)
    num_blocks = query.shape[1] // size
    width = self.num_sort_outputs(num_blocks)
    if num_blocks > width:
      raise ValueError(f"sinkhorn: the input has {num_blocks} blocks but the sort net was built for "
                       f"{width} (max_num_blocks / the length at init); use a shorter input or a "
                       "larger max_num_blocks")
    kernel = self.param("sort_kernel", nn.initializers.lecun_normal(), (dim, width), jnp.float32)
    bias = self.param("sort_bias", nn.initializers.zeros, (width,), jnp.float32)
    qb, kb, vb, mb = (group(x, size, cfg.grouping) for x in (query, key, value, mask))
    perm = self.permutation(kb, mb, kernel[:, :num_blocks], bias[:num_blocks])   # [B, H, I, J]
    if cfg.lra_noop_sort:  # LRA's einsum: every sorted block sums all blocks (Σ_l P = 1)
      perm = jnp.ones_like(perm)
    out = _attend(qb, kb, vb, mb, perm, cfg.causal,
                  _common.dropout_callback(cfg.dropout_rate, deterministic),
                  separate=cfg.lra_noop_sort)                                     # [B, N, S, H, V]
    return ungroup(out, cfg.grouping)[:, :length].astype(value.dtype)

  def permutation(self, kb, mb, kernel, bias):
    """P [B, H, I, J] from key blocks kb [B, N, S, H, D], mask mb [B, N, S] and the sort net."""
    cfg = self.config
    acc = _common.accum_dtype(kb)
    real = jnp.where(mb[..., None, None], kb, 0).astype(acc)
    summary = real[:, :, 0] if cfg.causal else jnp.sum(real, axis=2)               # [B, N, H, D]
    logits = jnp.einsum("bihd,dj->bhij", summary, kernel.astype(acc)) + bias.astype(acc)
    nonempty = jnp.any(mb, axis=2)                                                   # [B, N]
    allowed = nonempty[:, None, :, None] & nonempty[:, None, None, :]
    if cfg.causal:
      num = nonempty.shape[1]
      allowed = allowed & (jnp.arange(num)[None, :] < jnp.arange(num)[:, None])
    if cfg.sort_activation == "softmax":
      return _common.masked_softmax(logits, allowed)
    return sinkhorn_operator(logits, allowed, cfg.n_iters, cfg.temperature)


def _attend(qb, kb, vb, mb, perm, causal, dropout, separate=False):
  """Own block + sorted block: qb, kb [B, N, S, H, D], vb [B, N, S, H, V], mb [B, N, S],
  perm [B, H, I, J] -> [B, N, S, H, V]. One softmax over both, or (``separate``, LRA's code) one
  softmax per block with the two outputs added."""
  acc = _common.accum_dtype(kb, perm)
  weight = jnp.einsum("bhij,bjs->bhis", perm, mb.astype(acc))                        # [B, H, I, K]

  def mix(x):
    """P-weighted sum of the real entries at each slot: [B, N, S, H, X] -> [B, N, S, H, X]."""
    real = jnp.where(mb[..., None, None], x, 0).astype(acc)
    return jnp.einsum("bhij,bjshx->bishx", perm, real).astype(x.dtype)

  own_logits = _common.dot_logits(qb, kb, "bnqhd,bnkhd->bhnqk")
  sorted_logits = _common.dot_logits(qb, mix(kb), "bnqhd,bnkhd->bhnqk")
  own_allowed = mb[:, None, :, None, :]                                              # [B, 1, N, 1, K]
  if causal:
    own_allowed = own_allowed & _common.causal_allowed(qb.shape[2], kb.shape[2])
  sorted_allowed = (weight > 0)[:, :, :, None, :]                                    # [B, H, N, 1, K]
  parts = [(own_logits, own_allowed, _common.contraction("bhnqk,bnkhv->bhnqv", vb)),
           (sorted_logits, sorted_allowed, _common.contraction("bhnqk,bnkhv->bhnqv", mix(vb)))]
  if separate:
    out = sum(_common.joint_masked_attention([part], dropout) for part in parts)
  else:
    out = _common.joint_masked_attention(parts, dropout)
  return jnp.transpose(out, (0, 2, 3, 1, 4))
