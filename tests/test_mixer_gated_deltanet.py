"""Gated DeltaNet mixer (attention_zoo/mixers/gated_deltanet.py), float64: the whole layer against a numpy
transcription of fla's token-by-token reference (``fla/ops/gated_delta_rule/naive.py``
``naive_recurrent_gated_delta_rule``, with ``fla/ops/gated_delta_rule/gate.py`` ``naive_gdn_gate``) built from
the module's own parameters, causal and bidirectional; mode "chunk" against mode "recurrent" (outputs and
gradients); padding at the end and in the middle; causality; heads, initialisation and ``state_size``.
Shared numpy pieces and checks: tests/mixer_forms.py.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers import _layer_common
from tests import mixer_forms as forms

NAME = "gated_deltanet"
D = 16
RTOL = 1e-9  # max |a − b| ≤ RTOL · max |b|
LENGTH = forms.DELTA_LENGTH
SMALL = {"num_heads": 2, "initializer_range": 0.5}  # 2 heads of K = 6, V = 12; O(1) activations


def _agree(got, want):
  forms.assert_within(got, want, RTOL)


def naive_recurrent_gated_delta_rule(q, k, v, beta, g):
  """float64 transcription of fla/ops/gated_delta_rule/naive.py ``naive_recurrent_gated_delta_rule`` (q, k
  [B, T, H, K], v [B, T, H, V], beta, g [B, T, H]; scale K^−½; no initial state): o [B, T, H, V]."""
  q, k, v, beta, g = (np.swapaxes(u, 1, 2) for u in (q, k, v, beta, g))
  bsz, heads, length, dk = k.shape
  o = np.zeros((bsz, heads, length, v.shape[-1]))
  h = np.zeros((bsz, heads, dk, v.shape[-1]))
  q = q * dk**-0.5
  for i in range(length):
    b_q, b_k, b_v = q[:, :, i], k[:, :, i], v[:, :, i].copy()
    h = h * np.exp(g[:, :, i])[..., None, None]
    b_v = b_v - (h * b_k[..., None]).sum(-2)
    b_v = b_v * beta[:, :, i][..., None]
    h = h + b_k[..., None] * b_v[..., None, :]
    o[:, :, i] = np.einsum("bhd,bhdm->bhm", b_q, h)
  return np.swapaxes(o, 1, 2)


def naive_gdn_gate(a, a_log, dt_bias):
  """fla/ops/gated_delta_rule/gate.py ``naive_gdn_gate``: −exp(A_log) · softplus(a + dt_bias)."""
  return -np.exp(a_log) * forms.softplus(a + dt_bias)


def reference_gated_deltanet(p, x, causal, heads, eps=1e-5):
  """The Gated DeltaNet layer (fla/layers/gated_deltanet.py forward, use_gate) in numpy from the parameters."""
  bsz, length, _ = x.shape
  q, k, v = (forms.fla_short_conv(x @ p[f"{n}_proj"]["kernel"], p[f"{n}_conv1d"]["kernel"]) for n in "qkv")
  q, k, v = (u.reshape(bsz, length, heads, -1) for u in (q, k, v))
  q, k = forms.l2norm(q), forms.l2norm(k)
  beta = forms.sigmoid(x @ p["b_proj"]["kernel"])
  g = naive_gdn_gate(x @ p["a_proj"]["kernel"], p["ssm_A_log"], p["ssm_dt_bias"])
  o = naive_recurrent_gated_delta_rule(q, k, v, beta, g)
  if not causal:
    o = o + forms.delta_rule_backward(q * q.shape[-1]**-0.5, k, v, beta, g)
  gate = (x @ p["g_proj"]["kernel"]).reshape(o.shape)
  o = (forms.rms_norm(o, p["o_norm"], eps) * forms.silu(gate)).reshape(bsz, length, -1)
  return o @ p["o_proj"]["kernel"]


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_matches_fla_naive_reference(x64, mode):
  for causal, x, p, out in forms.delta_outputs(NAME, mode, D, **SMALL):
    assert p["q_proj"]["kernel"].shape == (D, 12) and p["v_proj"]["kernel"].shape == (D, 24)
    _agree(out, reference_gated_deltanet(p, x, causal, heads=2))


def test_heads_state_size_and_init():
  cfg = attention_zoo.mixer_config(NAME)
  # key dim int(0.75·D), K ≤ 256 with the fewest heads, V = 2K; fla's 2048 → 6 × 256
  assert cfg.dims(2048) == (6, 256, 512)
  assert cfg.dims(16) == (1, 12, 24) and cfg.dims(64) == (1, 48, 96) and cfg.dims(512) == (2, 192, 384)
  assert attention_zoo.mixer_config(NAME, num_heads=4).dims(64) == (4, 12, 24)
  assert attention_zoo.mixer_config(NAME, head_dim=16).dims(64) == (3, 16, 32)
  # state_size: H·K·V + (W − 1)·H·(2K + V)
  assert cfg.state_size(100, 64) == 48 * 96 + 3 * (2 * 48 + 96)
  assert cfg.state_size(1, 512) == 2 * 192 * 384 + 3 * 2 * (2 * 192 + 384)
  assert attention_zoo.mixer_config(NAME, use_short_conv=False).state_size(7, 512) == 2 * 192 * 384
  assert type(cfg).family == "linear-recurrent" and type(cfg).paper_name == "Gated DeltaNet"
  # A_log = log U[0, 16); dt_bias = softplus⁻¹(dt), dt log-uniform on [1e-3, 0.1] (Mamba-2's)
  a = np.exp(np.asarray(_layer_common.log_uniform_init(0.0, 16.0)(jax.random.key(0), (4000,))))
  assert a.min() >= 0 and a.max() < 16 and abs(a.mean() - 8) < 0.5
  dt = np.log1p(np.exp(np.asarray(_layer_common.dt_bias_init()(jax.random.key(1), (4000,)), np.float64)))
  assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
  assert abs(np.log(dt).mean() - (np.log(1e-3) + np.log(0.1)) / 2) < 0.1


def test_ungated_option_traces():
  """use_gate=False (RMSNorm alone), conv_bias, allow_neg_eigval: builds and traces (``jax.eval_shape``)."""
  x = jax.ShapeDtypeStruct((2, LENGTH, D), jnp.float32)
  mask = jax.ShapeDtypeStruct((2, LENGTH), jnp.bool_)
  module = attention_zoo.create_mixer(NAME, use_gate=False, allow_neg_eigval=True, conv_bias=True)
  params = jax.eval_shape(module.init, jax.random.key(0), x, mask)["params"]
  assert "g_proj" not in params and "bias" in params["q_conv1d"]
  assert jax.eval_shape(module.apply, {"params": params}, x, mask).shape == x.shape


class TestContract(forms.DeltaContract):
  """The family's tests (tests/mixer_forms.py) with this file's config and comparison."""

  name = NAME
  overrides = SMALL
  agree = staticmethod(_agree)
