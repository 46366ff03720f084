"""What the sequence mixers of this package share (a private module: it registers nothing, and
``attention_zoo.mixers`` does not import it as a mixer). One implementation each of:

- the compute dtype, the default mask, the masked input, the engine called with a layer's config and the output
  step (dropout, zeros at the padded positions, the input's dtype);
- row packing: each row's real tokens moved, in order, to its front and its padding behind them, so that
  a convolution or a scan over the packed row acts as if the padding were not there (padding at the end or
  inside a row alike), and the depthwise short convolutions that run over the packed rows;
- the norms: RMS, per-head (group) and l2 normalisation;
- the initialisers: U(−b, b), Mamba's Δ bias, log-uniform;
- head counts, and the state sizes of the layers that keep one [K, V] matrix state per head (``gla``,
  ``retnet``, ``hgrn2``), plus the inputs of q/k/v short convolutions (``deltanet``, ``gated_deltanet``, ``kda``);
- fla's linear layer as fla's models initialise it, its per-head projections, the gated RMSNorm output of fla's
  GLA and RetNet layers, and the layer of the DeltaNet family (``deltanet``, ``gated_deltanet``, ``kda``): its
  q/k/v/β inputs (projections, short convolutions, norms), its recurrence, output gate and output;
- the RWKV state size, token shift, receptance/key/value maps and two-way recurrence (``rwkv6``, ``rwkv7``).

A layer imports these from here, never from another layer's module.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo.mixers._linear_recurrence import linear_recurrence

MODES = ("chunk", "recurrent")  # the chunked-parallel form (training default) and the token-by-token scan
FLA_INIT_STD = 0.02  # fla's ``initializer_range``: its models draw every nn.Linear weight from N(0, 0.02²)
L2_EPS = 1e-6  # fla/modules/l2norm.py l2norm_fwd


# ---------------------------------------------------------------- dtype, mask, output

def check_mode(layer: str, mode: str) -> None:
  """ValueError unless ``mode`` is one of :data:`MODES`."""
  if mode not in MODES:
    raise ValueError(f"{layer}: mode must be one of {MODES}, got {mode!r}")


def compute_dtype(x) -> jnp.dtype:
  """float64 for float64 input, else float32 (bfloat16 and float32 inputs)."""
  return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def default_mask(x, mask):
  """mask as bool [B, L]; all True when None."""
  return jnp.ones(x.shape[:2], bool) if mask is None else jnp.asarray(mask, bool)


def masked_input(x, mask, dtype):
  """x [B, L, D] with its padded positions zeroed, in ``dtype``."""
  return jnp.where(mask[..., None], x, 0).astype(dtype)


def layer_input(x, mask):
  """(dtype, mask, u): the compute dtype (:func:`compute_dtype`), the mask as bool [B, L] (:func:`default_mask`)
  and x [B, L, D] with its padded positions zeroed, in that dtype (:func:`masked_input`)."""
  dtype = compute_dtype(x)
  mask = default_mask(x, mask)
  return dtype, mask, masked_input(x, mask, dtype)


def recurrence(cfg, q, k, v, mask, **arrays):
  """The engine's ``linear_recurrence`` of q, k, v (and ``arrays``: log_decay, beta ...) under ``mask`` with the
  layer config's ``causal``, ``mode`` and ``chunk_size``."""
  return linear_recurrence(q, k, v, **arrays, mask=mask, causal=cfg.causal, mode=cfg.mode, chunk_size=cfg.chunk_size)


def finish(y, mask, dtype, dropout_rate, deterministic):
  """A layer's output: ``config.dropout_rate`` dropout, zeros at the padded positions, cast to ``dtype`` (the
  input's). Called inside the layer's compact ``__call__`` (the dropout draws from its ``dropout`` stream)."""
  y = nn.Dropout(dropout_rate)(y, deterministic=deterministic)
  return jnp.where(mask[..., None], y, 0).astype(dtype)


# ---------------------------------------------------------------- row packing, short convolutions

def pack_rows(mask):
  """Where each token goes when a row's real tokens are moved, in order, to its front (fla's
  ``unpad_hidden_states`` packs them likewise for its variable-length kernels).

  Args:
    mask: bool [B, L], True at real tokens.
  Returns:
    (src, dest, packed_mask): int [B, L] ``src[b, i]`` the position whose token lands in slot i,
    int [B, L] ``dest[b, t]`` the slot of position t (its inverse), bool [B, L] the packed mask
    (``i < number of real tokens``). ``gather(x, src)`` packs, ``gather(y, dest)`` unpacks.
  """
  real = mask.astype(jnp.int32)
  count = jnp.sum(real, axis=1, keepdims=True)
  dest = jnp.where(mask, jnp.cumsum(real, axis=1) - 1, count + jnp.cumsum(1 - real, axis=1) - 1)
  rows = jnp.arange(mask.shape[0])[:, None]
  src = jnp.zeros_like(dest).at[rows, dest].set(jnp.broadcast_to(jnp.arange(mask.shape[1]), mask.shape))
  return src, dest, jnp.arange(mask.shape[1])[None] < count


def gather(x, index):
  """x [B, L, ...] reordered along L: out[b, i] = x[b, index[b, i]]."""
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def pack(x, mask):
  """(packed x, packed mask, dest): x [B, L, ...] with each row's real tokens first, in order, and zeros behind
  them (:func:`pack_rows`); ``unpack(y, dest, mask)`` puts an output computed on the packed rows back."""
  src, dest, packed_mask = pack_rows(mask)
  return gather(jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x, 0), src), packed_mask, dest


def unpack(y, dest, mask):
  """y [B, L, ...] computed on packed rows (:func:`pack`) back in row order, zero at the padded positions."""
  return jnp.where(mask.reshape(mask.shape + (1,) * (y.ndim - 2)), gather(y, dest), 0)


def short_conv(x, weight, bias=None, reverse=False):
  """Depthwise convolution over the length, zero outside the sequence.

  Forward: out_t = bias + Σ_k weight[k] ⊙ x_{t−(W−1)+k} (PyTorch's ``conv1d`` with padding W−1, cut to L:
  ``weight[W−1]`` weighs the current token); ``reverse``: out_t = bias + Σ_k weight[k] ⊙ x_{t+(W−1)−k} (the
  same conv on the reversed sequence). A ``bias`` starts the sum; without one the sum starts at the first term
  (a caller that adds its bias after the sum keeps its own rounding order).

  Args:
    x: [B, L, E]. weight: [W, E]. bias: [E] or None.
  Returns:
    [B, L, E].
  """
  width, length = weight.shape[0], x.shape[1]
  out = jnp.zeros_like(x) if bias is None else jnp.broadcast_to(bias, x.shape)
  for k in range(width):
    shift = width - 1 - k
    if shift == 0:
      moved = x
    elif reverse:
      moved = jnp.pad(x, ((0, 0), (0, shift), (0, 0)))[:, shift:shift + length]
    else:
      moved = jnp.pad(x, ((0, 0), (shift, 0), (0, 0)))[:, :length]
    out = out + moved * weight[k]
  return out


def short_conv_real(x, mask, weight, bias=None):
  """The causal depthwise convolution over each row's real tokens only: the row packed (:func:`pack`), out =
  Σ_k weight[k] ⊙ packed_{s−(W−1)+k} + bias (zeros before the first real token), unpacked. So the window of a
  real token holds the W − 1 previous REAL tokens, padding at the end or inside the row alike; padded
  positions get 0.

  Args:
    x: [B, L, E]; mask: bool [B, L]; weight: [W, E]; bias: [E] or None (added after the sum).
  Returns:
    [B, L, E].
  """
  packed, _, dest = pack(x, mask)
  out = short_conv(packed, weight)
  if bias is not None:
    out = out + bias
  return unpack(out, dest, mask)


# ---------------------------------------------------------------- norms

def rms_normalize(x, eps):
  """``x · rsqrt(mean x² + eps)`` over the last axis (fla's ``RMSNorm`` before its weight)."""
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


def group_normalize(o, eps):
  """``(o − mean) · rsqrt(var + eps)`` over the last axis (mean and biased variance): a GroupNorm with one group
  per head for o [..., H, K], before its affine map."""
  mean = jnp.mean(o, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(o - mean), axis=-1, keepdims=True)
  return (o - mean) * jax.lax.rsqrt(var + eps)


def l2_normalize(x, eps=L2_EPS):
  """``x / sqrt(Σ x² + eps)`` over the last axis (fla ``l2norm``)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


# ---------------------------------------------------------------- initialisers

def uniform(bound):
  """Initialiser U[−bound, bound] (PyTorch's default Linear / Conv1d init with bound 1/√fan_in)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def dt_bias_init(dt_min=1e-3, dt_max=0.1, floor=1e-4):
  """Mamba's Δ bias: softplus⁻¹(dt) = dt + log(−expm1(−dt)), dt log-uniform on [dt_min, dt_max], clamped to
  ≥ floor (``mamba_simple.py``, ``mamba2.py``; fla's ``dt_bias`` of Gated DeltaNet and KDA)."""

  def init(key, shape, dtype=jnp.float32):
    dt = jnp.exp(jax.random.uniform(key, shape, dtype) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = jnp.maximum(dt, floor)
    return dt + jnp.log(-jnp.expm1(-dt))

  return init


def log_uniform_init(low, high):
  """Initialiser log(U[low, high)) (``A_log``: A ~ U[low, high))."""

  def init(key, shape, dtype=jnp.float32):
    return jnp.log(jax.random.uniform(key, shape, dtype, low, high))

  return init


# ---------------------------------------------------------------- head counts, state sizes

def largest_divisor(n: int, at_most: int) -> int:
  """The largest divisor of ``n`` that is at most ``at_most`` (1 when ``at_most`` < 1)."""
  return max(d for d in range(1, max(1, min(at_most, n)) + 1) if n % d == 0)


def common_heads(max_heads: int, *dims: int, even: int | None = None) -> int:
  """The largest h in 1..max_heads dividing every one of ``dims``; with ``even`` (a dim), h also keeps
  ``even // h`` even when some h allows it (RoPE rotates pairs)."""
  candidates = [h for h in range(max(1, max_heads), 0, -1) if all(d % h == 0 for d in dims)]
  if even is not None:
    paired = [h for h in candidates if (even // h) % 2 == 0]
    if paired:
      return paired[0]
  return candidates[0]


def key_heads(key_dim: int, max_head_dim: int, num_heads: int | None, head_dim: int | None) -> tuple[int, int]:
  """(H, K) for a key dim ``key_dim``: both given → as given; one given → the other = key_dim // it (at least
  1); neither → H = ⌈key_dim / max_head_dim⌉, K = key_dim // H."""
  if num_heads is not None and head_dim is not None:
    return num_heads, head_dim
  if num_heads is not None:
    return num_heads, max(1, key_dim // num_heads)
  if head_dim is not None:
    return max(1, key_dim // head_dim), head_dim
  heads = -(-key_dim // max_head_dim)
  return heads, key_dim // heads


def value_head_dim(head_dim: int, expand_v: float, layer: str) -> int:
  """V = K·expand_v, which must be an integer (fla's check)."""
  dv = int(round(head_dim * expand_v))
  if not math.isclose(head_dim * expand_v, dv, rel_tol=1e-5) or dv < 1:
    raise ValueError(f"{layer}: expand_v={expand_v} × head dim {head_dim} is not a positive integer")
  return dv


class QKVConvStateSize:
  """``state_size`` of a config whose ``dims(d_model)`` gives (H, K, V), whose layer keeps one [K, V] matrix state
  per head, and whose ``conv_size`` and ``use_short_conv`` set three short convolutions of widths H·K, H·K and H·V
  (q, k, v; HGRN2's q, f, i): the DeltaNet family, ``gla``, ``retnet``, ``hgrn2``; a base before ``MixerConfig``."""

  def state_size(self, length: int, d_model: int) -> int:
    """H·K·V + (W − 1)·H·(2K + V): the [K, V] states of the H heads plus, with use_short_conv, the last W − 1
    inputs of the three short convolutions (q, k, v; HGRN2's q, f, i) (independent of the length).

    (H, K, V) from the config's ``dims``; W = conv_size.
    """
    del length
    heads, k, v = self.dims(d_model)
    conv = (self.conv_size - 1) * heads * (2 * k + v) if self.use_short_conv else 0
    return heads * k * v + conv


# ---------------------------------------------------------------- fla layers

def fla_linear(features, name, dtype, std=FLA_INIT_STD, use_bias=False, param_dtype=None):
  """fla's ``nn.Linear`` as fla's models initialise it (``_init_weights``): weight N(0, std²), bias 0.
  Parameters in ``param_dtype`` (default: ``dtype``)."""
  return nn.Dense(features, use_bias=use_bias, kernel_init=nn.initializers.normal(std),
                  bias_init=nn.initializers.zeros, dtype=dtype,
                  param_dtype=dtype if param_dtype is None else param_dtype, name=name)


def fla_heads(u, dtype, heads, **dims):
  """fla's bias-free projections of u [B, L, D], one per keyword ``name=n`` (in order): ``fla_linear(H·n, name)``,
  split into heads [B, L, H, n]."""
  batch, length = u.shape[:2]
  return [fla_linear(heads * n, name, dtype)(u).reshape(batch, length, heads, n) for name, n in dims.items()]


def fla_gated_output(module, o, u, d_model, dtype, eps, use_gate):
  """The output of fla's GLA and RetNet layers: ``FusedRMSNormGated`` over each head's V (one weight [V] shared by
  the heads, ``g_norm_weight``, created on ``module`` in ``dtype``), ⊙ swish(g_proj(u)) with ``use_gate``, then
  ``o_proj``: o [B, L, H, V], u [B, L, D] -> [B, L, d_model]."""
  batch, length, heads, v_dim = o.shape
  norm_weight = module.param("g_norm_weight", nn.initializers.ones, (v_dim,), dtype)
  o = rms_normalize(o.astype(dtype), eps) * norm_weight
  if use_gate:
    g = fla_linear(heads * v_dim, "g_proj", dtype)(u).reshape(batch, length, heads, v_dim)
    o = o * jax.nn.silu(g)
  return fla_linear(d_model, "o_proj", dtype)(o.reshape(batch, length, heads * v_dim))


class ShortConvolution(nn.Module):
  """fla's ``ShortConvolution``: a depthwise causal convolution over the length axis, then SiLU if
  ``silu``. Parameters ``kernel`` [W, C] (and ``bias`` [C]), N(0, init_std²) / zeros."""

  width: int
  use_bias: bool = False
  silu: bool = True
  init_std: float = FLA_INIT_STD

  @nn.compact
  def __call__(self, x):
    channels = x.shape[-1]
    kernel = self.param("kernel", nn.initializers.normal(self.init_std), (self.width, channels))
    y = short_conv(x, kernel.astype(x.dtype))
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (channels,)).astype(x.dtype)
    return jax.nn.silu(y) if self.silu else y


def fla_short_convs(cfg, silu=True, **named):
  """fla's optional short convolutions of ``gla``, ``retnet`` and ``hgrn2`` (``cfg.use_short_conv``): for each
  ``name=z`` (z [B, L, H, n], in order) a :class:`ShortConvolution` ``{name}_conv1d`` of width ``cfg.conv_size``,
  bias ``cfg.conv_bias`` and SiLU if ``silu``, over the H·n channels; returns the list, shapes kept. Call it on
  packed rows (:func:`pack`) so each window holds the previous real tokens."""
  return [ShortConvolution(cfg.conv_size, cfg.conv_bias, silu, name=f"{name}_conv1d")(
      z.reshape(*z.shape[:2], -1)).reshape(z.shape) for name, z in named.items()]


def delta_rule_inputs(h, cfg, heads, dk, dv, dtype, qk_activation="silu", qk_norm="l2", use_beta=True):
  """q, k [B, L, H, K], v [B, L, H, V] and β [B, L, H] of the DeltaNet family (``deltanet``, ``gated_deltanet``,
  ``kda``) from packed rows h [B, L, D] (:func:`pack`, so the causal convolutions read the previous real tokens),
  as fla's layers: the q/k/v projections and their short convolutions (``q_proj``/``q_conv1d`` ...; float32
  parameters, N(0, ``cfg.initializer_range``²); without ``cfg.use_short_conv`` SiLU on the projections), the
  q/k activation (``qk_activation``: "silu" inside the convolution, "relu", "elu" (elu + 1) or "identity") and
  normalisation over K (``qk_norm``: "l2" or "sum"), β = sigmoid(b_proj(h)) (1 without ``use_beta``), doubled
  with ``cfg.allow_neg_eigval``."""
  batch, length = h.shape[:2]
  std = cfg.initializer_range
  qkv = []
  for name, features, silu in (("q", heads * dk, qk_activation == "silu"), ("k", heads * dk, qk_activation == "silu"),
                               ("v", heads * dv, True)):
    u = fla_linear(features, f"{name}_proj", dtype, std, param_dtype=jnp.float32)(h)
    if cfg.use_short_conv:
      u = ShortConvolution(cfg.conv_size, cfg.conv_bias, silu, std, name=f"{name}_conv1d")(u)
    elif silu:
      u = jax.nn.silu(u)
    qkv.append(u)
  q, k = (u.reshape(batch, length, heads, dk) for u in qkv[:2])
  v = qkv[2].reshape(batch, length, heads, dv)
  if qk_activation == "relu":
    q, k = jax.nn.relu(q), jax.nn.relu(k)
  elif qk_activation == "elu":
    q, k = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
  if qk_norm == "l2":
    q, k = l2_normalize(q), l2_normalize(k)
  else:
    q, k = q / q.sum(-1, keepdims=True), k / k.sum(-1, keepdims=True)
  if use_beta:
    beta = jax.nn.sigmoid(fla_linear(heads, "b_proj", dtype, std, param_dtype=jnp.float32)(h))
  else:
    beta = jnp.ones((batch, length, heads), dtype)
  if cfg.allow_neg_eigval:
    beta = 2 * beta
  return q, k, v, beta


def delta_rule_layer(module, x, mask, deterministic, decay=None, gate=None, **options):
  """The layer of the DeltaNet family (``deltanet``, ``gated_deltanet``, ``kda``) as fla's layers compute it, run
  inside ``module``'s compact ``__call__`` (config ``module.config``): x [B, L, D], mask [B, L] -> [B, L, D].

  The rows packed (:func:`pack`); q, k, v, β from :func:`delta_rule_inputs` (``options``: its qk_activation,
  qk_norm, use_beta); the log decay ``decay(h, linear, H, K, V)`` ([B, L, H] or [B, L, H, K]; none without
  ``decay``); the engine's delta rule on q·K^(-1/2); an RMSNorm over V with the weight ``o_norm`` [V] (float32);
  ⊙ ``gate(h, linear, H, K, V)`` [B, L, H, V] when given; ``o_proj``; the rows unpacked and :func:`finish`. The
  callbacks get the packed rows h [B, L, D] (in the compute dtype) and ``linear``, :func:`fla_linear` in the
  compute dtype with float32 parameters, N(0, ``initializer_range``²).
  """
  cfg = module.config
  batch, length, d_model = x.shape
  dtype = compute_dtype(x)
  mask = default_mask(x, mask)
  heads, dk, dv = cfg.dims(d_model)
  linear = functools.partial(fla_linear, dtype=dtype, std=cfg.initializer_range, param_dtype=jnp.float32)
  h, packed_mask, dest = pack(x.astype(dtype), mask)

  q, k, v, beta = delta_rule_inputs(h, cfg, heads, dk, dv, dtype, **options)  # [B, L, H, K] ×2, [B, L, H, V], [B, L, H]
  log_decay = None if decay is None else decay(h, linear, heads, dk, dv)
  o = recurrence(cfg, q * dk**-0.5, k, v, packed_mask, log_decay=log_decay, beta=beta)  # [B, L, H, V]
  o = rms_normalize(o, cfg.norm_eps) * module.param("o_norm", nn.initializers.ones, (dv,)).astype(dtype)
  if gate is not None:
    o = o * gate(h, linear, heads, dk, dv)
  y = linear(d_model, "o_proj")(o.reshape(batch, length, heads * dv))
  return finish(gather(y, dest), mask, x.dtype, cfg.dropout_rate, deterministic)


def silu_gate(h, linear, heads, dk, dv):
  """The output gate swish(g_proj(h)) [B, L, H, V] of fla's DeltaNet and Gated DeltaNet layers (``use_gate``), a
  ``gate`` of :func:`delta_rule_layer`."""
  del dk
  return jax.nn.silu(linear(heads * dv, "g_proj")(h).reshape(*h.shape[:2], heads, dv))


# ---------------------------------------------------------------- RWKV

# fla's ``xavier_uniform_(gain=2 ** -2.5)`` (RWKV6Attention's o_proj): variance_scaling, scale gain², fan_avg.
xavier_uniform_fla = nn.initializers.variance_scaling(2.0 ** -5, "fan_avg", "uniform")


def rwkv_heads(d_model: int, head_dim: int) -> tuple[int, int]:
  """(H, K): K = head_dim when it divides d_model; else H = max(1, d_model // head_dim) lowered until it
  divides d_model, K = d_model / H."""
  h = largest_divisor(d_model, max(1, d_model // max(1, head_dim)))
  return h, d_model // h


class RWKVStateSize:
  """``state_size`` of an RWKV config (its ``head_dim``); a base before ``MixerConfig``."""

  def state_size(self, length: int, d_model: int) -> int:
    """H·K·K + D = d_model·K + d_model: the H matrix states S [K, V] (V = K) and the token-shift buffer (the
    last real token, D floats); K the head dim derived from d_model (:func:`rwkv_heads`). Independent of the
    length."""
    del length
    _, k = rwkv_heads(d_model, self.head_dim)
    return d_model * k + d_model


def ramp(d: int) -> np.ndarray:
  """ddd_i = i / D [D] (RWKV-LM's channel ramp)."""
  return np.arange(d, dtype=np.float64) / d


def group_norm(o, scale, bias, eps):
  """RWKV's ``ln_x``, GroupNorm with one group per head: o [B, L, H, V] normalised over V, then ⊙ scale + bias
  ([H·V])."""
  return group_normalize(o, eps).reshape(*o.shape[:-2], -1) * scale + bias


def _take_real(x, index, valid):
  """x[b, index[b, l], :] where ``valid``, else 0."""
  index = jnp.clip(index, 0, x.shape[1] - 1)
  taken = jnp.take_along_axis(x, index[..., None], axis=1)
  return jnp.where(valid[..., None], taken, 0)


def token_shift(x, mask, causal: bool, block: int):
  """x' [B, L, D]: the previous real token of each position (zero if none), skipping padded positions.

  With ``causal=False``, in each block of ``block`` channels the first ⌈block/2⌉ take the previous real
  token and the rest the next real token (zero if none): Vision-RWKV's q-shift on one axis.
  """
  _, length, d = x.shape
  pos = jnp.arange(length)
  last_real = jax.lax.cummax(jnp.where(mask, pos, -1), axis=1)  # [B, L]: last real index <= t
  prev = jnp.concatenate([jnp.full_like(last_real[:, :1], -1), last_real[:, :-1]], axis=1)
  shifted = _take_real(x, prev, prev >= 0)
  if causal:
    return shifted
  first_real = jax.lax.cummin(jnp.where(mask, pos, length), axis=1, reverse=True)  # first real index >= t
  nxt = jnp.concatenate([first_real[:, 1:], jnp.full_like(first_real[:, :1], length)], axis=1)
  from_next = _take_real(x, nxt, nxt < length)
  backward_channels = (jnp.arange(d) % block) >= (block + 1) // 2
  return jnp.where(backward_channels, from_next, shifted)


def rwkv_linear(name, init, z, dtype):
  """RWKV's bias-free D -> D map ``name`` of z [B, L, D] (kernel initialiser ``init``, computed in ``dtype``)."""
  return nn.Dense(z.shape[-1], use_bias=False, kernel_init=init, dtype=dtype, name=name)(z)


def rwkv_receptance_key_value(xr, xk, xv, heads, dtype):
  """r, k, v [B, L, H, K]: RWKV's ``receptance``, ``key`` and ``value`` maps (orthogonal, gains 1, 0.1, 1) of
  their token-mixed inputs [B, L, D], split into ``heads``."""
  split = lambda z: z.reshape(*z.shape[:2], heads, -1)
  return (split(rwkv_linear("receptance", nn.initializers.orthogonal(1.0), xr, dtype)),
          split(rwkv_linear("key", nn.initializers.orthogonal(0.1), xk, dtype)),
          split(rwkv_linear("value", nn.initializers.orthogonal(1.0), xv, dtype)))


def both_ways(cfg, mask, read: str, **arrays):
  """The engine's causal recurrence (``read``, ``cfg.mode``, ``cfg.chunk_size``) on [B, L, ...] ``arrays`` (q,
  k, v, log_decay, a, b); with ``cfg.causal`` False plus the same recurrence on the reversed row, flipped back
  (token t is then in both passes with read="after", in neither with read="before")."""
  def run(m, **z):
    return linear_recurrence(**z, read=read, mask=m, causal=True, mode=cfg.mode, chunk_size=cfg.chunk_size)

  o = run(mask, **arrays)
  if cfg.causal:
    return o
  flip = lambda z: jnp.flip(z, axis=1)
  return o + flip(run(flip(mask), **{name: flip(z) for name, z in arrays.items()}))
