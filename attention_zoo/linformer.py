"""Linformer (Wang et al. 2020): attention over k projections of the length axis. O(L·k) cost.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``M``
projected length (k).

Per head, with learned projections ``E, F ∈ R^{n×k}`` of the length axis (n = the length seen at init):

    out = softmax(Q (Eᵀ K)ᵀ / √D) (Fᵀ V)        Q, K [L, D], V [L, V], Eᵀ K [k, D], Fᵀ V [k, V]

The effective matrix is ``P = softmax(Q (Eᵀ K)ᵀ/√D) Fᵀ`` [L, L]: neither non-negative nor
row-stochastic (declared so), but linear in the values, and exactly zero on padded keys because padded
key and value rows are zeroed before the projection (so the projected keys/values never depend on what
padded positions contain).

Length-dependent parameters: E (and F) have n = the input length at ``init`` rows. Shorter inputs use
the first L rows of E/F (as LRA's ``kernel[:input_dim]``); longer inputs raise a ``ValueError`` (init
the model at the longest length it will see).

Differences from LRA ``linformer/linformer_attention.py`` (and fairseq ``examples/linformer``):

- Padding is masked: padded K/V rows are zeroed before projecting. LRA ignored the padding mask
  altogether (padded tokens' keys and values were mixed into every projection).
- n is the input length at init instead of a ``max_len`` argument (LRA: the task's max_len).
- ``k`` (LRA: 16, one projection shared by K and V, per layer, shared across heads; E initialised
  Xavier-uniform as LRA's kernel) can also be a fraction of n (``k_fraction``; the paper/fairseq use
  n/4), and E, F can be separate (``share_kv=False``).
- Attention dropout drops the unnormalised weights over the k projected keys with the normalizer kept
  (inverted, unbiased), equivalent in expectation to LRA's dropout of the probabilities.
- Layout: the projected keys/values and the [L, k] attention run heads first ([B, H, ...]); [B, L, H, k]
  einsums put the batch axes B, H apart and XLA:CPU transposes the weights around every product
  (measured at the xiong ListOps shape, B 32, L 2000, 2 heads of 32, k 256, one thread, fwd + bwd with
  dropout: 4.2 s in that layout, 2.2 s heads first). Attention dropout draws its mask in the
  [B, L, H, k] layout, so the dropout bits of a seeded run do not depend on the layout.
- Xiong et al.'s ``attention_linformer.py`` (the ``xiong`` protocol: ``per_head=True, init_std=0.02``,
  with ``model.share_attention_core`` so that both layers use one projection, as its class attribute
  did): E [H, k, n] N(0, 0.02), one for keys and values, applied to masked keys and values (as here).
- No causal form: ``causal=True`` raises ``NotImplementedError`` (the length projection mixes future
  positions into every projected key).
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
class LinformerConfig(AttentionConfig):
  """Linformer options.

  Attributes:
    k: projected length (LRA: 16).
    k_fraction: if set, k = ceil(k_fraction · n) instead (paper: 0.25).
    share_kv: one projection E for keys and values (LRA); ``False`` learns a separate F for values.
    per_head: one projection per head, E [H, n, k] (Xiong et al.'s ``attention_linformer.py``); False: one
      [n, k] shared by the heads (LRA, fairseq).
    init_std: E (and F) drawn N(0, init_std²) (Xiong et al.: 0.02); None: Xavier-uniform (LRA).
  """

  family = "low-rank"
  no_causal_form = "the length projection mixes future positions into every projected key and value"
  k: int = 16
  k_fraction: float | None = None
  share_kv: bool = True
  per_head: bool = False
  init_std: float | None = None
  nonnegative = False
  rows_sum_to_one = False
  paper_name = "Linformer"

  def __post_init__(self):
    if self.k < 1:
      raise ValueError("linformer k must be >= 1")
    if self.k_fraction is not None and not 0 < self.k_fraction <= 1:
      raise ValueError("linformer k_fraction must be in (0, 1]")
    if self.init_std is not None and not self.init_std > 0:
      raise ValueError(f"linformer init_std must be > 0 (or None for Xavier), got {self.init_std!r}")

  def rank(self, n: int) -> int:
    """The projected length k used for init length n."""
    return max(1, math.ceil(self.k_fraction * n)) if self.k_fraction is not None else self.k


def init_length(module: nn.Module, name: str, length: int, axis: int = 0) -> int:
  """n: the size of ``axis`` of the length-dependent parameter ``name`` (the input length at init;
  ``length`` itself while initialising). Raises a clear error for inputs longer than n."""
  if not module.has_variable("params", name):
    return length
  n = module.get_variable("params", name).shape[axis]
  if length > n:
    raise ValueError(f"{type(module).__name__}: input length {length} exceeds the length {n} its "
                     f"length-dependent parameter {name!r} was initialised for; init at the longest length")
  return n


@register_attention("linformer", LinformerConfig)
class LinformerAttention(nn.Module):
  """softmax(Q (Eᵀ K)ᵀ / √D) (Fᵀ V) with learned length projections (F = E by default)."""

  config: LinformerConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("linformer has no causal form: the length projection mixes future "
                                "positions into every projected key and value")
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)[:, :, None, None]
    heads = query.shape[2]
    key_proj = self._projection("E", length, heads)
    value_proj = key_proj if cfg.share_kv else self._projection("F", length, heads)
    # Heads first (see the module docstring: layout).
    project = "blhd,hlm->bhmd" if cfg.per_head else "blhd,lm->bhmd"
    key = jnp.einsum(project, jnp.where(mask, key, 0), key_proj.astype(key.dtype))
    value = jnp.einsum(project, jnp.where(mask, value, 0), value_proj.astype(value.dtype))
    logits = _common.dot_logits(jnp.swapaxes(query, 1, 2), key, "bhld,bhmd->bhlm")   # [B, H, L, M]
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    if drop is not None:  # the mask drawn in the [B, L, H, M] layout (module docstring): same bits per weight
      drop = lambda weights, part, inner=drop: jnp.swapaxes(inner(jnp.swapaxes(weights, 1, 2), part), 1, 2)
    out = _common.masked_attention(logits, jnp.ones((), bool), value, "bhlm,bhmv->bhlv", drop)
    return jnp.swapaxes(out, 1, 2)                                           # [B, L, H, V]

  def _projection(self, name: str, length: int, heads: int) -> jax.Array:
    """The first L rows of the length projection ``name``: [n, k], or [H, n, k] with ``per_head``."""
    cfg = self.config
    n = init_length(self, name, length, axis=1 if cfg.per_head else 0)
    shape = (heads, n, cfg.rank(n)) if cfg.per_head else (n, cfg.rank(n))
    init = (nn.initializers.normal(cfg.init_std) if cfg.init_std is not None
            else nn.initializers.xavier_uniform(batch_axis=(0,) if cfg.per_head else ()))
    kernel = self.param(name, init, shape)
    return kernel[:, :length] if cfg.per_head else kernel[:length]
