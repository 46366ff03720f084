"""HGRN2 mixer (attention_zoo/mixers/hgrn2.py), float64 and tiny: the whole layer against a numpy transcription of
fla's ``HGRN2Attention`` gates (fla/layers/hgrn2.py) and of ``naive_recurrent_gla`` (fla/ops/gla/naive.py, the kernel
HGRN2 runs on; in tests/mixer_forms.py) built from the module's own parameters (causal; with and without a lower
bound; with fla's optional short convolutions), and against the full-matrix bidirectional form (forward + backward −
diagonal); mode "chunk" against mode "recurrent" (outputs and gradients, both directions); padding at the end and
inside a row; causality; ``state_size``. The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers.hgrn2 import HGRN2Config
from tests import mixer_forms as forms

NAME = "hgrn2"
D = 16
REL = 1e-9
CAUSAL, LENGTH = forms.ENGINE_CAUSAL, forms.ENGINE_LENGTH


def _close(got, want, rel=REL):
  forms.close(got, want, rel)


def reference_layer(params, x, cfg: HGRN2Config, causal=True):
  """The whole layer in numpy float64 from the module's parameters (no padding), as fla's layer computes it:
  q = swish(q_proj x), g = logsigmoid(f_proj x) (with a bound β: logaddexp(log β, log1p(−β) + g)), k = 1 − exp(g),
  the GLA recurrence, RMSNorm over all of D, o_proj."""
  p = forms.as64(params)
  batch, length, d = x.shape
  heads, kd, vd = cfg.dims(d)
  split = lambda z, n: z.reshape(batch, length, heads, n)
  q, f, i = (x @ p[f"{n}_proj"]["kernel"] for n in "qfi")
  if cfg.use_short_conv:  # fla's ShortConvolution with activation=None on each projection
    q, f, i = (forms.fla_short_conv(z, p[f"{n}_conv1d"]["kernel"], activation=False) for n, z in zip("qfi", (q, f, i)))
  q = q / (1 + np.exp(-q))
  g = forms.log_sigmoid(f)
  if cfg.lower_bound > 0:
    g = np.logaddexp(np.log(cfg.lower_bound), np.log1p(-cfg.lower_bound) + g)
  k = 1 - np.exp(g)
  q, k, g, i = split(q, kd), split(k, kd), split(g, kd), split(i, vd)
  o = forms.naive_recurrent_gla(q, k, i, g) if causal else forms.bidirectional_gla(q, k, i, g)
  o = forms.rms_norm(o.reshape(batch, length, heads * vd), p["g_norm_weight"], cfg.norm_eps)
  return o @ p["o_proj"]["kernel"]


def _init(mixer, x, seed=0):
  variables = forms.init(mixer, x, seed=seed)
  # larger projections than fla's N(0, 0.02²) so that the gates leave their linear range, a norm weight not 1
  params = jax.tree_util.tree_map(lambda a: 10.0 * a, variables["params"])
  params["g_norm_weight"] = variables["params"]["g_norm_weight"] + 0.3
  return {**variables, "params": params}


def test_layer_matches_fla_naive_recurrent(x64):
  out, params, x, cfg = forms.engine_outputs(NAME, CAUSAL, _init, seed=0)
  _close(out, reference_layer(params, x, cfg, causal=True))


def test_lower_bound_matches_fla_logaddexp_form(x64):
  out, params, x, cfg = forms.engine_outputs(NAME, dict(causal=True, mode="recurrent", lower_bound=0.4), _init, seed=9)
  _close(out, reference_layer(params, x, cfg, causal=True))
  unbounded = attention_zoo.create_mixer(NAME, causal=True, mode="recurrent")
  assert not np.allclose(out, forms.apply(unbounded, {"params": params}, x, np.ones((2, LENGTH), bool)))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_short_convolution_option_matches_reference_and_ignores_padding(x64, causal):
  """``use_short_conv=True`` (fla's option): the layer equals the transcription with fla's ShortConvolution
  (activation None) on q, f, i; row 0 padded inside and at its end (its padded positions 50·N(0, 1)) equals the row
  without them."""
  forms.check_short_conv_option(NAME, _init, _close, reference_layer, causal, ("q_conv1d", "f_conv1d", "i_conv1d"),
                                lower_bound=0.3)


def test_state_size_and_head_derivation():
  cfg = attention_zoo.mixer_config(NAME)
  # E = the largest divisor of D that is <= 128, H = D / E: one head up to D = 128, then D / 128 heads
  assert cfg.dims(16) == (1, 16, 16) and cfg.dims(64) == (1, 64, 64) and cfg.dims(128) == (1, 128, 128)
  assert cfg.dims(512) == (4, 128, 128) and cfg.dims(384) == (3, 128, 128)
  assert cfg.dims(200) == (2, 100, 100)                   # 128 does not divide 200: E = 100
  assert cfg.state_size(1000, 16) == 16 * 16              # H·K·V = D·E
  assert cfg.state_size(7, 512) == 4 * 128 * 128 == 512 * 128
  assert HGRN2Config(expand_ratio=4).state_size(7, 16) == 4 * 4 * 4
  # with fla's short convolutions: + the last W - 1 = 3 inputs of q and f (H·K = 64 channels each) and i (D = 64)
  assert HGRN2Config(use_short_conv=True).state_size(1000, 64) == 64 * 64 + 3 * (64 + 64 + 64)
  with pytest.raises(ValueError):
    HGRN2Config(lower_bound=1.0)


def test_initialisation_follows_fla_models(x64):
  mixer = attention_zoo.create_mixer(NAME, **CAUSAL)
  x = jnp.zeros((2, LENGTH, D))
  params = forms.as64(forms.init(mixer, x)["params"])
  kernels = np.concatenate([params[n]["kernel"].ravel() for n in ("q_proj", "f_proj", "i_proj", "o_proj")])
  assert kernels.size == 1024 and abs(kernels.std() / 0.02 - 1) < 0.1 and abs(kernels.mean()) < 2e-3
  assert np.all(params["g_norm_weight"] == 1) and params["g_norm_weight"].shape == (D,)
  assert set(params) == {"q_proj", "f_proj", "i_proj", "o_proj", "g_norm_weight"}


class TestContract(forms.EngineContract):
  """The family's tests (tests/mixer_forms.py) with this file's initialisation, comparison and reference."""

  name = NAME
  make_variables = staticmethod(_init)
  agree = staticmethod(_close)
  bidirectional_reference = staticmethod(functools.partial(reference_layer, causal=False))
