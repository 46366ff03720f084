"""Mamba-2 mixer (attention_zoo/mixers/mamba2.py), float64 and tiny: the whole layer against numpy transcriptions of
mamba_ssm's token-by-token ``Mamba2.step`` (mamba_ssm/modules/mamba2.py: the rolled conv state, the discretised
SSM update, D skip, gated RMSNorm) and of ``ssd_minimal_discrete`` (mamba_ssm/modules/ssd_minimal.py, the chunked SSD
form) built from the module's own parameters (causal), and against the full-matrix bidirectional form; mode "chunk"
against mode "recurrent" (outputs and gradients, both directions); padding at the end and inside a row (the short
convolution included); causality; ``state_size``; the initialisation.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers.mamba2 import Mamba2Config
from tests import mixer_forms as forms

NAME = "mamba2"
D = 16
REL = 1e-9
CAUSAL, LENGTH = forms.ENGINE_CAUSAL, forms.ENGINE_LENGTH


def _close(got, want, rel=REL):
  forms.close(got, want, rel)


def conv_and_split(p, x, cfg: Mamba2Config):
  """in_proj, then ``Mamba2.step``'s convolution token by token (conv_state [B, C, W] rolled left, the newest input
  in the last column, xBC = silu(Σ_w conv_state ⊙ weight + bias)), split into z, x, B, C, Δ (float64 numpy)."""
  batch, length, d = x.shape
  d_inner, heads, headdim = cfg.dims(d)
  n, g, width = cfg.d_state, cfg.ngroups, cfg.d_conv
  zxbcdt = x @ p["in_proj"]["kernel"]
  z, xbc, dt = np.split(zxbcdt, [d_inner, 2 * d_inner + 2 * g * n], axis=-1)
  weight = p["conv1d_kernel"].T                                                  # torch layout [C, W]
  conv_state = np.zeros((batch, xbc.shape[-1], width))
  conv_out = np.zeros_like(xbc)
  for t in range(length):
    conv_state = np.roll(conv_state, -1, axis=-1)
    conv_state[:, :, -1] = xbc[:, t]
    conv_out[:, t] = forms.silu(np.sum(conv_state * weight, axis=-1) + p["conv1d_bias"])
  xs, b_in, c_in = np.split(conv_out, [d_inner, d_inner + g * n], axis=-1)
  per_group = heads // g
  b_in = np.repeat(b_in.reshape(batch, length, g, n), per_group, axis=2)
  c_in = np.repeat(c_in.reshape(batch, length, g, n), per_group, axis=2)
  delta = forms.softplus(dt + p["ssm_dt_bias"])
  return z, xs.reshape(batch, length, heads, headdim), b_in, c_in, delta


def ssm_step(xs, a, b_in, c_in, delta, d_skip):
  """``Mamba2.step``'s SSM update per token (ngroups expanded to heads): dA = exp(Δ·A), state = state·dA +
  einsum(Δ, B, x), y = state·C + D·x. state [B, H, P, N]."""
  batch, length, heads, headdim = xs.shape
  state = np.zeros((batch, heads, headdim, b_in.shape[-1]))
  y = np.zeros_like(xs)
  for t in range(length):
    d_a = np.exp(delta[:, t] * a)
    d_bx = np.einsum("bh,bhn,bhp->bhpn", delta[:, t], b_in[:, t], xs[:, t])
    state = state * d_a[..., None, None] + d_bx
    y[:, t] = np.einsum("bhpn,bhn->bhp", state, c_in[:, t]) + d_skip[:, None] * xs[:, t]
  return y


def segsum(z):
  """ssd_minimal's stable segment sum: out[..., i, j] = Σ_{j<m≤i} z_m for j ≤ i, −inf above the diagonal."""
  length = z.shape[-1]
  rep = np.repeat(z[..., None], length, axis=-1)                                 # [..., m, j] = z_m
  rep = np.where(np.tril(np.ones((length, length), bool), -1), rep, 0.0)
  out = np.cumsum(rep, axis=-2)
  return np.where(np.tril(np.ones((length, length), bool), 0), out, -np.inf)


def ssd_minimal_discrete(big_x, big_a, big_b, big_c, block_len):
  """mamba_ssm ``ssd_minimal_discrete`` in numpy: X [b, l, h, p], A [b, l, h], B, C [b, l, h, n] -> Y."""
  batch, length = big_x.shape[:2]
  chunks = length // block_len
  rs = lambda t: t.reshape(batch, chunks, block_len, *t.shape[2:])
  big_x, big_a, big_b, big_c = rs(big_x), rs(big_a), rs(big_b), rs(big_c)
  big_a = np.transpose(big_a, (0, 3, 1, 2))                                      # b h c l
  a_cumsum = np.cumsum(big_a, axis=-1)
  decay = np.exp(segsum(big_a))
  y_diag = np.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", big_c, big_b, decay, big_x)
  decay_states = np.exp(a_cumsum[..., -1:] - a_cumsum)
  states = np.einsum("bclhn,bhcl,bclhp->bchpn", big_b, decay_states, big_x)
  states = np.concatenate([np.zeros_like(states[:, :1]), states], axis=1)
  decay_chunk = np.exp(segsum(np.pad(a_cumsum[..., -1], ((0, 0), (0, 0), (1, 0)))))
  new_states = np.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
  y_off = np.einsum("bclhn,bchpn,bhcl->bclhp", big_c, new_states, np.exp(a_cumsum))
  return (y_diag + y_off).reshape(batch, length, *y_diag.shape[3:])


def ssm_bidirectional(xs, a, b_in, c_in, delta, d_skip):
  """The full-matrix bidirectional form: y_i = Σ_j (C_i·B_j) Δ_j exp(−|cum_i − cum_j|) x_j + D x_i with cum_t =
  Σ_{m≤t} Δ_m A (the decays strictly after the earlier of i, j up to the later one; each token once)."""
  cum = np.cumsum(delta * a, axis=1)                                             # [B, L, H]
  weight = np.exp(-np.abs(cum[:, :, None] - cum[:, None, :]))                    # [B, i, j, H]
  scores = np.einsum("bihn,bjhn,bjh,bijh->bhij", c_in, b_in, delta, weight)
  return np.einsum("bhij,bjhp->bihp", scores, xs) + d_skip[:, None] * xs


def reference_layer(params, x, cfg: Mamba2Config, core="step"):
  """The whole layer in numpy float64 from the module's parameters (no padding); ``core``: "step" (Mamba2.step),
  "ssd" (ssd_minimal_discrete, blocks of 7, plus D·x) or "bidirectional"."""
  p = forms.as64(params)
  batch, length, d = x.shape
  d_inner, _, _ = cfg.dims(d)
  z, xs, b_in, c_in, delta = conv_and_split(p, x, cfg)
  a = -np.exp(p["ssm_A_log"])
  if core == "step":
    y = ssm_step(xs, a, b_in, c_in, delta, p["D"])
  elif core == "ssd":
    y = ssd_minimal_discrete(xs * delta[..., None], a * delta, b_in, c_in, 7) + p["D"][:, None] * xs
  else:
    y = ssm_bidirectional(xs, a, b_in, c_in, delta, p["D"])
  y = y.reshape(batch, length, d_inner) * forms.silu(z)                              # rmsnorm(y ⊙ silu(z)) ⊙ w
  y = y.reshape(batch, length, cfg.ngroups, d_inner // cfg.ngroups)
  y = y / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + cfg.norm_eps)
  y = y.reshape(batch, length, d_inner) * p["norm_weight"]
  return y @ p["out_proj"]["kernel"]


def _init(mixer, x, seed=0):
  variables = forms.init(mixer, x, seed=seed)
  # a D skip and a norm weight that are not 1, larger steps Δ (so that the state decays visibly over a row)
  params = jax.tree_util.tree_map(lambda a: a, variables["params"])
  rng = np.random.default_rng(seed + 7)
  params["D"] = jnp.asarray(rng.normal(size=params["D"].shape), x.dtype)
  params["norm_weight"] = params["norm_weight"] + jnp.asarray(rng.uniform(0, 1, params["norm_weight"].shape), x.dtype)
  params["ssm_dt_bias"] = params["ssm_dt_bias"] + 2.0
  return {**variables, "params": params}


GROUPS = dict(CAUSAL, headdim=8, ngroups=2, d_state=6)    # 4 heads, 2 groups


@pytest.mark.parametrize("overrides", [CAUSAL, GROUPS], ids=["default", "groups"])
def test_layer_matches_mamba2_step_and_ssd_minimal(x64, overrides):
  out, params, x, cfg = forms.engine_outputs(NAME, overrides, _init, seed=0)
  _close(out, reference_layer(params, x, cfg, core="step"))
  _close(out, reference_layer(params, x, cfg, core="ssd"))


def test_state_size_and_head_derivation():
  cfg = attention_zoo.mixer_config(NAME)
  # E = 2D; P = the largest divisor of E that is <= 64; H = E / P
  assert cfg.dims(16) == (32, 1, 32) and cfg.dims(64) == (128, 2, 64) and cfg.dims(512) == (1024, 16, 64)
  assert cfg.dims(20) == (40, 1, 40) and cfg.dims(48) == (96, 2, 48)
  # E·N + (W − 1)·(E + 2·G·N)
  assert cfg.state_size(1000, 16) == 32 * 64 + 3 * (32 + 2 * 64) == 2528
  assert cfg.state_size(5, 64) == 128 * 64 + 3 * (128 + 128)
  small = Mamba2Config(d_state=8, d_conv=2, headdim=8, ngroups=2)
  assert small.state_size(5, 16) == 32 * 8 + 1 * (32 + 2 * 2 * 8)
  with pytest.raises(ValueError):
    Mamba2Config(ngroups=2).dims(16)                        # one head cannot be split into 2 groups


def test_initialisation_follows_mamba_ssm(x64):
  mixer = attention_zoo.create_mixer(NAME, **CAUSAL)
  x = jnp.zeros((2, LENGTH, D))
  params = forms.as64(forms.init(mixer, x)["params"])
  assert set(params) == {"in_proj", "conv1d_kernel", "conv1d_bias", "ssm_dt_bias", "ssm_A_log", "D", "norm_weight",
                         "out_proj"}
  w = params["in_proj"]["kernel"]                                                 # U(±1/√D), [D, 2E + 2N + H]
  assert w.shape == (16, 2 * 32 + 2 * 64 + 1) and np.abs(w).max() <= 0.25
  assert abs(w.std() * np.sqrt(3) / 0.25 - 1) < 0.05
  assert np.abs(params["out_proj"]["kernel"]).max() <= 32 ** -0.5
  assert params["conv1d_kernel"].shape == (4, 32 + 128) and np.abs(params["conv1d_kernel"]).max() <= 0.5
  assert np.abs(params["conv1d_bias"]).max() <= 0.5 and np.all(params["D"] == 1) and np.all(params["norm_weight"] == 1)
  a, dt = [], []
  for seed in range(8):                                                           # 4 heads a draw: Δ0 and A ranges
    p = forms.as64(forms.init(attention_zoo.create_mixer(NAME, **GROUPS), x, seed=seed)["params"])
    a.append(np.exp(p["ssm_A_log"]))
    dt.append(forms.softplus(p["ssm_dt_bias"]))
  a, dt = np.concatenate(a), np.concatenate(dt)
  assert a.shape == (32,) and np.all((a >= 1) & (a <= 16)) and a.std() > 2
  assert np.all((dt >= 1e-3 * (1 - 1e-9)) & (dt <= 0.1 * (1 + 1e-9)))
  assert np.log(dt).std() > 0.5                                                  # log-uniform over two decades
  assert Mamba2Config(A_init_range=[2, 3]).A_init_range == (2.0, 3.0)


class TestContract(forms.EngineContract):
  """The family's tests (tests/mixer_forms.py) with this file's initialisation, comparison and reference."""

  name = NAME
  make_variables = staticmethod(_init)
  agree = staticmethod(_close)
  bidirectional_reference = staticmethod(functools.partial(reference_layer, core="bidirectional"))
