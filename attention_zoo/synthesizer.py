"""Synthesizer (Tay et al. 2021): attention weights synthesised without (or besides) query-key dot
products. O(L²) time and memory, like vanilla attention (FLOPs slope ≈ 2, factorized modes included:
the L×L logits are still formed).

Axis legend: ``B`` batch, ``Q`` query positions, ``K`` key positions (both of length L), ``H`` heads,
``D`` query/key head dim, ``E`` hidden width of the dense synthesizer, ``R`` factorization rank k, ``V``
value dim. ``n`` is the length seen at init.

    out = softmax(S + [Q Kᵀ/√D]) V      per head, the dot-product term unless ``ignore_dot_product``

with the synthetic logits S [L, L] the sum of the parts named in ``mode`` (``"+"``-joined):

- ``"random"``: a learned matrix R [H, n, n] (independent of the input), cut to [L, L];
- ``"factorized_random"``: R₁ R₂ with R₁ [H, n, k], R₂ [H, k, n] (k = ``k``);
- ``"dense"``: S_i = W₂ relu(W₁ q_i) per query, W₁ [H, D, E], W₂ [H, E, n] (no biases, as LRA). The
  input of the dense synthesizer is the core's ``query`` (the model's projected query of token i).

Padded keys get zero weight; ``causal=True`` masks the synthetic (and dot-product) logits with j ≤ i.
Length-dependent parameters are sized from the input length at ``init``; shorter inputs use their
top-left L×L (first L rows/columns), longer inputs raise a ``ValueError``.

Registered presets:

- ``synthesizer``: what LRA Table 1 ran: ``SynthesizerEncoder``'s defaults ``synthesizer_mode="random"``,
  ``ignore_dot_product=False`` (random R **plus** the dot-product logits, summed before one softmax, as
  LRA's ``synthetic_attention`` adds them). The attention module's own defaults (factorized random,
  k = 32, no dot product) and the released Text config's values never reached the model.
- ``synthesizer_factorized_random``: factorized random, k = 32, no dot product (LRA module defaults).
- ``synthesizer_dense``: the paper's Dense Synthesizer, no dot product.

Differences from LRA ``synthesizer/synthesizer_attention.py``:

- Padded keys are always masked. LRA masked padding only when the dot product was used (so its
  ``ignore_dot_product=True`` modes attended to padding).
- The dense synthesizer maps the model's per-head query (W₁ per head, D -> E) instead of LRA's raw
  layer input x (a [features -> H·head_dim] map); and LRA reshaped its [B, L, H, n] output to
  [B, H, L, n] without transposing (mixing heads and positions), which is not reproduced.
- n is the input length at init instead of a ``max_length`` argument (LRA: the task's max_len).
- Causal masking of the synthetic logits (the paper's decoder form); LRA's causal path was only used in
  its decoders.
- Attention dropout drops unnormalised weights with the normalizer kept (inverted, unbiased).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _common
from attention_zoo.linformer import init_length
from attention_zoo.registry import AttentionConfig, register_attention

PARTS = ("dense", "random", "factorized_random")


@dataclasses.dataclass(frozen=True)
class SynthesizerConfig(AttentionConfig):
  """Synthesizer options (defaults: the LRA Table 1 run).

  Attributes:
    mode: ``"+"``-joined synthetic parts from ``dense``, ``random``, ``factorized_random`` (LRA ran
      ``"random"``).
    ignore_dot_product: drop the Q Kᵀ/√D term (LRA Table 1: ``False``, i.e. mixed with it).
    k: rank of ``factorized_random`` (LRA module default 32).
    hidden: E, hidden width of ``dense``; ``None`` = D (LRA: the head dim).
  """

  family = "mixing"
  mode: str = "random"
  ignore_dot_product: bool = False
  k: int = 32
  hidden: int | None = None
  paper_name = "Synthesizer"

  def __post_init__(self):
    parts = self.mode.split("+")
    if not parts or any(p not in PARTS for p in parts) or len(set(parts)) != len(parts):
      raise ValueError(f"synthesizer mode must join distinct parts of {PARTS} with '+', got {self.mode!r}")
    if self.k < 1 or (self.hidden is not None and self.hidden < 1):
      raise ValueError("synthesizer k and hidden must be >= 1")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """(2 with the dot product, else 1)·H·D·L: every past value, and every past key only for Q Kᵀ (the
    synthetic logits come from parameters and the query)."""
    return (1 if self.ignore_dot_product else 2) * num_heads * head_dim * length

  def support(self, length: int) -> np.ndarray:
    """bool [L, L]: every pair (j ≤ i when causal)."""
    full = np.ones((length, length), bool)
    return np.tril(full) if self.causal else full


@dataclasses.dataclass(frozen=True)
class FactorizedRandomSynthesizerConfig(SynthesizerConfig):
  """Factorized random synthesizer, k = 32, no dot product (LRA attention-module defaults)."""

  mode: str = "factorized_random"
  ignore_dot_product: bool = True
  paper_name = None
  ignores = ("query", "key")  # learned R1 R2, no dot product: the weights are input-independent


@dataclasses.dataclass(frozen=True)
class DenseSynthesizerConfig(SynthesizerConfig):
  """Dense synthesizer, no dot product (the paper's main variant)."""

  mode: str = "dense"
  ignore_dot_product: bool = True
  paper_name = None
  ignores = ("key",)  # weights from the query alone (no dot product)


@register_attention("synthesizer_dense", DenseSynthesizerConfig)
@register_attention("synthesizer_factorized_random", FactorizedRandomSynthesizerConfig)
@register_attention("synthesizer", SynthesizerConfig)
class SynthesizerAttention(nn.Module):
  """softmax(synthetic logits [+ Q Kᵀ/√D]) V."""

  config: SynthesizerConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    logits = self._synthetic_logits(query)                                # [B | 1, H, Q, K]
    if not cfg.ignore_dot_product:
      logits = logits + _common.dot_logits(query, key, "bqhd,bkhd->bhqk")
    allowed = mask[:, None, None, :]                                      # [B, 1, 1, K]
    if cfg.causal:
      allowed = allowed & _common.causal_allowed(length, length)[None, None]
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    out = _common.masked_attention(logits, allowed, jnp.swapaxes(value, 1, 2), "bhqk,bhkv->bhqv", drop)
    return jnp.swapaxes(out, 1, 2)                                        # [B, Q, H, V]

  def _synthetic_logits(self, query: jax.Array) -> jax.Array:
    """Sum of the configured synthetic parts, float32 or wider: [B or 1, H, L, L]."""
    cfg = self.config
    length, heads, dim = query.shape[1:]
    dtype = _common.accum_dtype(query)
    init = nn.initializers.xavier_uniform()
    parts = []
    for part in cfg.mode.split("+"):
      if part == "random":
        n = init_length(self, "random", length, axis=1)
        parts.append(self.param("random", init, (heads, n, n))[None, :, :length, :length])
      elif part == "factorized_random":
        n = init_length(self, "random1", length, axis=1)
        left = self.param("random1", init, (heads, n, cfg.k))[:, :length]
        right = self.param("random2", init, (heads, cfg.k, n))[:, :, :length]
        parts.append(jnp.einsum("hqr,hrk->hqk", left, right)[None])
      else:
        n = init_length(self, "dense2", length, axis=2)
        hidden = cfg.hidden or dim
        w1 = self.param("dense1", init, (heads, dim, hidden)).astype(dtype)
        w2 = self.param("dense2", init, (heads, hidden, n))[:, :, :length].astype(dtype)
        act = jax.nn.relu(jnp.einsum("bqhd,hde->bqhe", query.astype(dtype), w1))
        parts.append(jnp.einsum("bqhe,hek->bhqk", act, w2))
    return sum(p.astype(dtype) for p in parts)
