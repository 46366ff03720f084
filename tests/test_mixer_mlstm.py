"""mLSTM mixer (attention_zoo/mixers/mlstm.py): the whole layer against a float64 numpy transcription of
NX-AI/xlstm's mLSTM layer built on its token-by-token ``recurrent_step_stabilized_simple`` (and its
``parallel_stabilized_simple``), chunk == recurrent (outputs and gradients, causal and bidirectional),
padding at the end and in the middle, causality, the initialisation and ``state_size``.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import registry
from attention_zoo.mixers import mlstm
from tests import mixer_forms as forms

D, B = 16, 2  # the x64 fixture (float64 inside a test, restored after) is tests/conftest.py's


def make(**overrides):
  return mlstm.MLSTM(mlstm.MLSTMConfig(**overrides))


def inputs(seed, length, batch=B, d=D):
  return jnp.asarray(forms.rows(seed, batch, length, d), jnp.float64)


def init(module, x, mask=None, seed=0):
  return forms.init(module, x, mask, seed)["params"]


def shapes(x):
  """The parameter tree's shapes at d_model x.shape[-1] (no initialisation run)."""
  return jax.eval_shape(make().init, jax.random.PRNGKey(0), x, jnp.ones(x.shape[:2], bool))["params"]


def randomised(params, seed):
  """Every parameter redrawn (float64) so that nothing sits at its special init value: the gates vary from
  token to token (igate spans several units, so the stabiliser m_t moves), the norm scale is not 1."""
  rng = np.random.default_rng(seed)
  scales = {"igate": 0.5, "fgate": 0.3, "conv1d_kernel": 0.5, "conv1d_bias": 0.3, "outnorm_weight": 0.3,
            "learnable_skip": 0.5}

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    scale = next((s for key, s in scales.items() if key in name), 0.4)
    value = rng.normal(size=leaf.shape) * scale
    if "fgate" in name and "bias" in name:
      value = value + 2.0
    return jnp.asarray(value, jnp.float64)

  return jax.tree_util.tree_map_with_path(draw, params)


# ------------------------------------------------------------------------------------------------------
# float64 numpy transcription of NX-AI/xlstm's mLSTMLayer (layer.py, cell.py, backends.py, components/*)


def recurrent_step_stabilized_simple(c_state, n_state, m_state, q, k, v, igate_preact, fgate_preact, eps):
  """One step, per (batch, head): c [K, K], n [K], m scalar; q, k, v [K]; gates scalars."""
  log_fg = forms.log_sigmoid(fgate_preact)
  m_new = max(log_fg + m_state, igate_preact)
  fg = np.exp(log_fg + m_state - m_new)
  ig = np.exp(igate_preact - m_new)
  k_scaled = k / np.sqrt(k.shape[0])
  c_new = fg * c_state + ig * np.outer(k_scaled, v)
  n_new = fg * n_state + ig * k_scaled
  h_num = q @ c_new
  h_denom = max(abs(q @ n_new), np.exp(-m_new)) + eps
  return h_num / h_denom, (c_new, n_new, m_new)


def parallel_stabilized_simple(q, k, v, igate_preact, fgate_preact, eps):
  """Per (batch, head): q, k, v [S, K], gates [S] -> [S, K] (row-wise stabilised matrix form)."""
  s, dh = q.shape
  log_f = np.concatenate([[0.0], np.cumsum(forms.log_sigmoid(fgate_preact))])
  log_fg = log_f[1:, None] - log_f[None, 1:]
  log_fg = np.where(np.tril(np.ones((s, s), bool)), log_fg, -np.inf)
  log_d = log_fg + igate_preact[None, :]
  max_log_d = log_d.max(axis=-1, keepdims=True)
  c = (q @ (k / np.sqrt(dh)).T) * np.exp(log_d - max_log_d)
  normalizer = np.maximum(np.abs(c.sum(-1, keepdims=True)), np.exp(-max_log_d))
  return (c / (normalizer + eps)) @ v


def bidirectional_cell(q, k, v, igate_preact, fgate_preact):
  """The bidirectional form this layer defines (module docstring), per (batch, head), eps 0:
  w_tj = exp(ĩ_j + Σ_{l=min(t,j)+1}^{max(t,j)} log σ(f̃_l)) over all j, then the causal cell's normaliser."""
  s, dh = q.shape
  cum = np.cumsum(forms.log_sigmoid(fgate_preact))
  log_w = -np.abs(cum[:, None] - cum[None, :]) + igate_preact[None, :]
  c = (q @ (k / np.sqrt(dh)).T) * np.exp(log_w)
  return c @ v / np.maximum(np.abs(c.sum(-1, keepdims=True)), 1.0)


def reference_layer(params, x, num_heads=4, eps=1e-6, backend="recurrent"):
  """The original's mLSTMLayer.forward in float64 numpy, from this module's parameters (Dense kernels are
  [in, out], the original's torch weights [out, in]; the conv kernel is [W, E], torch's [E, 1, W])."""
  p = jax.tree_util.tree_map(lambda t: np.asarray(t, np.float64), params)
  x = np.asarray(x, np.float64)
  b, length, _ = x.shape
  inner = p["learnable_skip"].shape[0]
  dh = inner // num_heads
  x_inner = x @ p["proj_up"]["kernel"]
  x_mlstm, z = x_inner[..., :inner], x_inner[..., inner:]
  # CausalConv1d: Conv1d(padding=W-1, groups=E) cut to the first L outputs
  kernel, width = p["conv1d_kernel"], p["conv1d_kernel"].shape[0]
  conv = np.zeros_like(x_mlstm) + p["conv1d_bias"]
  for t in range(length):
    for w in range(width):
      src = t - (width - 1) + w
      if src >= 0:
        conv[:, t] += kernel[w] * x_mlstm[:, src]
  conv_act = forms.silu(conv)

  def headwise(name, t):  # LinearHeadwiseExpand: "...hd,hod->...ho"
    weight = p[name]["weight"]
    return np.einsum("bljd,jod->bljo", t.reshape(b, length, weight.shape[0], -1), weight).reshape(b, length, -1)

  q, k, v = headwise("q_proj", conv_act), headwise("k_proj", conv_act), headwise("v_proj", x_mlstm)
  gate_in = np.concatenate([q, k, v], axis=-1)
  igate = gate_in @ p["igate"]["kernel"] + p["igate"]["bias"]  # [B, L, NH]
  fgate = gate_in @ p["fgate"]["kernel"] + p["fgate"]["bias"]
  qh, kh, vh = (t.reshape(b, length, num_heads, dh) for t in (q, k, v))
  h = np.zeros((b, length, num_heads, dh))
  for bi in range(b):
    for hi in range(num_heads):
      if backend == "recurrent":
        state = (np.zeros((dh, dh)), np.zeros(dh), 0.0)  # the original's zero initial state, m_0 = 0
        for t in range(length):
          h[bi, t, hi], state = recurrent_step_stabilized_simple(
              *state, qh[bi, t, hi], kh[bi, t, hi], vh[bi, t, hi], igate[bi, t, hi], fgate[bi, t, hi], eps)
      elif backend == "bidirectional":
        h[bi, :, hi] = bidirectional_cell(qh[bi, :, hi], kh[bi, :, hi], vh[bi, :, hi], igate[bi, :, hi],
                                          fgate[bi, :, hi])
      else:
        h[bi, :, hi] = parallel_stabilized_simple(qh[bi, :, hi], kh[bi, :, hi], vh[bi, :, hi], igate[bi, :, hi],
                                                  fgate[bi, :, hi], eps)
  # MultiHeadLayerNorm: group_norm with NH groups, weight 1 + w, no bias, eps 1e-5
  mean = h.mean(-1, keepdims=True)
  var = h.var(-1, keepdims=True)
  h = (h - mean) / np.sqrt(var + 1e-5) * (1.0 + p["outnorm_weight"].reshape(num_heads, dh))
  h = h.reshape(b, length, inner) + p["learnable_skip"] * conv_act
  return (h * forms.silu(z)) @ p["proj_down"]["kernel"]


def apply(module, params, x, mask=None):
  """module.apply, compiled (one program per config and shape: far less compile time than op by op)."""
  return forms.apply(module, {"params": params}, x, mask)


def _agree(got, want):
  assert forms.rel_err(got, want) <= 1e-9



# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_layer_matches_original_recurrent_step(x64, mode):
  """(1) causal, whole layer: the original's token-by-token step from this layer's parameters, to 1e-9, with
  the original's eps 1e-6 (the step's m_0 = 0 stabiliser matters then) and with eps 0, where the original's
  parallel form (row-wise stabiliser) agrees too."""
  x = inputs(0, 23)
  module = make(causal=True, mode=mode, chunk_size=8)
  params = randomised(shapes(x), 1)
  out = apply(module, params, x)
  assert out.dtype == jnp.float64 and out.shape == x.shape
  assert forms.rel_err(out, reference_layer(params, x)) <= 1e-9
  out0 = apply(make(causal=True, mode=mode, chunk_size=8, eps=0.0), params, x)
  assert forms.rel_err(out0, reference_layer(params, x, eps=0.0)) <= 1e-9
  assert forms.rel_err(out0, reference_layer(params, x, eps=0.0, backend="parallel")) <= 1e-9
  assert forms.rel_err(out0, out) > 1e-12  # the eps is there


def test_bidirectional_layer_matches_its_definition(x64):
  """causal=False (not in the original): the whole layer with the weights w_tj of the module docstring, eps 0."""
  x = inputs(2, 19)
  module = make(mode="chunk", chunk_size=8, eps=0.0)
  params = randomised(shapes(x), 3)
  assert forms.rel_err(apply(module, params, x), reference_layer(params, x, eps=0.0, backend="bidirectional")) <= 1e-9


@pytest.mark.parametrize("causal", [True, False])
def test_chunk_equals_recurrent_outputs_and_gradients(x64, causal):
  """(2) with padding in the middle and at the end, chunk_size 8 over 21 tokens (a partial last chunk)."""
  mask = np.ones((B, 21), bool)
  mask[0, [4, 5, 11, 17, 18, 19, 20]] = False
  x = inputs(3, 21) * jnp.asarray(mask)[..., None]
  chunk, recurrent = (make(causal=causal, mode=mode, chunk_size=8) for mode in ("chunk", "recurrent"))
  weights = jnp.asarray(np.random.default_rng(5).normal(size=x.shape))
  forms.check_chunk_equals_recurrent(chunk, recurrent, randomised(shapes(x), 4), x, mask, _agree, weights=weights,
                                     sin=True)


@pytest.mark.parametrize("causal", [True, False])
def test_padding_end_and_middle_equals_removed(x64, causal):
  """(3) real outputs of a row with padded positions (holding garbage) inside and at its end equal those of
  the row with them removed; padded outputs are 0. mode="chunk" (equal to "recurrent" with padding: test 2)."""
  x = inputs(6, 19)                                 # x still holds its values at the padded positions
  mask = np.ones((B, 19), bool)
  mask[0, [0, 6, 7, 12, 16, 17, 18]] = False
  mask[1, 9] = False
  module = make(causal=causal, mode="chunk", chunk_size=8)
  params = randomised(shapes(x), 7)
  forms.check_padding_removed(lambda z, m: apply(module, params, z, m), x, mask, _agree, rows_to_check=[0])


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_causal_future_does_not_reach_the_past(x64, mode):
  """(4) changing tokens from position 11 on leaves outputs 0..10 alone and moves the later ones."""
  x = inputs(8, 20)
  params = randomised(shapes(x), 10)
  module = make(causal=True, mode=mode, chunk_size=8)
  a, b = forms.future_changed(lambda z: apply(module, params, z), x, 11, seed=9, replace=True)
  assert np.max(np.abs(a[:, :11] - b[:, :11])) <= 1e-12 * np.max(np.abs(a))
  assert np.min(np.max(np.abs(a[:, 11:] - b[:, 11:]), axis=-1)) > 1e-6
  # bidirectional: the future does reach the past
  module = make(causal=False, mode=mode, chunk_size=8)
  a, b = forms.future_changed(lambda z: apply(module, params, z), x, 11, seed=9, replace=True)
  assert np.min(np.max(np.abs(a[:, :11] - b[:, :11]), axis=-1)) > 1e-6


def test_state_size_formula():
  """(5) H·(K² + K + 1) + (W − 1)·E with E = ⌈2D/64⌉·64, H = 4, K = E/4, W = 4."""
  config = mlstm.MLSTMConfig()
  # d_model 16: E = 64, K = 16 -> 4·(256 + 16 + 1) + 3·64
  assert config.state_size(1000, 16) == 4 * 273 + 192 == 1284
  # d_model 100: E = ⌈200/64⌉·64 = 256, K = 64 -> 4·(4096 + 64 + 1) + 3·256
  assert config.state_size(5, 100) == 4 * 4161 + 768 == 17412
  assert config.state_size(5, 512) == 4 * (256 * 256 + 256 + 1) + 3 * 1024
  assert mlstm.MLSTMConfig(conv1d_kernel_size=0).state_size(5, 16) == 4 * 273


def test_inner_width_and_heads_at_harness_widths():
  config = mlstm.MLSTMConfig()
  assert [config.inner_dim(d) for d in (16, 64, 128, 256, 512, 100)] == [64, 128, 256, 512, 1024, 256]
  assert mlstm.MLSTMConfig(round_proj_up_dim_up=False).inner_dim(100) == 192
  with pytest.raises(ValueError, match="divisible"):
    mlstm.MLSTMConfig(num_heads=3).inner_dim(16)
  with pytest.raises(ValueError, match="mode"):
    mlstm.MLSTMConfig(mode="parallel")


def test_initialisation():
  """The original's inits (module docstring) at d_model 64 (E = 128, H = 4, J = 32 blocks of 4)."""
  d = 64
  x = jnp.zeros((1, 3, d), jnp.float32)
  params = jax.tree_util.tree_map(np.asarray, init(make(), x, seed=3))
  assert set(params) == {"proj_up", "conv1d_kernel", "conv1d_bias", "q_proj", "k_proj", "v_proj", "igate",
                         "fgate", "outnorm_weight", "learnable_skip", "proj_down"}
  assert set(params["proj_up"]) == {"kernel"} and set(params["proj_down"]) == {"kernel"}  # bias False
  assert params["proj_up"]["kernel"].shape == (d, 256) and params["proj_down"]["kernel"].shape == (128, d)
  small = np.sqrt(2 / (5 * d))
  assert abs(params["proj_up"]["kernel"].std() / small - 1) < 0.05
  assert abs(params["proj_down"]["kernel"].std() / (2 / np.sqrt(d)) - 1) < 0.05
  for name in ("q_proj", "k_proj", "v_proj"):
    assert set(params[name]) == {"weight"} and params[name]["weight"].shape == (32, 4, 4)
    assert abs(params[name]["weight"].std() / small - 1) < 0.15
  assert params["conv1d_kernel"].shape == (4, 128) and params["conv1d_bias"].shape == (128,)
  for name in ("conv1d_kernel", "conv1d_bias"):
    assert np.all(np.abs(params[name]) <= 0.5) and abs(params[name].std() / (0.5 / np.sqrt(3)) - 1) < 0.2
  for name in ("igate", "fgate"):
    assert params[name]["kernel"].shape == (384, 4) and np.all(params[name]["kernel"] == 0)
  np.testing.assert_allclose(params["fgate"]["bias"], [3.0, 4.0, 5.0, 6.0], rtol=1e-6)
  assert np.all(np.abs(params["igate"]["bias"]) < 0.5) and np.any(params["igate"]["bias"] != 0)
  assert np.all(params["outnorm_weight"] == 0) and np.all(params["learnable_skip"] == 1)


def test_registry_entry():
  config = registry.layer_config("mlstm")
  assert isinstance(config, mlstm.MLSTMConfig) and config.causal is False and config.mode == "chunk"
  assert config.chunk_size == 64 and config.eps == 1e-6 and type(config).family == "linear-recurrent"
  assert registry.layer_kind("mlstm") == "mixer" and registry.layer_family("mlstm") == "linear-recurrent"
  assert type(config).paper_name == "xLSTM"
