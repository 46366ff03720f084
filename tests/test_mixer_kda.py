"""KDA mixer (attention_zoo/mixers/kda.py), float64: the whole layer against a numpy transcription of fla's
token-by-token reference (``fla/ops/kda/naive.py`` ``naive_recurrent_kda``, with ``fla/ops/kda/gate.py``
``naive_kda_gate``) built from the module's own parameters, causal and bidirectional; mode "chunk" against mode
"recurrent" (outputs and gradients); padding at the end and in the middle; causality; heads, parameter shapes
and ``state_size``. Shared numpy pieces and checks: tests/mixer_forms.py.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import numpy as np
import pytest

import attention_zoo
from tests import mixer_forms as forms

NAME = "kda"
D = 16
RTOL = 1e-9  # max |a − b| ≤ RTOL · max |b|
SMALL = {"num_heads": 2, "initializer_range": 0.5}  # 2 heads of K = V = 8; O(1) activations


def _agree(got, want):
  forms.assert_within(got, want, RTOL)


def naive_recurrent_kda(q, k, v, g, beta):
  """float64 transcription of fla/ops/kda/naive.py ``naive_recurrent_kda`` (q, k [B, T, H, K], v [B, T, H, V],
  g [B, T, H, K] log decay, beta [B, T, H]; one value head per key head; scale K^−½; no initial state)."""
  bsz, length, heads, dk = q.shape
  q = q * dk**-0.5
  state = np.zeros((bsz, heads, dk, v.shape[-1]))
  o = np.zeros(v.shape)
  for i in range(length):
    q_i, k_i, v_i, g_i, b_i = q[:, i], k[:, i], v[:, i], g[:, i], beta[:, i]
    state = state * np.exp(g_i)[..., None]
    state = state + np.einsum("bhk,bhv->bhkv", b_i[..., None] * k_i, v_i - (k_i[..., None] * state).sum(-2))
    o[:, i] = np.einsum("bhk,bhkv->bhv", q_i, state)
  return o


def naive_kda_gate(f, a_log, dt_bias):
  """fla/ops/kda/gate.py ``naive_kda_gate``: −exp(A_log)[h] · softplus(f + dt_bias.view(H, K)), f [..., H, K]."""
  heads = f.shape[-2]
  return -np.exp(a_log).reshape(heads, 1) * forms.softplus(f + dt_bias.reshape(heads, -1))


def reference_kda(p, x, causal, heads, eps=1e-5):
  """The KDA layer (fla/layers/kda.py forward) in numpy from the parameters."""
  bsz, length, _ = x.shape
  q, k, v = (forms.fla_short_conv(x @ p[f"{n}_proj"]["kernel"], p[f"{n}_conv1d"]["kernel"]) for n in "qkv")
  q, k, v = (u.reshape(bsz, length, heads, -1) for u in (q, k, v))
  q, k = forms.l2norm(q), forms.l2norm(k)
  f = (x @ p["f_proj_0"]["kernel"] @ p["f_proj_1"]["kernel"]).reshape(q.shape)
  g = naive_kda_gate(f, p["ssm_A_log"], p["ssm_dt_bias"])
  beta = forms.sigmoid(x @ p["b_proj"]["kernel"])
  o = naive_recurrent_kda(q, k, v, g, beta)
  if not causal:
    o = o + forms.delta_rule_backward(q * q.shape[-1]**-0.5, k, v, beta, g)
  gate = (x @ p["g_proj_0"]["kernel"] @ p["g_proj_1"]["kernel"] + p["g_proj_1"]["bias"]).reshape(o.shape)
  o = (forms.rms_norm(o, p["o_norm"], eps) * forms.sigmoid(gate)).reshape(bsz, length, -1)
  return o @ p["o_proj"]["kernel"]


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_matches_fla_naive_reference(x64, mode):
  for causal, x, p, out in forms.delta_outputs(NAME, mode, D, **SMALL):
    # low-rank gates of rank V = 8; A_log per head; dt_bias per head and key channel
    assert p["f_proj_0"]["kernel"].shape == (D, 8) and p["f_proj_1"]["kernel"].shape == (8, 16)
    assert p["g_proj_1"]["bias"].shape == (16,) and p["ssm_A_log"].shape == (2,) and p["ssm_dt_bias"].shape == (16,)
    assert np.all((np.exp(p["ssm_A_log"]) >= 1) & (np.exp(p["ssm_A_log"]) < 16))
    _agree(out, reference_kda(p, x, causal, heads=2))


def test_heads_and_state_size():
  cfg = attention_zoo.mixer_config(NAME)
  # key dim D, K ≤ 128 with the fewest heads, V = K; fla's 2048 → 16 × 128
  assert cfg.dims(2048) == (16, 128, 128)
  assert cfg.dims(16) == (1, 16, 16) and cfg.dims(128) == (1, 128, 128) and cfg.dims(512) == (4, 128, 128)
  assert attention_zoo.mixer_config(NAME, num_heads=4).dims(64) == (4, 16, 16)
  # state_size: H·K·V + (W − 1)·H·(2K + V)
  assert cfg.state_size(100, 256) == 2 * 128 * 128 + 3 * 2 * (3 * 128)
  assert cfg.state_size(1, 16) == 16 * 16 + 3 * 48
  assert attention_zoo.mixer_config(NAME, use_short_conv=False).state_size(1, 16) == 256
  assert type(cfg).family == "linear-recurrent" and type(cfg).paper_name == "KDA"


class TestContract(forms.DeltaContract):
  """The family's tests (tests/mixer_forms.py) with this file's config and comparison."""

  name = NAME
  overrides = SMALL
  agree = staticmethod(_agree)
