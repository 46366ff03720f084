"""DeltaNet mixer (attention_zoo/mixers/deltanet.py), float64: the whole layer against a numpy transcription of
fla's token-by-token reference (``fla/ops/delta_rule/naive.py`` ``delta_rule_recurrence``) built from the
module's own parameters, causal and bidirectional; mode "chunk" against mode "recurrent" (outputs and
gradients); padding at the end and in the middle of a row against the row with its padding removed; causality;
``state_size``.

The numpy pieces (short convolution, norms, the bidirectional backward pass) and the checks' inputs are shared
with tests/test_mixer_gated_deltanet.py and tests/test_mixer_kda.py through tests/mixer_forms.py.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from tests import mixer_forms as forms

NAME = "deltanet"
RTOL = 1e-9  # float64 comparisons: max |a − b| ≤ RTOL · max |b|
LENGTH = forms.DELTA_LENGTH


def _agree(got, want):
  forms.assert_within(got, want, RTOL)


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
  q, k, v = (forms.fla_short_conv(x @ p[f"{n}_proj"]["kernel"], p[f"{n}_conv1d"]["kernel"]) for n in "qkv")
  q, k, v = (u.reshape(bsz, length, heads, -1) for u in (q, k, v))
  q, k = forms.l2norm(q), forms.l2norm(k)
  beta = forms.sigmoid(x @ p["b_proj"]["kernel"])  # [B, L, H]
  hm = lambda u: np.swapaxes(u, 1, 2)  # [B, L, H, ...] <-> [B, H, L, ...]
  o = hm(delta_rule_recurrence(hm(q), hm(k), hm(v), hm(beta)))
  if not causal:
    o = o + forms.delta_rule_backward(q * q.shape[-1]**-0.5, k, v, beta)
  o = forms.rms_norm(o, p["o_norm"], eps).reshape(bsz, length, -1)
  return o @ p["o_proj"]["kernel"]


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_matches_fla_naive_reference(x64, mode):
  for causal, x, p, out in forms.delta_outputs(NAME, mode, D, initializer_range=STD):
    _agree(out, reference_deltanet(p, x, causal))


def test_state_size_and_heads():
  cfg = attention_zoo.mixer_config(NAME)
  # d_model 16: 4 heads, K = V = 4; H·K·V + (W − 1)·H·(2K + V) = 64 + 3·4·12
  assert cfg.dims(16) == (4, 4, 4) and cfg.state_size(1000, 16) == 64 + 144
  # d_model 64: 4 heads of 16: 4·16·16 + 3·4·48
  assert cfg.dims(64) == (4, 16, 16) and cfg.state_size(10, 64) == 1024 + 576
  # a width 4 does not divide: gcd(4, 6, 6) = 2 heads of 3
  assert cfg.dims(6) == (2, 3, 3)
  no_conv = attention_zoo.mixer_config(NAME, use_short_conv=False)
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
    module = attention_zoo.create_mixer(NAME, **overrides)
    params = jax.eval_shape(module.init, jax.random.key(0), x, mask)["params"]
    assert ("g_proj" in params) == overrides.get("use_gate", False)
    assert ("b_proj" in params) == overrides.get("use_beta", True)
    assert ("q_conv1d" in params) == overrides.get("use_short_conv", True)
    out = jax.eval_shape(module.apply, {"params": params}, x, mask)
    assert out.shape == x.shape and out.dtype == jnp.float32
  with pytest.raises(ValueError, match="qk_norm"):
    attention_zoo.mixer_config(NAME, qk_norm="max")


class TestContract(forms.DeltaContract):
  """The family's tests (tests/mixer_forms.py) with this file's config and comparison."""

  name = NAME
  overrides = {"initializer_range": STD}
  agree = staticmethod(_agree)
