"""Routing Transformer attention (Roy et al. 2021): online k-means routing. O(L·K·D + L·W·(D + V)).

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``K``
clusters, ``W`` tokens per cluster window (``Q`` query / ``J`` key inside a window).

Shared QK: the core attends with the *query* as query and, normalised, as key; the ``key`` argument is
ignored (the model's key projection is unused by this core). Per batch element and head:

1. Routing features ``x_i = unit(q_i)`` are scored against K unit centroids (cosine similarity).
2. Balanced assignment: every centroid takes its W = ceil(L / K) highest-scoring real tokens (padded
   tokens only fill windows of centroids with fewer than W real candidates, and are masked), sorted
   by position, so all shapes are static. A token may be in several windows or in none.
3. Inside each window: softmax attention with keys ``unit(q_j)`` and logits ``q_i·unit(q_j) / √D``;
   a token does not attend to itself (logit −5e4) unless nothing else in the window is real.
4. A token's output is the mean of its outputs over the windows that chose it (a convex combination,
   so rows still sum to 1). A real token no window chose attends to itself only (output = its value):
   finite and row-stochastic, and it keeps the residual path informative.

Sizes: K = ``num_clusters``, default ceil(√L) at init (then fixed by the stored centroids), so W ≈ √L and
the cost grows like L^1.5 (core FLOPs slope ≈ 1.5); longer inputs with the same K cost L²/K.

Centroids: the shared EMA spherical k-means of ``attention_zoo._clustering`` (collection
``"centroids"``, variable ``means`` [H, K, D], the same collection as ``combiner_learnable``). Each
token's nearest centroid (not the top-W windows) drives the update, which happens only when training:
``deterministic=False`` AND the collection is mutable (``lra_bench.training.steps.train_step`` passes
every non-``params`` collection of the model state as mutable, and evaluation passes nothing mutable)::

    out, updates = core.apply(variables, q, k, v, mask, deterministic=False, rngs=...,
                              mutable=["centroids"])

Differences from the reference implementation (lucidrains/routing-transformer ``KmeansAttention``; the
paper's code is not public in JAX):

- Centroids start as random unit vectors (lucidrains: k-means iterations on the first batch), and the
  EMA step renormalises to unit length (lucidrains: EMA of the per-batch normalised means, not
  renormalised). No commitment loss (the core returns only its output).
- Tokens chosen by no window attend to themselves (lucidrains: zero output); tokens chosen several
  times get the mean of their outputs (as lucidrains' ``scatter_mean``). On a GPU that mean's
  scatter-add of overlapping windows uses atomic additions, so two runs can differ in the last float32
  bits (6e-8 on an H200); ``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` makes them bit-for-bit equal.
- Padding: padded tokens are never preferred to real ones by a centroid and are masked as keys
  (lucidrains masked them as keys but let them compete for window places).
- Causal is not supported (``NotImplementedError``): with balanced top-W windows, whether a past token
  shares a window with another depends on the scores of future tokens, so a position mask inside the
  windows (lucidrains' causal form) still lets the future change past outputs.
- No local-attention heads (lucidrains mixes local and routing heads); that is a model choice.
- **Always shared QK**: the model's key projection is ignored and the queries (normalised) are the keys,
  causal or not. lucidrains shares QK only when causal (``shared_qk = default(shared_qk, causal)``); its
  non-causal default clusters queries and keys together and routes them separately, so a window's
  queries and its keys are different token sets, with the keys from the key projection.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _clustering, _common
from attention_zoo.registry import AttentionConfig, register_attention

# Logit of a token attending to itself (lucidrains' TOKEN_SELF_ATTN_VALUE): weight only when alone.
SELF_LOGIT = -5e4


@dataclasses.dataclass(frozen=True)
class RoutingConfig(AttentionConfig):
  """Routing attention options.

  Attributes:
    num_clusters: K centroids per head; ``None`` = ceil(√L) at init (then the stored K).
    decay: EMA decay of the centroid update (training only).
    mask_self: a token attends to itself only when nothing else in its window is real.
  """

  family = "learned-pattern"
  num_clusters: int | None = None
  decay: float = 0.999
  mask_self: bool = True

  paper_name = None  # not in the LRA tables
  ignores = ("key",)  # shared QK: the keys are the (normalised) queries
  no_causal_form = ("its balanced top-W windows depend on the scores of future tokens, so the future "
                    "changes past outputs")

  def __post_init__(self):
    if self.num_clusters is not None and self.num_clusters < 1:
      raise ValueError("routing num_clusters must be >= 1")
    if not 0.0 <= self.decay <= 1.0:
      raise ValueError("routing decay must be in [0, 1]")


def window_size(length: int, clusters: int) -> int:
  """W = ceil(L / K), at most L."""
  return min(length, -(-length // clusters))


def top_windows(scores: jax.Array, mask: jax.Array, width: int) -> jax.Array:
  """Per centroid, its ``width`` best real tokens sorted by position: scores [B, H, L, K], mask
  [B, L] -> int [B, H, K, W]. Padded tokens score below every real one (cosines are >= −1)."""
  ranked = jnp.where(mask[:, None, :, None], scores, -3.0)
  _, index = jax.lax.top_k(jnp.swapaxes(ranked, -1, -2), width)                 # [B, H, K, W]
  return jnp.sort(index, axis=-1)


@register_attention("routing", RoutingConfig)
class RoutingAttention(nn.Module):
  """Balanced k-means routing attention with shared QK (the ``key`` argument is ignored)."""

  config: RoutingConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query: [B, L, H, D] (also the keys); key: ignored; value: [B, L, H, V]; mask: bool [B, L]
    -> [B, L, H, V]."""
    del key  # shared QK
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("routing cannot be causal: its balanced top-W windows depend on "
                                "the scores of future tokens, so the future changes past outputs")
    batch, length, heads, dim = query.shape
    mask = _common.default_mask(mask, batch, length)
    clusters = (_clustering.stored_clusters(self) or cfg.num_clusters
                or int(math.ceil(math.sqrt(length))))
    means = _clustering.centroid_variable(self, heads, clusters, dim)
    feats = jax.lax.stop_gradient(_clustering.unit(query.astype(_common.accum_dtype(query))))
    scores = _clustering.similarities(feats, means.value)                        # [B, H, L, K]
    if not deterministic and _clustering.may_update(self):
      _clustering.ema_update(means, feats, _clustering.nearest(scores, mask), cfg.decay)
    index = top_windows(scores, mask, window_size(length, clusters))            # [B, H, K, W]
    out = _window_attention(query, value, mask, index, cfg.mask_self,
                            _common.dropout_callback(cfg.dropout_rate, deterministic))
    return out.astype(value.dtype)


def _window_attention(query, value, mask, index, mask_self, dropout):
  """Attention inside every window, averaged per token; unchosen tokens keep their own value.
  query [B, L, H, D], value [B, L, H, V], mask [B, L], index [B, H, K, W] -> [B, L, H, V]."""
  batch, length, heads = query.shape[:3]

  def gather(x):
    """[B, L, H, X] -> [B, H, K, W, X]."""
    flat = index.reshape(batch, heads, -1, 1)
    x = jnp.take_along_axis(jnp.moveaxis(x, 1, 2), flat, axis=2)
    return x.reshape(*index.shape, x.shape[-1])

  gq, gv = gather(query), gather(value)
  gk = _clustering.unit(gq.astype(_common.accum_dtype(gq))).astype(gq.dtype)
  real = jnp.take_along_axis(jnp.broadcast_to(mask[:, None], (batch, heads, length)),
                             index.reshape(batch, heads, -1), axis=2).reshape(index.shape)
  logits = _common.dot_logits(gq, gk, "bhkqd,bhkjd->bhkqj")                     # [B, H, K, W, W]
  if mask_self:
    logits = jnp.where(index[..., :, None] == index[..., None, :], SELF_LOGIT, logits)
  out = _common.joint_masked_attention(
      [(logits, real[..., None, :], _common.contraction("bhkqj,bhkjv->bhkqv", gv))], dropout)

  b = jnp.arange(batch)[:, None, None, None]
  h = jnp.arange(heads)[None, :, None, None]
  total = jnp.zeros((batch, heads, length, out.shape[-1]), out.dtype).at[b, h, index].add(out)
  count = jnp.zeros((batch, heads, length), out.dtype).at[b, h, index].add(1.0)
  own = jnp.moveaxis(value, 1, 2).astype(out.dtype)                            # [B, H, L, V]
  mean = _common.normalize(total, count)
  return jnp.moveaxis(jnp.where(count[..., None] > 0, mean, own), 1, 2)
