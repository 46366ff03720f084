"""RG-LRU mixer (attention_zoo/mixers/rg_lru.py): Griffin's recurrent block against a float64 numpy
transcription of ``google-deepmind/recurrentgemma`` (``RecurrentBlock``, ``Conv1D``, ``RGLRU``,
``BlockDiagonalLinear``, the linear scan ``lru_linear_scan``), mode="chunk" against mode="recurrent"
(outputs and gradients), padding at the end and in the middle, causality, the initialisation, the gate
block count, the bounded √ gradient and ``state_size``. The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers import rg_lru

from tests import mixer_forms as forms

D_MODEL = 16
pytestmark = pytest.mark.usefixtures("fast_compile")  # most XLA optimisations off (conftest: ~2x faster on CPU)


# ---- float64 numpy transcription of recurrentgemma (one document per row: segment_pos = 0, 1, ...) ----

def gelu_tanh(v):
  """``jax.nn.gelu`` (approximate=True), as ``RecurrentBlock`` calls it."""
  return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))


def conv1d_ref(x, w, b):
  """``Conv1D.__call__`` in training mode (no cache): Σ_shift x[t − shift] · w[K − shift − 1] + b, the
  window left-padded with zeros; a single document per row, so the document mask is all ones."""
  temporal_width, length = w.shape[0], x.shape[1]
  out = 0.0
  for shift in range(min(temporal_width, length)):
    window = np.concatenate([np.zeros_like(x[:, :shift]), x[:, :length - shift]], axis=1)
    out = out + window * w[temporal_width - shift - 1][None, None]
  return out + b[None, None]


def block_diagonal_ref(x, w, b):
  """``BlockDiagonalLinear``: x split into H blocks, "... h i, h i j -> ... h j" + b, flattened."""
  heads = w.shape[0]
  xh = x.reshape(x.shape[:-1] + (heads, -1))
  return (np.einsum("...hi,hij->...hj", xh, w) + b).reshape(x.shape[:-1] + (-1,))


def rg_lru_ref(x, p, suffix):
  """``RGLRU.__call__`` (only_real) with ``segment_pos = arange(L)`` and ``lru_linear_scan``."""
  batch, length, width = x.shape
  gate_x = forms.sigmoid(block_diagonal_ref(x, p[f"input_gate_w{suffix}"], p[f"input_gate_bias{suffix}"]))
  gate_a = forms.sigmoid(block_diagonal_ref(x, p[f"a_gate_w{suffix}"], p[f"a_gate_bias{suffix}"]))
  log_a = -8.0 * gate_a * forms.softplus(p[f"ssm_a_param{suffix}"])
  a, a_squared = np.exp(log_a), np.exp(2 * log_a)
  reset = (np.arange(length) == 0).astype(np.float64)[None, :, None]
  multiplier = reset + (1 - reset) * np.sqrt(1 - a_squared)
  normalized_x = x * gate_x * multiplier
  a = a * (1 - reset)
  h = np.zeros((batch, width))
  ys = []
  for t in range(length):
    h = a[:, t] * h + normalized_x[:, t]
    ys.append(h)
  return np.stack(ys, axis=1)


def reference_block(p, x, bidirectional):
  """``RecurrentBlock.__call__``; bidirectional: the reverse direction's conv and RG-LRU run on the
  reversed sequence (its own segment start) and its states, reversed back, are added before the GeLU
  branch multiplies them."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  x = np.asarray(x)
  y = gelu_tanh(x @ p["linear_y_kernel"] + p["linear_y_bias"])
  v = x @ p["linear_x_kernel"] + p["linear_x_bias"]
  h = rg_lru_ref(conv1d_ref(v, p["conv_w"], p["conv_bias"]), p, "")
  if bidirectional:
    h = h + rg_lru_ref(conv1d_ref(v[:, ::-1], p["conv_w_b"], p["conv_bias_b"]), p, "_b")[:, ::-1]
  return (h * y) @ p["linear_out_kernel"] + p["linear_out_bias"]


# ---- tests --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_block_matches_original_reference(x64, causal):
  """Whole block, float64, two gate blocks, every parameter moved off its initial value (the zero biases
  would hide their paths); chunk mode (causal) and recurrent mode (bidirectional)."""
  x = forms.block_inputs(0, 2, 13)
  module = attention_zoo.create_mixer("rg_lru", causal=causal, num_heads=2, mode="chunk" if causal else "recurrent")
  params = module.lazy_init(jax.random.PRNGKey(0), x, jnp.ones((2, 13), bool))["params"]
  assert ("ssm_a_param_b" in params) == (not causal)
  rng = np.random.default_rng(1)
  params = {k: v + 0.1 * rng.normal(size=v.shape) for k, v in params.items()}
  out, _ = forms.init_apply(module, x, jnp.ones((2, 13), bool), {"params": params})
  assert out.dtype == np.float64
  want = reference_block(params, x, bidirectional=not causal)
  np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("causal", [True, False])
def test_chunk_equals_recurrent(x64, causal):
  """Outputs and gradients (every parameter and the input) agree to 1e-9, with padding in the middle of
  row 1."""
  forms.block_chunk_equals_recurrent("rg_lru", causal, forms.block_agree)


def _perturbed(module, x, mask):
  """Parameters initialised on the cut row, moved by 0.1·N(0, 1): non-zero biases, so a padded slot that
  reached the convolution would show."""
  params = module.lazy_init(jax.random.PRNGKey(0), jnp.asarray(x[:1, mask[0]]), jnp.ones((1, 7), bool))["params"]
  rng = np.random.default_rng(2)
  return {"params": {k: v + 0.1 * rng.normal(size=v.shape) for k, v in params.items()}}


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_padding_end_and_middle_equals_removed(x64, mode):
  """Rows padded in the middle and at the end (row 0) and at the start, in the middle and at the end
  (row 1), the padded slots holding large non-zero values: the real outputs equal those of the row with
  the padding removed (both directions, each with its own segment start); padded outputs are zero."""
  forms.block_padding_removed(attention_zoo.create_mixer("rg_lru", mode=mode), _perturbed, forms.block_same)


def test_causal_future_does_not_move_past(x64):
  forms.block_causal("rg_lru", "ssm_a_param_b")


def test_state_size():
  config = attention_zoo.mixer_config("rg_lru")
  # W·K: h [W] and K − 1 = 3 previous convolution inputs [W], W = d_model = 64
  assert config.state_size(1000, 64) == 64 + 3 * 64 == 256
  assert attention_zoo.mixer_config("rg_lru", lru_width=96, conv_width=2).state_size(7, 16) == 96 + 96
  assert config.state_size(10, 64) == config.state_size(10_000, 64)


def test_gate_blocks():
  config = attention_zoo.mixer_config("rg_lru")
  # the largest divisor of W that is at most max(1, W // 256): RecurrentGemma's 2B (2560, 10) and 9B (4096, 16)
  assert [config.heads(w) for w in (16, 64, 256, 511, 512, 768, 1000, 2560, 4096)] == [1, 1, 1, 1, 2, 3, 2, 10, 16]
  assert attention_zoo.mixer_config("rg_lru", lru_width=5632).heads(16) == 22
  assert attention_zoo.mixer_config("rg_lru", num_heads=4).heads(16) == 4
  with pytest.raises(ValueError, match="divide"):
    attention_zoo.mixer_config("rg_lru", num_heads=3).heads(16)


def test_config_and_init():
  config = attention_zoo.mixer_config("rg_lru")
  assert (config.lru_width, config.num_heads, config.conv_width, config.min_rad, config.max_rad,
          config.final_w_init_variance_scale) == (None, None, 4, 0.9, 0.999, 1.0)
  assert (config.causal, config.bidirectional, config.mode) == (False, True, "chunk")
  assert config.family == "ssm" and config.paper_name == "Hawk"
  width = 256
  x = jnp.zeros((1, 3, D_MODEL), jnp.float32)
  module = attention_zoo.create_mixer("rg_lru", lru_width=width, final_w_init_variance_scale=0.5)
  p = {k: np.asarray(v, np.float64) for k, v in
       module.lazy_init(jax.random.PRNGKey(1), x, jnp.ones((1, 3), bool))["params"].items()}

  def std_ok(a, std):
    return abs(a.std() / std - 1) < 0.1 and abs(a.mean()) < 0.2 * std

  assert p["linear_x_kernel"].shape == p["linear_y_kernel"].shape == (D_MODEL, width)
  assert std_ok(p["linear_x_kernel"], D_MODEL ** -0.5) and std_ok(p["linear_y_kernel"], D_MODEL ** -0.5)
  assert p["linear_out_kernel"].shape == (width, D_MODEL) and std_ok(p["linear_out_kernel"], (0.5 / width) ** 0.5)
  for suffix in ("", "_b"):
    assert p[f"conv_w{suffix}"].shape == (4, width) and std_ok(p[f"conv_w{suffix}"], (0.01 / 4) ** 0.5)
    for gate in ("input_gate", "a_gate"):
      assert p[f"{gate}_w{suffix}"].shape == (1, width, width) and std_ok(p[f"{gate}_w{suffix}"], width ** -0.5)
      assert p[f"{gate}_bias{suffix}"].shape == (1, width)
    radius = np.exp(-forms.softplus(p[f"ssm_a_param{suffix}"]))                 # a_t = radius^(8·r_t)
    assert np.all(radius >= 0.9 - 1e-6) and np.all(radius <= 0.999 + 1e-6)
    lo, hi = 0.9**2, 0.999**2                                              # r² ~ U[0.81, 0.998]
    assert abs((radius**2).mean() - (lo + hi) / 2) < 4 * (hi - lo) / np.sqrt(12 * width)
  for name, value in p.items():
    if "bias" in name:
      assert np.all(value == 0), name
  assert {k for k in p if k.startswith("ssm_")} == {"ssm_a_param", "ssm_a_param_b"}


def test_sqrt_gradient_is_bounded(x64):
  grad = jax.grad(lambda v: rg_lru.sqrt_bounded_gradient(v, 1000.0))
  assert float(rg_lru.sqrt_bounded_gradient(0.25, 1000.0)) == 0.5
  np.testing.assert_allclose(float(grad(0.25)), 1.0, rtol=1e-12)                 # 1/(2√x) above the bound
  np.testing.assert_allclose(float(grad(1e-12)), 1000.0, rtol=1e-12)              # capped at max_gradient
  assert np.isfinite(float(grad(0.0)))


def test_unknown_mode_is_an_error():
  x = jnp.zeros((1, 3, D_MODEL))
  with pytest.raises(ValueError, match="mode"):
    attention_zoo.create_mixer("rg_lru", mode="fast").lazy_init(jax.random.PRNGKey(0), x, jnp.ones((1, 3), bool))
