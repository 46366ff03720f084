"""Exact softmax attention through a fused kernel (``jax.nn.dot_product_attention``'s cuDNN path, Pallas) or,
where there is none, XLA's dense path or a blockwise online-softmax path in pure JAX.

Axis legend: ``B`` batch, ``L`` length, ``Q`` query positions, ``K`` key positions, ``H`` heads, ``D``
query/key head dim, ``V`` value dim, ``F`` the common feature width the Pallas kernel needs, ``N`` = B·H
merged heads, ``S`` key block, ``L'`` length padded to a multiple of S, ``G`` heads per block step.

The same function as ``vanilla`` (softmax(q kᵀ/√D) v over the allowed keys, O(L²) FLOPs: slope ≈ 2), the
exact baseline users compare efficient attentions against today. ``implementation`` picks the path, and
``resolve_implementation(config, dtype, backend)`` says which one a call runs (records carry its answer):

- ``None`` (default, "auto"): "cudnn" on an NVIDIA GPU with float16/bfloat16 inputs, "blockwise" on the CPU,
  "xla" otherwise (GPU float32/float64, TPU). Not JAX's own choice: ``jax.nn.dot_product_attention``'s
  ``implementation=None`` is ALWAYS its XLA path in JAX 0.10 (automatic cuDNN selection is a TODO there), so
  this module resolves the name itself and passes it explicitly.
- ``"xla"``: XLA's dense attention (materializes the [B, H, Q, K] logits; XLA may fuse the softmax).
- ``"cudnn"``: cuDNN's fused flash-attention kernel; NVIDIA GPUs only, float16/bfloat16 inputs only,
  head dim ≤ 256 (Hopper) or ≤ 128 and a multiple of 8, even lengths when training with a mask/bias;
  JAX raises otherwise (cuDNN itself takes V ≠ D only on Hopper with cuDNN ≥ 9.10; this core always
  passes V = D, see below). Auto picks it without seeing shapes: unsupported shapes raise, never fall back.
- ``"pallas"``: the Pallas GPU flash-attention kernel (``jax.experimental.pallas.ops.gpu.attention``,
  Triton). Never a default. Raises ``NotImplementedError`` off GPU unless ``pallas_interpret``
  (the Pallas interpreter: any backend, very slow, for tests only).
- ``"blockwise"``: FlashAttention-2's algorithm written in JAX ops (``blockwise_attention``), for backends
  without a fused kernel. A ``lax.scan`` over key blocks of S ≤ ``block_size`` (256) keys, every query of G
  heads at once (G from ``BLOCK_BYTES``: 4 at L = 1K, 1 at 4K; ``lax.map`` over head groups), with a
  running max and running sum (the sum from a ones column appended to the values, so it comes out of the
  weights-times-values product). A ``jax.custom_vjp`` saves q, k, v, the output and the log-sum-exp [N, L']
  only; its backward recomputes each block's weights and forms D_i = rowsum(dO ∘ O), dS = P ∘ (dP − D).
  Memory O(G·L'·S) per step, never [N, L', L'] (tests/test_flash.py checks the compiled scratch size). Any L
  (padded to L' with masked keys), V ≠ D, float32 and float64 kept (float64 equals ``vanilla`` to ~1e-15),
  float16/bfloat16 inputs computed in float32 and cast back. Causal blocks are masked, not skipped: causal
  costs what bidirectional costs on this path. Unfused: every block's logits pass through memory (cache).

Padding. The key mask is a general bool [B, L] (LRA's image tasks mask black pixels in the middle of the
sequence), so it is passed as ``mask=`` [B, 1, 1, K] (the XLA path broadcasts it; exactly zero weight on
masked keys) and, in the blockwise path, as an additive key bias (0 or NEG_INF, exactly zero weight).
``key_value_seq_lengths`` only expresses a real PREFIX followed by padding; ``padding="lengths"`` uses it
(number of real tokens) and is correct only for trailing padding — it exists because cuDNN takes a bias only
with the full [Q, K] extent, so ``padding="mask"`` under cuDNN materializes a [B, 1, L, L] additive bias (O(L²)
memory again), while lengths need none. The Pallas kernel expresses the general mask with segment ids (real
tokens segment 1, padding segment 0). Outputs of padded queries are set to zero, so rows of fully padded
examples are finite whatever the kernel does with them (the blockwise path gives them 0 and 0 gradients).

Dropout. No path here has attention dropout. With ``dropout_rate > 0`` in training (``deterministic=False``)
the call runs the explicit ``vanilla`` core (same function, inverted dropout on the probabilities from the
``"dropout"`` stream), whatever ``implementation`` says, and ``resolve_implementation`` answers
``"explicit (training dropout)"`` for it, so a record never calls that run "cudnn" or "blockwise"; evaluation
always uses the resolved path.

What CPU numbers can and cannot say: on CPU "xla" and "blockwise" run ("cudnn" raises, "pallas" needs the
interpreter), both unfused. "xla" is XLA's dense attention, same O(L²) memory as ``vanilla`` and slower than
it. "blockwise" (the CPU default) keeps O(L·S) memory and, on one thread of an AVX2 AMD EPYC (B=1, H=8, D=64,
float32, forward + backward, ``scripts/cpu_attention_vs_sdpa.py``), takes 0.60-0.69x ``vanilla``'s time and
1.04-1.07x that of PyTorch's fused CPU flash kernel (``scaled_dot_product_attention``) at L = 1K-4K. On
GPU/TPU the fused kernels' advantage is memory traffic: they never write the L×L probabilities to HBM (O(L)
extra memory, fewer bytes moved), which is where they beat most "efficient" attentions in wall time up to
several thousand tokens. Those claims need GPU runs with ``implementation="cudnn"`` or ``"pallas"`` (or auto
with half-precision inputs). The cuDNN and native Pallas paths are not exercised by the CPU test suite; the
Pallas kernel is tested through its interpreter.

Differences from ``jax.nn.dot_product_attention`` used directly (and from ``vanilla``):

- Padded query rows are zeroed (``vanilla`` lets them attend to the real keys; real rows are equal).
- Training dropout runs the explicit ``vanilla`` path (above).
- The kernels need V = D: query/key and value are zero-padded to one head width max(D, V) (the Pallas
  path: a power of two ≥ 16, and the length to a multiple of its block size in the padding segment),
  with the scale kept at 1/√D. This changes no real output, only costs the padded columns. The blockwise
  path takes V ≠ D as is.
- The XLA path always runs its softmax in float32, so float64 inputs give float32-accurate results
  (``vanilla`` and the blockwise path keep float64); tests compare XLA's path at float32 tolerance.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention
from attention_zoo.vanilla import VanillaAttention, VanillaConfig

IMPLEMENTATIONS = (None, "xla", "cudnn", "pallas", "blockwise")
# What ``resolve_implementation`` answers when training dropout sends the call to the explicit ``vanilla`` core.
EXPLICIT_DROPOUT = "explicit (training dropout)"
# cuDNN's fused attention refuses odd query/key lengths when training with a bias (the key mask becomes one):
# jax/_src/cudnn/fused_attention_stablehlo.py ``check_is_flash_attention``; the "cudnn" path pads to a multiple.
CUDNN_LENGTH_MULTIPLE = 2
# Half-precision input dtypes cuDNN's fused attention takes (it rejects float32 and float64).
CUDNN_DTYPES = (jnp.float16, jnp.bfloat16)
# Largest key block of the blockwise path. Measured on XLA:CPU, one thread of an AVX2 AMD EPYC, B=1, H=8, D=64,
# float32 forward + backward, one head per step, best process CPU time of 4: L=2048: S=64 660 ms, 128 613 ms,
# 256 548 ms; L=4096: S=128 2221 ms, 256 2163 ms, 512 2238 ms.
BLOCK_SIZE = 256
# Bytes of one [G, L', S] block array the blockwise path aims for (G heads per step; at least one head). At
# L=1024 G=1, 2, 4, 8 measured alike (159-161 ms); larger G only adds memory.
BLOCK_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class FlashConfig(AttentionConfig):
  """Exact attention options (which implementation, padding form, block size).

  Attributes:
    implementation: None (auto: ``resolve_implementation``), "xla", "cudnn", "pallas" or "blockwise" (see
      module doc).
    padding: "mask" (general key mask, default) or "lengths" (``key_value_seq_lengths``; correct only
      when every example's real tokens precede its padding). Ignored by "pallas" (segment ids) and
      "blockwise" (it always takes the general mask; no cost difference there).
    pallas_interpret: run the Pallas kernel in the interpreter (any backend; tests only, very slow).
    block_size: largest key block S of the "blockwise" path (default ``BLOCK_SIZE``); tests use small
      blocks to cover many blocks at short lengths.
  """

  family = "exact"
  implementation: str | None = None
  padding: str = "mask"
  pallas_interpret: bool = False
  block_size: int = BLOCK_SIZE

  def __post_init__(self):
    if self.implementation not in IMPLEMENTATIONS:
      raise ValueError(f"flash implementation must be one of {IMPLEMENTATIONS}, got {self.implementation!r}")
    if self.padding not in ("mask", "lengths"):
      raise ValueError(f"flash padding must be 'mask' or 'lengths', got {self.padding!r}")
    if self.block_size < 1:
      raise ValueError(f"flash block_size must be >= 1, got {self.block_size!r}")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·L: exact attention, the keys and values of every past position (the KV cache)."""
    return 2 * num_heads * head_dim * length

  def support(self, length: int) -> np.ndarray:
    """Every pair (exact attention), or j ≤ i when causal."""
    full = np.ones((length, length), bool)
    return np.tril(full) if self.causal else full


def _next_pow2(n: int, minimum: int = 16) -> int:
  return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def pallas_attention(query, key, value, mask, causal: bool, interpret: bool) -> jax.Array:
  """Pallas GPU flash attention with a general key mask (segment ids): [B, L, H, D|V] -> [B, L, H, V].

  Pads L to a multiple of the block size (padded positions in the padding segment) and the head dims to
  one power of two F ≥ 16 with zeros (zero features change no dot product; zero value columns are cut).
  """
  from jax.experimental.pallas.ops.gpu import attention as pallas_gpu  # GPU-only module, import lazily

  if jax.default_backend() != "gpu" and not interpret:
    raise NotImplementedError("flash implementation='pallas' needs a GPU (Triton kernel); "
                              "pallas_interpret=True runs it in the interpreter")
  length, head_dim, value_dim = query.shape[1], query.shape[-1], value.shape[-1]
  block = min(128, _next_pow2(length))
  query, key, value = (_common.pad_axis(x, block, axis=1)
                       for x in common_width(query, key, value, _next_pow2(max(head_dim, value_dim))))
  segments = _common.pad_axis(mask, block, axis=1, value=False).astype(jnp.int32)     # [B, L']
  sizes = pallas_gpu.BlockSizes(block_q=block, block_k=block, block_q_dkv=block, block_kv_dkv=block,
                                block_q_dq=block, block_kv_dq=block)
  out = pallas_gpu.mha(query, key, value, segments, sm_scale=1.0 / math.sqrt(head_dim),
                       causal=causal, block_sizes=sizes, interpret=interpret)
  return out[:, :length, :, :value_dim]


def common_width(query, key, value, width: int | None = None):
  """Zero-pads the head dims of query/key [B, L, H, D] and value [B, L, H, V] to one width F (default
  max(D, V)): the kernels need V = D. Zero features change no dot product; extra value columns are 0."""
  width = width or max(query.shape[-1], value.shape[-1])
  return tuple(jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])]) for x in (query, key, value))


def resolve_implementation(config: FlashConfig, dtype, backend: str | None = None, *,
                           training_dropout: bool | None = None) -> str:
  """The implementation a ``flash`` call with this config, input dtype and backend actually runs.

  ``backend``: ``jax.default_backend()`` when None ("cpu", "gpu"/"cuda", "tpu", ...). ``training_dropout``:
  whether the call trains with attention dropout; None reads it from the config (``dropout_rate > 0``), so a
  caller describing an evaluation call passes a config with ``dropout_rate=0`` (or ``training_dropout=False``).

  - Training dropout (any implementation): ``EXPLICIT_DROPOUT``, "explicit (training dropout)": no path here
    has attention dropout, the explicit ``vanilla`` core runs (never silently: this is the answer).
  - An explicit ``config.implementation`` resolves to itself ("xla", "cudnn", "pallas", "blockwise"; "cudnn"
    or native "pallas" where they cannot run raise when the call is traced, they never fall back).
  - ``None`` (auto): "cudnn" on an NVIDIA GPU ("gpu"/"cuda") with float16/bfloat16 inputs; "blockwise" on the
    CPU (every dtype: XLA:CPU has no fused kernel, and the blockwise path is faster than ``vanilla`` and than
    XLA's dense path there, and keeps float64 exact); "xla" otherwise: GPU with float32/float64 inputs (cuDNN
    takes no float32; the blockwise path's sequential scan over blocks is tuned for XLA:CPU and unmeasured on
    GPUs, where XLA's dense path keeps the device busy; choose "blockwise" explicitly where the L×L logits do
    not fit), TPU, other backends. A "gpu" backend is taken to be NVIDIA's (on ROCm name the implementation).

  This function sees no shapes: on a GPU it answers "cudnn" for every half-precision call, and cuDNN's own
  limits (head dim <= 256 on Hopper / <= 128 and a multiple of 8 elsewhere, even lengths when training with a
  mask) are checked by JAX when the kernel is built, which raises; such shapes need ``implementation="xla"``
  or ``"blockwise"``. "blockwise" and "xla" are unfused (XLA ops, no fused kernel); "cudnn" and "pallas" are
  the fused kernels. Confirm "cudnn" in a compiled program by its ``__cudnn$fmha`` custom call.
  """
  if training_dropout is None:
    training_dropout = config.dropout_rate > 0.0
  if training_dropout:
    return EXPLICIT_DROPOUT
  if config.implementation is not None:
    return config.implementation
  backend = (backend or jax.default_backend()).lower()
  if backend in ("gpu", "cuda") and jnp.dtype(dtype) in CUDNN_DTYPES:
    return "cudnn"
  if backend == "cpu":
    return "blockwise"
  return "xla"


def block_layout(length: int, block_size: int, heads: int, itemsize: int = 4) -> tuple[int, int, int]:
  """(S, L', G) of the blockwise path: key block S <= ``block_size``, padded length L' (a multiple of S),
  heads per step G (a divisor of ``heads`` = B·H with one [G, L', S] block of ``itemsize`` bytes at most
  ``BLOCK_BYTES``; at least 1). S is chosen so that L' - L is small: the length splits into ceil(L /
  block_size) blocks of nearly equal size, rounded up to a multiple of 8 (when ``block_size`` allows)."""
  blocks = -(-length // block_size)
  size = -(-length // blocks)
  size = min(block_size, -(-size // 8) * 8)
  padded = -(-length // size) * size
  group = max([g for g in range(1, heads + 1) if heads % g == 0 and g * padded * size * itemsize <= BLOCK_BYTES]
              or [1])
  return size, padded, group


def blockwise_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array, causal: bool,
                        block_size: int = BLOCK_SIZE) -> jax.Array:
  """Exact softmax attention over key blocks with an online softmax: [B, L, H, D|V] -> [B, L, H, V].

  query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] (key padding, any pattern). Computes in
  float32, or float64 for float64 inputs (bfloat16/float16 inputs are upcast; the output is cast back to
  ``value.dtype``). Heads are merged into N = B·H rows, L is padded to L' (a multiple of the key block S,
  padded keys masked; see ``block_layout``), and ``_blockwise`` runs on [N, L', D|V]. Holds O(G·L'·S) per
  step, never [N, L', L'] logits, in forward and backward. Rows of queries with no allowed key are 0.
  """
  batch, length, heads, _ = query.shape
  dtype = _common.accum_dtype(query, key, value)
  size, padded, group = block_layout(length, block_size, batch * heads, jnp.dtype(dtype).itemsize)
  merged = [_common.pad_axis(_common.merge_heads(x.astype(dtype)), size, axis=1) for x in (query, key, value)]
  bias = jnp.where(mask, 0.0, _common.NEG_INF).astype(dtype)                         # [B, L]
  bias = jnp.repeat(_common.pad_axis(bias, size, axis=1, value=_common.NEG_INF), heads, axis=0)   # [N, L']
  out = _blockwise(*merged, bias, causal, size, group)                                # [N, L', V]
  return _common.split_heads(out[:, :length], heads).astype(value.dtype)


def _split(x: jax.Array, group: int) -> jax.Array:
  """[N, ...] -> [N / G, G, ...]: the head groups ``lax.map`` walks through."""
  return x.reshape(x.shape[0] // group, group, *x.shape[1:])


def _key_blocks(x: jax.Array, size: int) -> jax.Array:
  """[G, L', X] -> [L' / S, G, S, X] (or [G, L'] -> [L' / S, G, S]): the key blocks a scan walks through."""
  blocks = x.reshape(x.shape[0], x.shape[1] // size, size, *x.shape[2:])
  return jnp.swapaxes(blocks, 0, 1)


def _block_logits(query, key, bias, index, causal: bool):
  """Logits [G, L', S] of all queries (already scaled by 1/√D) against key block ``index`` (keys [G, S, D],
  additive key bias [G, S]: 0 or NEG_INF); NEG_INF above the diagonal when causal."""
  logits = jnp.einsum("gqd,gkd->gqk", query, key) + bias[:, None, :]
  if causal:
    size = key.shape[1]
    positions = index * size + jnp.arange(size)                                      # [S] key positions
    allowed = positions[None, :] <= jnp.arange(query.shape[1])[:, None]               # [L', S]
    logits = jnp.where(allowed, logits, _common.NEG_INF)
  return logits


def _forward_group(query, key, value, bias, causal: bool, size: int):
  """One head group, FlashAttention-2's forward over key blocks: query, key [G, L', D], value [G, L', V],
  bias [G, L'] -> (output [G, L', V], log-sum-exp [G, L']).

  Running max ``peak`` [G, L'] and accumulator [G, L', V + 1] whose last column is the running sum of the
  weights (a ones column appended to the values: the sum comes out of the same matrix product, no reduction
  pass). The max starts at NEG_INF / 2, so masked logits (NEG_INF) get weight exp(<= -5e29) = 0 even in a
  row with no allowed key so far; such a row ends with sum 0: output 0, log-sum-exp 0 (the backward then
  gives its masked logits weight 0 too).
  """
  groups, padded, head_dim = query.shape
  query = query * (1.0 / math.sqrt(head_dim))
  ones = jnp.ones((groups, padded, 1), value.dtype)
  xs = (jnp.arange(padded // size), _key_blocks(key, size),
        _key_blocks(jnp.concatenate([value, ones], axis=-1), size), _key_blocks(bias, size))

  def step(carry, block):
    peak, acc = carry
    index, key_j, value_j, bias_j = block
    logits = _block_logits(query, key_j, bias_j, index, causal)                       # [G, L', S]
    new_peak = jnp.maximum(peak, jnp.max(logits, axis=-1))
    weights = jnp.exp(logits - new_peak[..., None])
    acc = acc * jnp.exp(peak - new_peak)[..., None] + jnp.einsum("gqk,gkv->gqv", weights, value_j)
    return (new_peak, acc), None

  init = (jnp.full((groups, padded), _common.NEG_INF / 2, query.dtype),
          jnp.zeros((groups, padded, value.shape[-1] + 1), query.dtype))
  (peak, acc), _ = jax.lax.scan(step, init, xs)
  total = acc[..., -1]
  real = total > 0
  safe = jnp.where(real, total, 1.0)
  return acc[..., :-1] / safe[..., None], jnp.where(real, peak + jnp.log(safe), 0.0)


def _backward_group(query, key, value, bias, out, lse, d_out, causal: bool, size: int):
  """One head group, FlashAttention-2's backward: recomputes each block's weights P = exp(logits - lse) from
  q, k and the saved log-sum-exp, D_i = rowsum(dO ∘ O), dS = P ∘ (dP - D) with dP = dO vᵀ. Shapes as
  ``_forward_group``; returns (dq, dk, dv). The key and value gradients come out transposed ([G, D|V, S] per
  block: dkᵀ = qᵀ dS, dvᵀ = dOᵀ P, contracted over L' with row-major operands, the fast form of XLA:CPU's
  matrix product; ``dS``ᵀ q measured at a third of its speed) and are transposed back once at the end."""
  groups, padded, head_dim = query.shape
  scale = 1.0 / math.sqrt(head_dim)
  query = query * scale
  query_t, d_out_t = jnp.swapaxes(query, 1, 2), jnp.swapaxes(d_out, 1, 2)            # [G, D|V, L']
  delta = jnp.sum(d_out * out, axis=-1)                                               # [G, L']
  xs = (jnp.arange(padded // size), _key_blocks(key, size), _key_blocks(value, size), _key_blocks(bias, size))

  def step(d_query, block):
    index, key_j, value_j, bias_j = block
    weights = jnp.exp(_block_logits(query, key_j, bias_j, index, causal) - lse[..., None])   # [G, L', S]
    d_weights = jnp.einsum("gqv,gkv->gqk", d_out, value_j)
    d_logits = weights * (d_weights - delta[..., None])
    d_value_t = jnp.einsum("gvq,gqk->gvk", d_out_t, weights)
    d_key_t = jnp.einsum("gdq,gqk->gdk", query_t, d_logits)
    return d_query + jnp.einsum("gqk,gkd->gqd", d_logits, key_j), (d_key_t, d_value_t)

  d_query, (d_key_t, d_value_t) = jax.lax.scan(step, jnp.zeros_like(query), xs)   # [L' / S, G, D|V, S]

  def unblock(x):
    return jnp.swapaxes(x, 0, 1).swapaxes(2, 3).reshape(groups, padded, -1)          # [G, L', D|V]

  return d_query * scale, unblock(d_key_t), unblock(d_value_t)


def _over_groups(fn, group: int, *arrays):
  """``fn`` on head groups of G rows, one group after the other (``lax.map``), outputs merged back to N rows."""
  outs = jax.lax.map(lambda xs: fn(*xs), [_split(x, group) for x in arrays])
  return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), outs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _blockwise(query, key, value, bias, causal: bool, size: int, group: int) -> jax.Array:
  """Blockwise attention on merged heads: query, key [N, L', D], value [N, L', V], additive key bias [N, L']
  (0 or NEG_INF) -> [N, L', V]. A custom VJP: the residuals are q, k, v, bias, the output and the
  log-sum-exp [N, L'] (O(L') per row), the backward recomputes the block logits."""
  return _blockwise_fwd(query, key, value, bias, causal, size, group)[0]


def _blockwise_fwd(query, key, value, bias, causal, size, group):
  forward = functools.partial(_forward_group, causal=causal, size=size)
  out, lse = _over_groups(forward, group, query, key, value, bias)
  return out, (query, key, value, bias, out, lse)


def _blockwise_bwd(causal, size, group, residuals, d_out):
  backward = functools.partial(_backward_group, causal=causal, size=size)
  d_query, d_key, d_value = _over_groups(backward, group, *residuals, d_out)
  return d_query, d_key, d_value, jnp.zeros_like(residuals[3])   # the bias comes from a bool mask


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


@register_attention("flash", FlashConfig)
class FlashAttention(nn.Module):
  """softmax(q kᵀ/√D + mask) v through the implementation ``resolve_implementation`` names (a fused kernel,
  XLA's dense path, the blockwise path, or the explicit ``vanilla`` core for training dropout)."""

  config: FlashConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    training_dropout = cfg.dropout_rate > 0.0 and not deterministic
    implementation = resolve_implementation(cfg, jnp.result_type(query, key, value),
                                            training_dropout=training_dropout)
    if implementation == EXPLICIT_DROPOUT:
      explicit = VanillaAttention(VanillaConfig(causal=cfg.causal, dropout_rate=cfg.dropout_rate))
      return explicit(query, key, value, mask, deterministic=False)
    if implementation == "pallas":
      out = pallas_attention(query, key, value, mask, cfg.causal, cfg.pallas_interpret)
    elif implementation == "blockwise":
      out = blockwise_attention(query, key, value, mask, cfg.causal, cfg.block_size)
    else:
      out = self._fused(query, key, value, mask, implementation)
    return jnp.where(mask[:, :, None, None], out, 0).astype(value.dtype)   # [B, Q, H, V]

  def _fused(self, query, key, value, mask, implementation: str):
    """``jax.nn.dot_product_attention`` ("xla" or "cudnn") with the key mask as ``mask=`` or
    ``key_value_seq_lengths``."""
    cfg = self.config
    length, value_dim = value.shape[1], value.shape[-1]
    if implementation == "cudnn" and length % CUDNN_LENGTH_MULTIPLE:
      # cuDNN refuses odd lengths when training with a bias (the mask becomes one), e.g. the LRA Text model's
      # L + 1 positions with its CLS token: pad with masked keys (trailing, so "lengths" stays right), cut after
      query, key, value = (_common.pad_axis(x, CUDNN_LENGTH_MULTIPLE, axis=1) for x in (query, key, value))
      mask = _common.pad_axis(mask, CUDNN_LENGTH_MULTIPLE, axis=1, value=False)
    batch, padded = mask.shape
    padding = {}
    if cfg.padding == "lengths":
      padding["key_value_seq_lengths"] = jnp.sum(mask, axis=1, dtype=jnp.int32)    # [B]
    else:
      keys = mask[:, None, None, :]                                                 # [B, 1, 1, K]
      if implementation == "cudnn":   # cuDNN takes a bias only with the full [Q, K] extent
        keys = jnp.broadcast_to(keys, (batch, 1, padded, padded))
      padding["mask"] = keys
    dtype, scale = jnp.result_type(query, key, value), 1.0 / math.sqrt(query.shape[-1])
    query, key, value = common_width(*(x.astype(dtype) for x in (query, key, value)))
    out = jax.nn.dot_product_attention(query, key, value, scale=scale,
                                       is_causal=cfg.causal, implementation=implementation,
                                       **padding)
    return out[:, :length, :, :value_dim]
