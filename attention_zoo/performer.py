"""Performer: kernelized linear attention (Choromanski et al. 2021). O(L·M·(D + V)) time and memory.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
``M`` features.

Attention is ``out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)`` and is computed without the L×L
matrix by :func:`attention_zoo._linear_attention.feature_attention`: ``φ(Q) (φ(K)ᵀ V)``
(bidirectional) or chunked prefix sums (causal). Two kernels:

- ``kernel="softmax"`` — FAVOR+ positive orthogonal random features estimating ``exp(q·k/√D)``:
  ``x̃ = x·D^{-1/4}``, ``φ(x) = M^{-1/2}(exp(x̃Wᵀ − ||x̃||²/2 − max) + ε)`` (``max``: see below).
  ``W`` [M, D] is made of orthogonal ``D×D`` blocks (QR of Gaussians) whose row norms are chi(D)
  (``feature_norms="chi"``, upstream ``ortho_scaling=0``) or ``√D`` (``"sqrt_d"``, ``ortho_scaling=1``);
  ``orthogonal=False`` gives iid Gaussian rows. Default M = ``nb_features`` = 256.
- ``kernel="relu"`` — the generalized kernel LRA actually ran for Text/Retrieval/Image/Pathfinder:
  ``φ(x) = relu(x) + kernel_epsilon`` (1e-3), deterministic, no random features, no temperature.

What LRA ran (the ``lra`` protocol preset, ``configs/lra.py``, runs the same): the ReLU kernel on Text,
Retrieval, Image and Pathfinder (``performer.py``: ``_DEFAULT_ATTENTION_FN_CLS = 'generalized'``), and on
ListOps FAVOR+ softmax with **2** random features and ``ortho_scaling=0`` (chi norms):
``listops/configs/performer_base.py``. LRA's core had no attention dropout (the preset sets it to 0).
The default here (FAVOR+, M = 256) is the Performer paper's. Xiong et al.'s "Performer (256)"
(mlpen/Nystromformer ``LRA/code/attention_performer.py``, the ``xiong`` protocol's preset) ran FAVOR+
too: its config says ``kernel_type: relu``, but it builds performer_pytorch's ``FastAttention(dim_heads,
nb_features=256, kernel_fn=ReLU())`` without ``generalized_attention=True``, and ``kernel_fn`` is read
only then, so the softmax kernel ran. Its quirks, as that preset reproduces them: q and k divided by
D^{1/4} before ``softmax_kernel`` scales them by D^{-1/4} again (``input_normalizations=2``: exp(q·k/D)),
ε = 1e-4 (performer_pytorch's), chi row norms (``ortho_scaling=0``), one matrix per layer drawn when the
model is built and never redrawn (``redraw="fixed"``), and no attention dropout. It zeroed padded keys
(``K * mask``, ``V * mask``), which still get the feature ``M^{-1/2}(exp(−max) + ε)`` and so weight in
the denominator with a zero value; here padded keys get zero weight (below; ``padded_keys="zeroed"``
reproduces theirs). Its key stabilizer is one max of ``x̃Wᵀ`` over the whole batch, heads, keys and
features (here one max of ``z`` per batch and head; ``key_stabilizer="global"`` reproduces theirs). Both
cancel in the ratio up to the ε term, but theirs is larger than any key's own ``z`` (it omits the
``−|x̃|²/2``, and it is the largest of B·H·L·M values), so more of every key's feature is ε: with ε = 1e-4
the features of keys whose ``z`` lies ~9 below the maximum are mostly ε, i.e. equal for all such keys.
(performer_pytorch releases that did not detach that max passed an O(ε) gradient through it; here it
is a constant, as in its later releases.)

Differences from the reference code (google-research ``fast_attention.py`` / the LRA fork):

- **Padding is masked**: padded keys get zero features, so they get exactly zero weight (upstream ignored
  the mask). The key stabilizer (the subtracted maximum) is taken over real keys only, so padded
  contents cannot change real outputs.
- Stabilizers: queries subtract their own max over features of ``x̃Wᵀ − ||x̃||²/2``; bidirectional
  keys one max over (real keys, features) per batch and head (upstream: max of ``x̃Wᵀ`` only). Both
  cancel in the ratio apart from the ``ε = numerical_stabilizer`` term. The denominator is used as is
  (it is > 0 since all features are positive) and only an empty denominator (no real key) is replaced
  by 1, instead of upstream's ``R + 2δ·1[|R| ≤ δ]``.
- **Causal stabilizer**: a max over all keys would let future keys change past outputs, so causal keys
  are normalised by their own max r_j (``φ(k_j) = M^{-1/2}(exp(z_j − r_j) + ε)``) and
  :func:`attention_zoo._linear_attention.feature_attention` multiplies them by ``exp(r_j − s_i)`` with
  ``s_i`` the running max of r over real keys j ≤ i, rescaling the running prefix state (and the query
  side) when the max grows. Key j's feature as seen from query i is thus
  ``M^{-1/2}(exp(z_j − s_i) + ε·exp(r_j − s_i))``: ε is relative to the key's own largest feature
  (bidirectional: to the largest over all keys), an O(ε) difference in the ratio. (A data-independent
  bound ``max_m |w_m|²/2`` ≈ 50 at D = 64, M = 256 would not do: ``exp(z − bound)`` ≈ 1e-21 is swamped
  by ε = 1e-6 and the causal output becomes the running mean of v.) Upstream's causal FAVOR+ subtracted
  a max over all positions (not strictly causal).
- **Redraw** (``redraw``): ``"every_call"`` (upstream default) draws ``W`` from the flax ``"attention"``
  RNG stream on every call; when that stream is absent (e.g. evaluation without it) it falls back to the
  fixed matrix. ``"fixed"`` draws ``W`` once from ``key(seed)`` folded with a hash of the module path:
  identical across runs and between train and eval, different per layer, shared by batch and heads.
  Upstream seeded redraws with ``ceil(sum(query)·1e7)`` (data-dependent) instead. The fixed matrix is
  computed when the function is traced and compiled in as a constant (no per-call work, as when the
  released code is handed a matrix drawn outside); a per-call redraw costs an in-graph
  orthogonalisation on every call, which is why benchmarks against a fixed-matrix FAVOR+ use
  ``redraw="fixed"`` and why the default still redraws (the method's training recipe).
- **Layout**: attention runs on [B, H, L, ...] (q, k, v transposed once, D wide), not on [L, B, H, ...]
  (the released code) or [B, L, H, ...] einsums, which transpose the M-wide features around the products
  over L (fewer bytes moved: ``scripts/compare_kernels.py`` times both, ``--causal`` the causal form).
  Without a ``mask`` no masking work is done at all.
- **Dropout** (upstream had none): there is no probability matrix, so ``dropout_rate`` drops whole keys
  from the numerator only (each (batch, key, head) kept with prob ``1−p`` and scaled by ``1/(1−p)``;
  the denominator keeps every key). In the effective matrix this is exactly attention dropout whose
  mask is shared by all queries: ``P_drop[i, j] = P[i, j]·keep_j/(1−p)``, unbiased like ``nn.Dropout``.
- **Causal** uses chunked prefix sums instead of a per-position ``lax.scan``: quadratic inside chunks of
  ``causal_chunk`` positions, and an exclusive (rescaled) prefix scan of per-chunk ``φ(K)ᵀV`` states
  [B, N, H, M, V] across chunks (memory L/C·M·V, not L·M·V); see ``attention_zoo/_linear_attention.py``.

The projection is sown to ``intermediates/projection`` (apply with ``mutable=["intermediates"]``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common, _linear_attention
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class PerformerConfig(AttentionConfig):
  """Performer options (defaults: FAVOR+ softmax, 256 orthogonal features, redrawn every call).

  Attributes:
    kernel: ``"softmax"`` (FAVOR+ random features) or ``"relu"`` (LRA's generalized kernel).
    nb_features: M, the number of random features (softmax kernel only).
    orthogonal: orthogonal blocks (True) or iid Gaussian rows (False).
    feature_norms: ``"chi"`` (row norms ~ chi(D), upstream ``ortho_scaling=0``) or ``"sqrt_d"``.
    redraw: ``"every_call"`` (``"attention"`` RNG stream, falling back to the fixed draw) or ``"fixed"``.
    seed: seed of the fixed draw (folded with the module path, so layers differ).
    numerical_stabilizer: ε added to softmax features (upstream LRA value 1e-6).
    kernel_epsilon: added to relu features (upstream 1e-3).
    causal_chunk: chunk length C of the causal prefix sums.
    input_normalizations: how many times q and k are multiplied by D^{-1/4} before the softmax kernel's
      features: 1 (FAVOR+: the features estimate exp(q·k/√D), softmax attention) or 2 (Xiong et al.'s
      LRA code, which divides q and k by D^{1/4} and then calls performer_pytorch's ``softmax_kernel``,
      which scales by D^{-1/4} again: the features estimate exp(q·k/D), a softmax at temperature √D).
    padded_keys: ``"masked"`` (padded keys get zero features: zero weight) or ``"zeroed"`` (Xiong et
      al.'s ``K * mask`` and ``V * mask``: padded keys enter the sums as zero vectors, so each has the
      feature of a zero key and weighs in the denominator with a zero value; bidirectional only).
    key_stabilizer: ``"per_head"`` (one max of ``z`` over real keys and features per batch and head) or
      ``"global"`` (performer_pytorch's 2021 ``softmax_kernel``: one max of ``x̃Wᵀ``, without the
      ``−|x̃|²/2``, over the whole batch, heads, keys and features; bidirectional softmax kernel only).
  """

  family = "kernel"
  kernel: str = "softmax"
  nb_features: int = 256
  orthogonal: bool = True
  feature_norms: str = "chi"
  redraw: str = "every_call"
  seed: int = 0
  numerical_stabilizer: float = 1e-6
  kernel_epsilon: float = 1e-3
  causal_chunk: int = 64
  input_normalizations: int = 1
  padded_keys: str = "masked"
  key_stabilizer: str = "per_head"

  paper_name = "Performer"

  def __post_init__(self):
    for field, allowed in (("kernel", ("softmax", "relu")), ("feature_norms", ("chi", "sqrt_d")),
                           ("redraw", ("every_call", "fixed"))):
      if getattr(self, field) not in allowed:
        raise ValueError(f"performer {field} must be one of {allowed}, got {getattr(self, field)!r}")
    if self.nb_features < 1 or self.causal_chunk < 1:
      raise ValueError("performer nb_features and causal_chunk must be >= 1")
    if self.input_normalizations not in (1, 2):
      raise ValueError(f"performer input_normalizations must be 1 or 2, got {self.input_normalizations!r}")
    if self.input_normalizations != 1 and self.kernel != "softmax":
      raise ValueError("performer input_normalizations applies to kernel='softmax' only")
    for field, allowed in (("padded_keys", ("masked", "zeroed")), ("key_stabilizer", ("per_head", "global"))):
      if getattr(self, field) not in allowed:
        raise ValueError(f"performer {field} must be one of {allowed}, got {getattr(self, field)!r}")
    if self.causal and (self.padded_keys != "masked" or self.key_stabilizer != "per_head"):
      raise ValueError("performer padded_keys='zeroed' and key_stabilizer='global' are bidirectional "
                       "forms (Xiong et al.'s); a causal core keeps the defaults")
    if self.key_stabilizer != "per_head" and self.kernel != "softmax":
      raise ValueError("performer key_stabilizer applies to kernel='softmax' only")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """H·(F·D + F + 1): the running sums Σ φ(k) vᵀ and Σ φ(k), F = M (``nb_features``) and the running
    max of the keys' log-scales they are kept relative to (FAVOR+); relu kernel H·(D·D + D), F = D."""
    del length
    if self.kernel == "relu":
      return num_heads * (head_dim * head_dim + head_dim)
    return num_heads * (self.nb_features * head_dim + self.nb_features + 1)


def orthonormal_columns(matrices: jax.Array) -> jax.Array:
  """Q of the QR decomposition (with positive R diagonal) of each full-rank ``matrices`` [N, D, D].

  Classical Gram-Schmidt applied twice per column (CGS2, as accurate as Householder here), written in
  plain jnp ops. ``jnp.linalg.qr`` is avoided on purpose: its LAPACK custom call deadlocked XLA:CPU
  when a 4-layer model drew features in every layer (the train step never returned), and the positive
  R diagonal makes the blocks exactly Haar-distributed.
  """
  dim = matrices.shape[-1]

  def add_column(j, q):
    v = jax.lax.dynamic_index_in_dim(matrices, j, axis=2, keepdims=False)     # [N, D]
    for _ in range(2):  # columns >= j of q are still zero, so this removes the earlier ones only
      v = v - jnp.einsum("nij,nj->ni", q, jnp.einsum("nij,ni->nj", q, v))
    v = v / jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True))
    return jax.lax.dynamic_update_index_in_dim(q, v[:, :, None], j, axis=2)

  return jax.lax.fori_loop(0, dim, add_column, jnp.zeros_like(matrices))


def draw_projection(key: jax.Array, num_features: int, dim: int, *, orthogonal: bool = True,
                    feature_norms: str = "chi", dtype=jnp.float32) -> jax.Array:
  """Random projection W [M, D].

  Orthogonal: ``ceil(M/D)`` blocks, each the transposed Q of the QR of a fresh D×D Gaussian (rows
  orthonormal within a block), stacked and cut to M rows, then row ``m`` scaled by the norm of row ``m``
  of an independent M×D Gaussian (chi(D), so each row is marginally N(0, I)) or by ``√D``.
  """
  norm_key, block_key = jax.random.split(key)
  if not orthogonal:
    return jax.random.normal(block_key, (num_features, dim), dtype)
  num_blocks = -(-num_features // dim)
  gaussians = jax.random.normal(block_key, (num_blocks, dim, dim), dtype)
  q_factors = orthonormal_columns(gaussians)                                 # columns orthonormal
  rows = jnp.swapaxes(q_factors, -1, -2).reshape(num_blocks * dim, dim)[:num_features]
  if feature_norms == "chi":
    norms = jnp.linalg.norm(jax.random.normal(norm_key, (num_features, dim), dtype), axis=-1)
  else:
    norms = jnp.full((num_features,), math.sqrt(dim), dtype)
  return rows * norms[:, None]


def softmax_features(x: jax.Array, projection: jax.Array, *, is_query: bool,
                     mask: jax.Array | None = None, stabilizer: float = 1e-6,
                     causal: bool = False, key_log_scale: bool = False, heads_first: bool = False,
                     global_stabilizer: bool = False):
  """FAVOR+ features φ(x) [B, L, H, M] (float32 or wider) of ``x`` [B, L, H, D]; W [M, D].

  With ``z = x̃Wᵀ − |x̃|²/2`` (``x̃ = x·D^{-1/4}``), features are ``M^{-1/2}(exp(z − max) + ε)``.
  Queries subtract their own max over features. Keys (``is_query=False``) take ``mask`` bool [B, L]
  (None: every key is real, and no masking work is done): padded keys get all-zero features and do not
  enter any maximum. The key max is:

  - default: one max over (real keys, features) per batch and head (bidirectional attention);
  - ``key_log_scale=True``: each key's own max r_j over features; returns ``(features, r)`` with r
    [B, L, H] (no gradient), for :func:`_linear_attention.feature_attention`'s ``k_log_scale``, which
    restores ``exp(z − s_i)`` with a causal running max s_i (what the causal Performer uses);
  - ``causal=True`` (kept for compatibility): the data-independent bound ``max_m |w_m|²/2``. It is
    strictly causal but far too large: ``exp(z − bound)`` is ~1e-21 at D = 64, M = 256, drowned by ε
    (the output becomes a running mean of v) or underflowing in float32. Prefer ``key_log_scale``.

  - ``global_stabilizer=True``: one max of ``x̃Wᵀ`` (without ``−|x̃|²/2``) over the whole batch, heads,
    real keys and features (performer_pytorch's 2021 keys, as Xiong et al. ran them). It cancels in the
    ratio as the others do, up to ε, but it is larger than every key's own ``z``, so keys whose ``z`` lies
    far below it get features ``≈ M^{-1/2}·ε``, the same for every such key.

  ``heads_first``: ``x`` and the features are [B, H, L, ...] (maxima and mask over the L axis 2).
  """
  dtype = _common.accum_dtype(x, projection)
  x = x.astype(dtype) * x.shape[-1] ** -0.25
  dash = jnp.einsum("...d,md->...m", x, projection.astype(dtype))
  z = dash - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
  scale = projection.shape[0] ** -0.5
  if is_query:
    peak = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))         # [B, L, H, 1]
    return scale * (jnp.exp(z - peak) + stabilizer)
  real = None if mask is None else _key_mask(mask, heads_first)
  over_keys = (2, 3) if heads_first else (1, 3)
  if key_log_scale:
    peak = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))         # [B, L, H, 1]
  elif global_stabilizer:
    peak = jnp.max(dash if real is None else jnp.where(real, dash, _common.NEG_INF))
    peak = jax.lax.stop_gradient(jnp.where(peak > 0.5 * _common.NEG_INF, peak, 0.0))
  elif causal:
    peak = jax.lax.stop_gradient(0.5 * jnp.max(jnp.sum(projection.astype(dtype) ** 2, axis=-1)))
  elif real is None:
    peak = jax.lax.stop_gradient(jnp.max(z, axis=over_keys, keepdims=True))  # [B, 1, H, 1]
  else:
    peak = jnp.max(jnp.where(real, z, _common.NEG_INF), axis=over_keys, keepdims=True)
    peak = jax.lax.stop_gradient(jnp.where(peak > 0.5 * _common.NEG_INF, peak, 0.0))
  if real is None:
    features = scale * (jnp.exp(z - peak) + stabilizer)
  else:
    z = jnp.where(real, z - peak, -jnp.inf)                                 # padded keys: exp -> 0
    features = scale * (jnp.exp(z) + stabilizer) * real
  return (features, peak[..., 0]) if key_log_scale else features


def relu_features(x: jax.Array, *, epsilon: float = 1e-3, mask: jax.Array | None = None,
                  heads_first: bool = False) -> jax.Array:
  """Generalized ReLU features ``relu(x) + ε`` [B, L, H, D] (float32 or wider; [B, H, L, D] when
  ``heads_first``); zero on padded keys."""
  features = jax.nn.relu(x.astype(_common.accum_dtype(x))) + epsilon
  return features if mask is None else features * _key_mask(mask, heads_first)


def _key_mask(mask: jax.Array, heads_first: bool) -> jax.Array:
  """bool [B, L] broadcast against [B, L, H, M] features, or [B, H, L, M] when ``heads_first``."""
  return mask[:, None, :, None] if heads_first else mask[:, :, None, None]


def module_projection(module: nn.Module, cfg, dim: int, dtype) -> jax.Array:
  """W [M, D] of a FAVOR+ core ``module`` whose config has redraw, seed, nb_features, orthogonal and
  feature_norms (performer, scatterbrain): redrawn per call or the fixed per-layer draw.

  A fixed draw (``redraw="fixed"``, or no ``"attention"`` stream) has a concrete key, so it is computed
  once when the function is traced and enters the compiled program as a constant, as in the released
  code where the matrix is drawn outside the attention call. Drawing it in the graph instead cost a
  serial 64-step orthogonalisation on every call (about 3 ms of 36 ms forward + backward at B = 1,
  L = 1024, D = 64, M = 256 on a 2-core CPU). A per-call redraw (``"every_call"``) stays in the graph.
  """
  with jax.ensure_compile_time_eval():
    key = _common.draw_key(module, cfg.redraw, cfg.seed)
    if isinstance(key, jax.core.Tracer):
      return draw_projection(key, cfg.nb_features, dim, orthogonal=cfg.orthogonal,
                             feature_norms=cfg.feature_norms, dtype=dtype)
    key_data = tuple(jax.random.key_data(key).ravel().tolist())
  return _fixed_projection(key_data, cfg.nb_features, dim, cfg.orthogonal, cfg.feature_norms,
                           jnp.dtype(dtype).name)


@functools.lru_cache(maxsize=64)
def _fixed_projection(key_data: tuple[int, ...], num_features: int, dim: int, orthogonal: bool,
                      feature_norms: str, dtype: str) -> jax.Array:
  """:func:`draw_projection` evaluated eagerly for a concrete key (its raw data), cached by value."""
  with jax.ensure_compile_time_eval():
    key = jax.random.wrap_key_data(jnp.asarray(key_data, jnp.uint32))
    return draw_projection(key, num_features, dim, orthogonal=orthogonal, feature_norms=feature_norms,
                           dtype=jnp.dtype(dtype))


@register_attention("performer", PerformerConfig)
class PerformerAttention(nn.Module):
  """FAVOR+ (or generalized ReLU) linear attention; see the module docstring for every choice."""

  config: PerformerConfig

  def projection(self, dim: int, dtype) -> jax.Array:
    """W [M, D]: redrawn from the ``"attention"`` stream, or the fixed per-layer draw."""
    return module_projection(self, self.config, dim, dtype)

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    dim = query.shape[-1]
    # [B, H, L, D] inputs, so the products over L and the per-(B, H) key maxima need no transposes of
    # the M-wide features. Transposing the D-wide q, k, v and the output instead moves 23 % fewer bytes
    # than [B, L, H, M] einsums (XLA cost analysis, bidirectional fwd+bwd, B = 8, L = 1024, M = 256) and
    # ran in 0.7-0.9x the time of the FAVOR+ reference (scripts/compare_kernels.py, 2-core CPU). The
    # causal chunked prefix sums run heads first as well.
    query, key, value = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))
    if cfg.padded_keys == "zeroed" and mask is not None:
      # Xiong et al.'s K * mask, V * mask: padded keys stay in the sums as zero vectors (zero values).
      real = _key_mask(mask, heads_first=True)
      key, value = key * real.astype(key.dtype), value * real.astype(value.dtype)
      mask = None
    log_scale = None
    if cfg.kernel == "softmax":
      projection = self.projection(dim, _common.accum_dtype(query, key))
      self.sow("intermediates", "projection", projection)
      if cfg.input_normalizations == 2:  # the extra D^{-1/4} of Xiong et al.'s code (see the config)
        query, key = (x.astype(_common.accum_dtype(x)) * dim ** -0.25 for x in (query, key))
      q_features = softmax_features(query, projection, is_query=True, stabilizer=cfg.numerical_stabilizer)
      k_features = softmax_features(key, projection, is_query=False, mask=mask, heads_first=True,
                                    stabilizer=cfg.numerical_stabilizer, key_log_scale=cfg.causal,
                                    global_stabilizer=cfg.key_stabilizer == "global")
      if cfg.causal:
        k_features, log_scale = k_features
    else:
      q_features = relu_features(query, epsilon=cfg.kernel_epsilon)
      k_features = relu_features(key, epsilon=cfg.kernel_epsilon, mask=mask, heads_first=True)
    keep = _linear_attention.key_dropout(cfg.dropout_rate, deterministic, k_features.shape[:3],
                                        q_features.dtype)
    # mask None (no padding) stays None: no masking work at all.
    out = _linear_attention.feature_attention(q_features, k_features, value, mask, causal=cfg.causal,
                                             chunk=cfg.causal_chunk, keep=keep, k_log_scale=log_scale,
                                             heads_first=True)
    out = jnp.swapaxes(out, 1, 2)
    return out.astype(value.dtype)
