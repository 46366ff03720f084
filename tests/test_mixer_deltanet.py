"""DeltaNet mixer (attention_zoo/mixers/deltanet.py), float64: the whole layer against a numpy transcription of
fla's token-by-token reference (``fla/ops/delta_rule/naive.py`` ``delta_rule_recurrence``) built from the
module's own parameters, causal and bidirectional; mode "chunk" against mode "recurrent" (outputs and
gradients); padding at the end and in the middle of a row against the row with its padding removed; causality;
``state_size``; the conformance kit.

The numpy helpers here (short convolution, norms, the bidirectional backward pass, the comparison) are shared
with tests/test_mixer_gated_deltanet.py and tests/test_mixer_kda.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo

RTOL = 1e-9  # float64 comparisons: max |a − b| ≤ RTOL · max |b|
LENGTH = 13  # one shape [2, 13, D] for most calls: op-by-op execution compiles each op once per shape


# ---------------------------------------------------------------- numpy helpers (float64)

def silu(x):
  return x / (1 + np.exp(-x))


def sigmoid(x):
  return 1 / (1 + np.exp(-x))


def softplus(x):
  return np.logaddexp(0.0, x)


def l2norm(x, eps=1e-6):
  """fla/modules/l2norm.py: x / sqrt(Σx² + eps) over the last axis."""
  return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def rmsnorm(x, weight, eps):
  """fla RMSNorm: x / sqrt(mean x² + eps) · weight over the last axis."""
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def short_conv(x, weight):
  """fla ShortConvolution (Conv1d, groups = C, padding W − 1, first L outputs) then SiLU: x [B, L, C], weight
  [W, C] (flax layout; torch's [C, 1, W] is its transpose): y_t = Σ_i w_i x_{t−W+1+i}."""
  width, length = weight.shape[0], x.shape[1]
  padded = np.concatenate([np.zeros((x.shape[0], width - 1, x.shape[2])), x], axis=1)
  return silu(sum(weight[i] * padded[:, i:i + length] for i in range(width)))


def params64(variables):
  """The parameter tree as float64 numpy arrays."""
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), variables["params"])


def backward_pass(q, k, v, beta, log_decay=None):
  """The backward half of the bidirectional layer (``linear_recurrence(..., causal=False)``): the same delta rule
  over the reversed sequence, reading before writing, the decay between positions t < j being Π_{t<i≤j} α_i as
  in the forward pass. q (scaled), k [B, L, H, K], v [B, L, H, V], beta [B, L, H], log_decay None,
  [B, L, H] or [B, L, H, K]. Returns [B, L, H, V]:

      R_L = 0;  for t = L−1 … 0:  R' = Diag(α_{t+1}) R_{t+1} (α_L = 1),  o_t = R'ᵀ q_t,
                                   R_t = R' + β_t k_t (v_t − R'ᵀ k_t)ᵀ
  """
  bsz, length, heads, dk = q.shape
  if log_decay is None:
    log_decay = np.zeros((bsz, length, heads, dk))
  elif log_decay.ndim == 3:
    log_decay = np.broadcast_to(log_decay[..., None], (bsz, length, heads, dk))
  state = np.zeros((bsz, heads, dk, v.shape[-1]))
  out = np.zeros(v.shape)
  for t in range(length - 1, -1, -1):
    if t + 1 < length:
      state = np.exp(log_decay[:, t + 1])[..., None] * state
    out[:, t] = np.einsum("bhk,bhkv->bhv", q[:, t], state)
    err = v[:, t] - np.einsum("bhkv,bhk->bhv", state, k[:, t])
    state = state + beta[:, t, :, None, None] * np.einsum("bhk,bhv->bhkv", k[:, t], err)
  return out


def assert_close(got, want, rtol=RTOL):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape
  scale = max(np.abs(want).max(), 1e-300)
  err = np.abs(got - want).max()
  assert err <= rtol * scale, f"max |got − want| = {err:.3e} > {rtol:g} · {scale:.3e}"


def random_rows(seed, batch, length, d):
  return np.random.default_rng(seed).normal(size=(batch, length, d))


def make(name, **overrides):
  """(module, apply(variables, x, mask)) for mixer ``name`` (op by op: at these sizes compiling a jit costs more
  than it saves)."""
  module = attention_zoo.create_mixer(name, **overrides)
  return module, lambda variables, x, mask: module.apply(variables, x, mask)


def init(module, x, mask, seed=0):
  return module.init(jax.random.key(seed), jnp.asarray(x), jnp.asarray(mask))


def check_chunk_equals_recurrent(name, x, mask, **overrides):
  """mode "chunk" (chunk_size 4: several chunks and a partial last one) against mode "recurrent": outputs and
  the gradients of a random projection of the outputs w.r.t. every parameter and the input."""
  chunk, _ = make(name, mode="chunk", chunk_size=4, **overrides)
  recurrent, _ = make(name, mode="recurrent", **overrides)
  variables = init(chunk, x, mask)
  weights = jnp.asarray(np.random.default_rng(9).normal(size=x.shape))

  def loss(module):
    return jax.value_and_grad(
        lambda params, x: (module.apply({"params": params}, x, jnp.asarray(mask)) * weights).sum(), argnums=(0, 1))

  (value_c, grads_c), (value_r, grads_r) = (loss(m)(variables["params"], jnp.asarray(x)) for m in (chunk, recurrent))
  out_c = chunk.apply(variables, jnp.asarray(x), jnp.asarray(mask))
  out_r = recurrent.apply(variables, jnp.asarray(x), jnp.asarray(mask))
  assert_close(out_c, out_r)
  assert_close(value_c, value_r)
  for path, g_r in jax.tree_util.tree_leaves_with_path(grads_r):
    g_c = dict(jax.tree_util.tree_leaves_with_path(grads_c))[path]
    assert np.abs(np.asarray(g_r)).max() > 0, f"zero gradient for {jax.tree_util.keystr(path)}"
    assert_close(g_c, g_r)


def check_padding(name, causal, d, **overrides):
  """Row 0 padded at its end, row 1 in the middle (and at its end), the padded positions holding non-zero
  content (a worst case: the encoder zeroes them): the real outputs equal those of the rows with their padded
  positions removed; padded outputs are 0."""
  module, apply = make(name, causal=causal, **overrides)
  mask = np.ones((2, LENGTH), bool)
  mask[0, 10:] = False
  mask[1, [2, 3, 12]] = False
  x = random_rows(3, 2, LENGTH, d)
  variables = init(module, x, mask)
  out = np.asarray(apply(variables, jnp.asarray(x), jnp.asarray(mask)))
  cut = np.stack([x[row, mask[row]] for row in range(2)])  # both rows keep 10 tokens
  short = np.asarray(apply(variables, jnp.asarray(cut), jnp.ones(cut.shape[:2], bool)))
  assert_close(out[mask], short.reshape(-1, d))
  assert np.all(out[~mask] == 0)


def check_causal(name, d, **overrides):
  """causal=True: changing the tokens after position i leaves the outputs up to i unchanged; the bidirectional
  layer's outputs do change."""
  i = 6
  x = random_rows(5, 2, LENGTH, d)
  x2 = x.copy()
  x2[:, i + 1:] += random_rows(6, 2, LENGTH - i - 1, d)
  mask = np.ones((2, LENGTH), bool)
  for causal in (True, False):
    module, apply = make(name, causal=causal, **overrides)
    variables = init(module, x, mask)
    out, out2 = (np.asarray(apply(variables, jnp.asarray(z), jnp.asarray(mask))) for z in (x, x2))
    assert not np.allclose(out[:, i + 1:], out2[:, i + 1:])
    if causal:
      np.testing.assert_array_equal(out[:, :i + 1], out2[:, :i + 1])
    else:
      assert not np.allclose(out[:, :i + 1], out2[:, :i + 1])


def check_conformance(name):
  """The repo's conformance kit (``lra_bench.testing``; ``lra_bench.mixer_testing`` before the kits merged)."""
  try:
    from lra_bench.testing import assert_conformant
  except ImportError:
    from lra_bench.mixer_testing import assert_conformant
  assert_conformant(name)


# ---------------------------------------------------------------- DeltaNet

D = 16  # d_model: 4 heads of K = V = 4
STD = 0.5  # initializer_range for the comparisons: O(1) activations instead of the 0.02 default's tiny ones


def delta_rule_recurrence(q, k, v, beta):
  """float64 transcription of fla/ops/delta_rule/naive.py ``delta_rule_recurrence`` (q, k, v [b, h, l, d],
  beta [b, h, l]; q scaled by d_k^−½ inside; no initial state): o [b, h, l, d_v]."""
  b, h, length, d_k = q.shape
  d_v = v.shape[-1]
  o = np.zeros_like(v)
  state = np.zeros((b, h, d_k, d_v))
  q = q * d_k**-0.5
  beta = beta[..., None]
  for i in range(length):
    _k, _q, _v = k[:, :, i], q[:, :, i], v[:, :, i].copy()
    _v = _v - (state * _k[..., None]).sum(-2)
    _v = _v * beta[:, :, i]
    state = state + _k[..., None] * _v[..., None, :]
    o[:, :, i] = np.einsum("bhd,bhdm->bhm", _q, state)
  return o


def reference_deltanet(p, x, causal, heads=4, eps=1e-5):
  """The DeltaNet layer (fla/layers/delta_net.py forward, default options) in numpy from the parameters."""
  bsz, length, _ = x.shape
  q, k, v = (short_conv(x @ p[f"{n}_proj"]["kernel"], p[f"{n}_conv1d"]["kernel"]) for n in "qkv")
  q, k, v = (u.reshape(bsz, length, heads, -1) for u in (q, k, v))
  q, k = l2norm(q), l2norm(k)
  beta = sigmoid(x @ p["b_proj"]["kernel"])  # [B, L, H]
  hm = lambda u: np.swapaxes(u, 1, 2)  # [B, L, H, ...] <-> [B, H, L, ...]
  o = hm(delta_rule_recurrence(hm(q), hm(k), hm(v), hm(beta)))
  if not causal:
    o = o + backward_pass(q * q.shape[-1]**-0.5, k, v, beta)
  o = rmsnorm(o, p["o_norm"], eps).reshape(bsz, length, -1)
  return o @ p["o_proj"]["kernel"]


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_matches_fla_naive_reference(x64, mode):
  x = random_rows(1, 2, LENGTH, D)
  mask = np.ones((2, LENGTH), bool)
  for causal in (True, False):
    module, apply = make("deltanet", causal=causal, mode=mode, chunk_size=4, initializer_range=STD)
    variables = init(module, x, mask)
    out = apply(variables, jnp.asarray(x), jnp.asarray(mask))
    assert out.dtype == jnp.float64 and out.shape == x.shape
    assert_close(out, reference_deltanet(params64(variables), x, causal))


@pytest.mark.parametrize("causal", [True, False])
def test_chunk_equals_recurrent(x64, causal):
  x = random_rows(2, 2, LENGTH, D)
  mask = np.ones((2, LENGTH), bool)
  mask[0, 9:] = False
  check_chunk_equals_recurrent("deltanet", x, mask, causal=causal, initializer_range=STD)


@pytest.mark.parametrize("causal", [True, False])
def test_padding_end_and_middle(x64, causal):
  check_padding("deltanet", causal, D, initializer_range=STD)


def test_causal(x64):
  check_causal("deltanet", D, initializer_range=STD)


def test_state_size_and_heads():
  cfg = attention_zoo.mixer_config("deltanet")
  # d_model 16: 4 heads, K = V = 4; H·K·V + (W − 1)·H·(2K + V) = 64 + 3·4·12
  assert cfg.dims(16) == (4, 4, 4) and cfg.state_size(1000, 16) == 64 + 144
  # d_model 64: 4 heads of 16: 4·16·16 + 3·4·48
  assert cfg.dims(64) == (4, 16, 16) and cfg.state_size(10, 64) == 1024 + 576
  # a width 4 does not divide: gcd(4, 6, 6) = 2 heads of 3
  assert cfg.dims(6) == (2, 3, 3)
  no_conv = attention_zoo.mixer_config("deltanet", use_short_conv=False)
  assert no_conv.state_size(10, 64) == 1024
  assert type(cfg).family == "linear-recurrent" and type(cfg).paper_name == "DeltaNet"


def test_options_trace():
  """The non-default options of fla's layer (gate, sum norm, elu/relu, no conv, no beta, negative eigenvalues)
  build and trace to the right shapes (``jax.eval_shape``: nothing is compiled)."""
  x = jax.ShapeDtypeStruct((2, LENGTH, D), jnp.float32)
  mask = jax.ShapeDtypeStruct((2, LENGTH), jnp.bool_)
  for overrides in ({"use_gate": True, "qk_norm": "sum", "qk_activation": "elu", "conv_bias": True},
                    {"use_short_conv": False, "use_beta": False, "allow_neg_eigval": True,
                     "qk_activation": "relu"}):
    module = attention_zoo.create_mixer("deltanet", **overrides)
    params = jax.eval_shape(module.init, jax.random.key(0), x, mask)["params"]
    assert ("g_proj" in params) == overrides.get("use_gate", False)
    assert ("b_proj" in params) == overrides.get("use_beta", True)
    assert ("q_conv1d" in params) == overrides.get("use_short_conv", True)
    out = jax.eval_shape(module.apply, {"params": params}, x, mask)
    assert out.shape == x.shape and out.dtype == jnp.float32
  with pytest.raises(ValueError, match="qk_norm"):
    attention_zoo.mixer_config("deltanet", qk_norm="max")


def test_conformance():
  check_conformance("deltanet")
