"""RetNet mixer (attention_zoo/mixers/retnet.py), float64 and tiny: the whole layer against a numpy transcription of
fla's ``naive_retention`` (fla/ops/retention/naive.py, the parallel form with the decay matrix) and of fla's RoPE
(``rotary_embedding_ref``, rotate-half) built from the module's own parameters (causal; with fla's optional short
convolutions), and against the same form
with a symmetric decay matrix γ^|i−j| (bidirectional); mode "chunk" against mode "recurrent" (outputs and gradients,
both directions); padding at the end and inside a row; causality; ``state_size``.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers.retnet import RetNetConfig
from tests import mixer_forms as forms

NAME = "retnet"
D = 16
REL = 1e-9
CAUSAL, LENGTH = forms.ENGINE_CAUSAL, forms.ENGINE_LENGTH


def _close(got, want, rel=REL):
  forms.close(got, want, rel)


def rotary_ref(z, base=10000.0):
  """fla ``RotaryEmbedding`` + ``rotary_embedding_ref`` (not interleaved, no xPos) in numpy: z [B, L, H, K] at
  positions 0..L−1; inv_freq = 1/base^(arange(0, K, 2)/K); [a cos − b sin, a sin + b cos] on the two halves."""
  length, k_dim = z.shape[1], z.shape[-1]
  inv_freq = 1.0 / base ** (np.arange(0, k_dim, 2) / k_dim)
  freqs = np.outer(np.arange(length), inv_freq)                               # [L, K/2]
  cos, sin = np.cos(freqs)[None, :, None], np.sin(freqs)[None, :, None]
  a, b = z[..., :k_dim // 2], z[..., k_dim // 2:]
  return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def naive_retention(q, k, v, causal=True):
  """fla ``naive_retention`` in numpy float64 (q, k [B, L, H, K], v [B, L, H, V]): s_h = log2(1 − 2^(−5−h)),
  n_ij = 2^((i−j)·s_h) for j ≤ i (0 above the diagonal), o = ((q·K^-1/2) k^T ⊙ n) v. ``causal=False``: the
  symmetric matrix n_ij = 2^(|i−j|·s_h) (each token once)."""
  length, heads, k_dim = q.shape[1], q.shape[2], q.shape[-1]
  s = np.log2(1 - 2.0 ** (-5.0 - np.arange(heads)))
  n = np.arange(length, dtype=np.float64)
  diff = n[:, None] - n[None, :]
  decay = np.exp2(np.abs(diff)[None] * s[:, None, None])                      # [H, L, L]
  if causal:
    decay = decay * (diff >= 0)[None]
  scores = np.einsum("bqhd,bkhd,hqk->bhqk", q * k_dim ** -0.5, k, decay)
  return np.einsum("bhqk,bkhd->bqhd", scores, v)


def reference_layer(params, x, cfg: RetNetConfig, causal=True):
  """The whole layer in numpy float64 from the module's parameters (no padding)."""
  p = forms.as64(params)
  batch, length, d = x.shape
  heads, kd, vd = cfg.dims(d)
  split = lambda z, n: z.reshape(batch, length, heads, n)
  qkv = [x @ p[f"{n}_proj"]["kernel"] for n in "qkv"]
  if cfg.use_short_conv:  # fla's ShortConvolution (SiLU) on each projection, before RoPE
    qkv = [forms.fla_short_conv(z, p[f"{n}_conv1d"]["kernel"]) for n, z in zip("qkv", qkv)]
  q = rotary_ref(split(qkv[0], kd), cfg.rope_base)
  k = rotary_ref(split(qkv[1], kd), cfg.rope_base)
  v = split(qkv[2], vd)
  return forms.fla_gated_output(p, naive_retention(q, k, v, causal), x, cfg.norm_eps)


def _init(mixer, x, seed=0):
  variables = forms.init(mixer, x, seed=seed)
  params = jax.tree_util.tree_map(lambda a: a, variables["params"])
  params["g_norm_weight"] = params["g_norm_weight"] + 0.3                       # a norm weight that is not 1
  return {**variables, "params": params}


@pytest.mark.parametrize("overrides", [CAUSAL, {**CAUSAL, "num_heads": 2}], ids=["default", "K8"])
def test_layer_matches_fla_naive_retention(x64, overrides):
  out, params, x, cfg = forms.engine_outputs(NAME, overrides, _init, seed=0)
  _close(out, reference_layer(params, x, cfg, causal=True))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_short_convolution_option_matches_reference_and_ignores_padding(x64, causal):
  """``use_short_conv=True`` (fla's option): the layer equals the transcription with fla's ShortConvolution on
  q, k, v before RoPE; row 0 padded inside and at its end (its padded positions 50·N(0, 1)) equals the row without
  them (the convolution windows and the RoPE positions count real tokens only)."""
  forms.check_short_conv_option(NAME, _init, _close, reference_layer, causal, ("q_conv1d", "k_conv1d", "v_conv1d"))


def test_state_size_and_head_derivation():
  cfg = attention_zoo.mixer_config(NAME)
  # d_model 64: key dim 64, value dim 128, 8 heads of K 8, V 16 -> 8·8·16 = 2·64²/8
  assert cfg.dims(64) == (8, 8, 16)
  assert cfg.state_size(1000, 64) == 8 * 8 * 16 == 2 * 64 * 64 // 8
  assert cfg.state_size(10, 16) == 8 * 2 * 4
  assert cfg.dims(24) == (6, 4, 8)                        # 8 does not divide 24; 6 does with K = 4 even
  assert cfg.dims(12) == (6, 2, 4)
  assert cfg.dims(10) == (5, 2, 4)
  assert cfg.dims(9) == (3, 3, 6)                         # no count gives an even K: the largest divisor
  # with fla's short convolutions: + the last W - 1 = 3 inputs of q, k (64 channels each) and v (128)
  assert RetNetConfig(use_short_conv=True).state_size(1000, 64) == 8 * 8 * 16 + 3 * (64 + 64 + 128)


def test_decays_and_rotary_positions(x64):
  from attention_zoo.mixers import retnet

  np.testing.assert_allclose(np.exp(retnet.retention_log_decay(8)), 1 - 2.0 ** (-5.0 - np.arange(8)), rtol=1e-15)
  z = jnp.asarray(forms.rows(8, 1, 6, 8).reshape(1, 6, 2, 4))
  positions = jnp.arange(6)[None]
  _close(retnet.rotary(z, positions, 10000.0), rotary_ref(np.asarray(z)))
  # odd K: the last channel passes through unrotated, the first 2·(K//2) rotate as K//2 pairs
  z5 = jnp.asarray(forms.rows(9, 1, 6, 5).reshape(1, 6, 1, 5))
  got = np.asarray(retnet.rotary(z5, positions, 10000.0))
  np.testing.assert_array_equal(got[..., 4], np.asarray(z5)[..., 4])
  assert not np.allclose(got[:, 1:, :, :4], np.asarray(z5)[:, 1:, :, :4])


def test_initialisation_follows_fla_models(x64):
  mixer = attention_zoo.create_mixer(NAME, **CAUSAL)
  x = jnp.zeros((2, LENGTH, D))
  params = forms.as64(forms.init(mixer, x)["params"])
  kernels = np.concatenate([params[n]["kernel"].ravel() for n in ("q_proj", "k_proj", "v_proj", "g_proj",
                                                                    "o_proj")])
  assert kernels.size == 2048 and abs(kernels.std() / 0.02 - 1) < 0.1 and abs(kernels.mean()) < 2e-3
  assert np.all(params["g_norm_weight"] == 1) and params["g_norm_weight"].shape == (4,)
  assert set(params) == {"q_proj", "k_proj", "v_proj", "g_proj", "o_proj", "g_norm_weight"}


class TestContract(forms.EngineContract):
  """The family's tests (tests/mixer_forms.py) with this file's initialisation, comparison and reference."""

  name = NAME
  make_variables = staticmethod(_init)
  agree = staticmethod(_close)
  bidirectional_reference = staticmethod(functools.partial(reference_layer, causal=False))
