"""GLA mixer (attention_zoo/mixers/gla.py), float64 and tiny: the whole layer against a numpy transcription of fla's
``naive_recurrent_gla`` (fla/ops/gla/naive.py) built from the module's own parameters (causal) and against the
full-matrix bidirectional form (forward + backward − diagonal); mode "chunk" against mode "recurrent" (outputs and
gradients, both directions); padding at the end and inside a row; causality; ``state_size``; the conformance kit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers.gla import GLAConfig
from tests import mixer_forms as forms

NAME = "gla"
D = 16
REL = 1e-9


def _inputs(seed, batch, length, d=D):
  return forms.rows(seed, batch, length, d)


def _close(got, want, rel=REL):
  forms.close(got, want, rel)


def reference_layer(params, x, cfg: GLAConfig, causal=True):
  """The whole layer in numpy float64 from the module's parameters (no padding)."""
  p = forms.as64(params)
  batch, length, d = x.shape
  heads, kd, vd = cfg.dims(d)
  split = lambda z, n: z.reshape(batch, length, heads, n)
  q = split(x @ p["q_proj"]["kernel"], kd)
  k = split(x @ p["k_proj"]["kernel"], kd)
  v = split(x @ p["v_proj"]["kernel"], vd)
  gk = (x @ p["gk_proj_0"]["kernel"]) @ p["gk_proj_1"]["kernel"] + p["gk_proj_1"]["bias"]
  gk = forms.log_sigmoid(split(gk, kd)) / cfg.gate_logit_normalizer
  o = forms.naive_recurrent_gla(q, k, v, gk) if causal else forms.bidirectional_gla(q, k, v, gk)
  g = split(x @ p["g_proj"]["kernel"], vd)
  o = forms.rms_norm(o, p["g_norm_weight"], cfg.norm_eps) * g / (1 + np.exp(-g))
  return o.reshape(batch, length, heads * vd) @ p["o_proj"]["kernel"]


def _layer(**overrides):
  mixer = attention_zoo.create_mixer(NAME, **overrides)
  return mixer, mixer.config


def _init(mixer, x, seed=0):
  variables = forms.init(mixer, x, seed=seed)
  # non-zero gate bias so that the gate's bias reaches the reference with a visible effect
  params = jax.tree_util.tree_map(lambda a: a, variables["params"])
  params["gk_proj_1"]["bias"] = jnp.asarray(np.random.default_rng(seed + 7).normal(size=params["gk_proj_1"]["bias"]
                                                                                    .shape), x.dtype)
  params["g_norm_weight"] = params["g_norm_weight"] + 0.3
  return {**variables, "params": params}


# The configs and shapes the tests share (one compilation each): the chunked form with chunks shorter than the rows.
CAUSAL = dict(causal=True, mode="chunk", chunk_size=4)
BIDIR = dict(causal=False, mode="chunk", chunk_size=4)
LENGTH = 14


def test_layer_matches_fla_naive_recurrent(x64):
  mixer, cfg = _layer(**CAUSAL)
  x = _inputs(0, 2, LENGTH) * 3.0
  variables = _init(mixer, x)
  out = forms.apply(mixer, variables, x, np.ones((2, LENGTH), bool))
  assert out.dtype == jnp.float64 and out.shape == x.shape
  _close(out, reference_layer(variables["params"], x, cfg, causal=True))


def test_bidirectional_matches_full_matrix_form(x64):
  mixer, cfg = _layer(**BIDIR)
  x = _inputs(1, 2, LENGTH) * 3.0
  variables = _init(mixer, x)
  out = forms.apply(mixer, variables, x, np.ones((2, LENGTH), bool))
  _close(out, reference_layer(variables["params"], x, cfg, causal=False))


@pytest.mark.parametrize("causal", [True, False])
def test_chunk_equals_recurrent_outputs_and_gradients(x64, causal):
  forms.engine_chunk_equals_recurrent(NAME, causal, _init, _close)


@pytest.mark.parametrize("overrides", [CAUSAL, BIDIR], ids=["causal", "bidirectional"])
def test_padding_end_and_middle_equals_row_without_padding(x64, overrides):
  forms.engine_padding_removed(NAME, overrides, _init, _close, LENGTH)


def test_causal_future_does_not_move_past(x64):
  forms.engine_causal(NAME, CAUSAL, BIDIR, _init, past_atol=1e-14, length=LENGTH)


def test_state_size_and_head_derivation():
  cfg = attention_zoo.mixer_config(NAME)
  # d_model 64: key dim 32, value dim 64, 4 heads of K 8, V 16 -> 4·8·16
  assert cfg.dims(64) == (4, 8, 16)
  assert cfg.state_size(1000, 64) == 4 * 8 * 16 == 64 * 64 // (2 * 4)
  assert cfg.state_size(10, 16) == 4 * 2 * 4
  assert cfg.dims(24) == (4, 3, 6)                        # 12 and 24 split into 4 heads
  assert cfg.dims(20) == (2, 5, 10)                       # 10 and 20: 4 does not divide 10, 2 does
  assert GLAConfig(num_heads=3).dims(16) == (2, 4, 8)


def test_initialisation_follows_fla_models(x64):
  mixer, _ = _layer(**CAUSAL)
  x = jnp.zeros((2, LENGTH, D))
  params = forms.as64(forms.init(mixer, x)["params"])
  kernels = np.concatenate([params[n]["kernel"].ravel() for n in ("q_proj", "k_proj", "v_proj", "g_proj",
                                                                    "gk_proj_0", "gk_proj_1", "o_proj")])
  assert kernels.size == 1408 and abs(kernels.std() / 0.02 - 1) < 0.1 and abs(kernels.mean()) < 2e-3
  assert np.all(params["gk_proj_1"]["bias"] == 0) and np.all(params["g_norm_weight"] == 1)
  assert params["gk_proj_0"]["kernel"].shape == (16, 16) and params["gk_proj_1"]["kernel"].shape == (16, 8)


def test_conformance_kit():
  forms.conformance(NAME)
