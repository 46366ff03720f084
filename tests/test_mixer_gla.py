"""GLA mixer (attention_zoo/mixers/gla.py), float64 and tiny: the whole layer against a numpy transcription of fla's
``naive_recurrent_gla`` (fla/ops/gla/naive.py) built from the module's own parameters (causal) and against the
full-matrix bidirectional form (forward + backward − diagonal); mode "chunk" against mode "recurrent" (outputs and
gradients, both directions); padding at the end and inside a row; causality; ``state_size``.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import functools

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
CAUSAL, LENGTH = forms.ENGINE_CAUSAL, forms.ENGINE_LENGTH


def _close(got, want, rel=REL):
  forms.close(got, want, rel)


def reference_layer(params, x, cfg: GLAConfig, causal=True):
  """The whole layer in numpy float64 from the module's parameters (no padding)."""
  p = forms.as64(params)
  batch, length, d = x.shape
  heads, kd, vd = cfg.dims(d)
  split = lambda z, n: z.reshape(batch, length, heads, n)
  qkv = [x @ p[f"{n}_proj"]["kernel"] for n in "qkv"]
  if cfg.use_short_conv:  # fla's ShortConvolution (SiLU) on each projection
    qkv = [forms.fla_short_conv(z, p[f"{n}_conv1d"]["kernel"]) for n, z in zip("qkv", qkv)]
  q, k, v = split(qkv[0], kd), split(qkv[1], kd), split(qkv[2], vd)
  gk = (x @ p["gk_proj_0"]["kernel"]) @ p["gk_proj_1"]["kernel"] + p["gk_proj_1"]["bias"]
  gk = forms.log_sigmoid(split(gk, kd)) / cfg.gate_logit_normalizer
  o = forms.naive_recurrent_gla(q, k, v, gk) if causal else forms.bidirectional_gla(q, k, v, gk)
  return forms.fla_gated_output(p, o, x, cfg.norm_eps)


def _init(mixer, x, seed=0):
  variables = forms.init(mixer, x, seed=seed)
  # non-zero gate bias so that the gate's bias reaches the reference with a visible effect
  params = jax.tree_util.tree_map(lambda a: a, variables["params"])
  params["gk_proj_1"]["bias"] = jnp.asarray(np.random.default_rng(seed + 7).normal(size=params["gk_proj_1"]["bias"]
                                                                                    .shape), x.dtype)
  params["g_norm_weight"] = params["g_norm_weight"] + 0.3
  return {**variables, "params": params}


def test_layer_matches_fla_naive_recurrent(x64):
  out, params, x, cfg = forms.engine_outputs(NAME, CAUSAL, _init, seed=0)
  _close(out, reference_layer(params, x, cfg, causal=True))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_short_convolution_option_matches_reference_and_ignores_padding(x64, causal):
  """``use_short_conv=True`` (fla's option): the layer equals the transcription with fla's ShortConvolution on
  q, k, v; row 0 padded inside and at its end (its padded positions 50·N(0, 1)) equals the row without them."""
  forms.check_short_conv_option(NAME, _init, _close, reference_layer, causal, ("q_conv1d", "k_conv1d", "v_conv1d"))


def test_state_size_and_head_derivation():
  cfg = attention_zoo.mixer_config(NAME)
  # d_model 64: key dim 32, value dim 64, 4 heads of K 8, V 16 -> 4·8·16
  assert cfg.dims(64) == (4, 8, 16)
  assert cfg.state_size(1000, 64) == 4 * 8 * 16 == 64 * 64 // (2 * 4)
  assert cfg.state_size(10, 16) == 4 * 2 * 4
  assert cfg.dims(24) == (4, 3, 6)                        # 12 and 24 split into 4 heads
  assert cfg.dims(20) == (2, 5, 10)                       # 10 and 20: 4 does not divide 10, 2 does
  assert GLAConfig(num_heads=3).dims(16) == (2, 4, 8)
  # with fla's short convolutions: + the last W - 1 = 3 inputs of q, k (32 channels each) and v (64)
  assert GLAConfig(use_short_conv=True).state_size(1000, 64) == 4 * 8 * 16 + 3 * (32 + 32 + 64)


def test_initialisation_follows_fla_models(x64):
  mixer = attention_zoo.create_mixer(NAME, **CAUSAL)
  x = jnp.zeros((2, LENGTH, D))
  params = forms.as64(forms.init(mixer, x)["params"])
  kernels = np.concatenate([params[n]["kernel"].ravel() for n in ("q_proj", "k_proj", "v_proj", "g_proj",
                                                                    "gk_proj_0", "gk_proj_1", "o_proj")])
  assert kernels.size == 1408 and abs(kernels.std() / 0.02 - 1) < 0.1 and abs(kernels.mean()) < 2e-3
  assert np.all(params["gk_proj_1"]["bias"] == 0) and np.all(params["g_norm_weight"] == 1)
  assert params["gk_proj_0"]["kernel"].shape == (16, 16) and params["gk_proj_1"]["kernel"].shape == (16, 8)


class TestContract(forms.EngineContract):
  """The family's tests (tests/mixer_forms.py) with this file's initialisation, comparison and reference."""

  name = NAME
  make_variables = staticmethod(_init)
  agree = staticmethod(_close)
  bidirectional_reference = staticmethod(functools.partial(reference_layer, causal=False))
