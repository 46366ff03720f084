"""RWKV-7 mixer (attention_zoo/mixers/rwkv7.py): the whole layer against a float64 numpy transcription of
RWKV-LM's ``RWKV_Tmix_x070`` ("slow pytorch version" lines) around fla's ``dplr_recurrence`` loop and RWKV-LM's
``wkv7`` kernel loop (causal; the two loops also against each other), and bidirectional (the fla loop over the
row plus over the reversed row, minus token t's own write); chunk == recurrent (outputs and gradients);
padding at the end and in the middle; causality; the state size; the initial values.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import attention_zoo
from attention_zoo.mixers import _layer_common, rwkv7
from tests import mixer_forms as forms

TOL = 1e-9


def _agree(got, want):
  assert forms.rel_err(got, want) <= TOL


def dplr_fla(q, k, v, alpha, beta, gk, scale=1.0):
  """fla ``dplr_recurrence`` ([B, H, T, K] layout, state [K, V]): kv = k vᵀ + β (αᵀ S); S = S·exp(gk) + kv;
  o = qᵀ S. fla's naive scales q by K^-1/2; RWKV7Attention calls its kernels with scale=1, as here."""
  bsz, h, length, kd = q.shape
  o = np.zeros_like(v)
  state = np.zeros((bsz, h, kd, v.shape[-1]))
  for i in range(length):
    kv = k[:, :, i, :, None] * v[:, :, i, None, :] + (state * alpha[:, :, i, :, None]).sum(-2, keepdims=True) * \
        beta[:, :, i, :, None]
    state = state * np.exp(gk[:, :, i])[..., None] + kv
    o[:, :, i] = np.einsum("bhk,bhkv->bhv", q[:, :, i] * scale, state)
  return o


def wkv7_rwkv_lm(r, w, k, v, a, b):
  """RWKV-LM's ``wkv7`` CUDA forward loop (state [V, K]: row i = value channel): sa = S a; S = S ⊙ w + sa bᵀ
  + v kᵀ; y = S r. ``w`` is the decay itself (the kernel's exp(−e^{−1/2} σ(w_raw)))."""
  bsz, h, length, kd = r.shape
  y = np.zeros_like(v)
  state = np.zeros((bsz, h, v.shape[-1], kd))
  for t in range(length):
    sa = np.einsum("bhij,bhj->bhi", state, a[:, :, t])
    write = v[:, :, t, :, None] * k[:, :, t, None, :]
    state = state * w[:, :, t, None, :] + sa[..., None] * b[:, :, t, None, :] + write
    y[:, :, t] = np.einsum("bhij,bhj->bhi", state, r[:, :, t])
  return y


def reference(params, x, head_dim, causal=True):
  """float64 numpy RWKV-7 time mix, no padding (RWKV-LM x070's slow pytorch lines, layer 0: v_first = v)."""
  p = params
  x = np.asarray(x, np.float64)
  bsz, length, d = x.shape
  h, kd = _layer_common.rwkv_heads(d, head_dim)
  xx = forms.rwkv_shift(x, kd, causal)
  xr, xw, xk, xv, xa, xg = (x + xx * p[name] for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"))
  r = xr @ p["receptance"]["kernel"]
  w = p["w0"] + np.tanh(xw @ p["w1"]) @ p["w2"]
  k = xk @ p["key"]["kernel"]
  v = xv @ p["value"]["kernel"]
  a = forms.sigmoid(p["a0"] + (xa @ p["a1"]) @ p["a2"])
  g = forms.sigmoid(xg @ p["g1"]) @ p["g2"]
  heads_first = lambda z: z.reshape(bsz, length, h, kd).transpose(0, 2, 1, 3)  # [B, H, T, K]
  kk = heads_first(k * p["k_k"])
  kk = kk / np.maximum(np.linalg.norm(kk, axis=-1, keepdims=True), 1e-12)
  k = k * (1 + (a - 1) * p["k_a"])
  r_, k_, v_, a_ = heads_first(r), heads_first(k), heads_first(v), heads_first(a)
  log_w = -math.exp(-0.5) * forms.sigmoid(heads_first(w))  # the clampw kernel: exp(W_SCALE / (1 + exp(-w)))
  o = dplr_fla(r_, k_, v_, alpha=-kk, beta=kk * a_, gk=log_w)
  if causal:
    np.testing.assert_allclose(wkv7_rwkv_lm(r_, np.exp(log_w), k_, v_, -kk, kk * a_), o, rtol=1e-12, atol=1e-12)
  else:  # the same loop over the reversed row; token t's own write, in both, counted once
    flip = lambda z: z[:, :, ::-1]
    o = o + flip(dplr_fla(flip(r_), flip(k_), flip(v_), alpha=-flip(kk), beta=flip(kk * a_), gk=flip(log_w)))
    o = o - (r_ * k_).sum(-1, keepdims=True) * v_
  normed = forms.rwkv_ln_x(o.transpose(0, 2, 1, 3), p["ln_x_scale"], p["ln_x_bias"], kd * 1e-5)  # o [B, T, H, V]
  bonus = ((r_ * k_ * p["r_k"][None, :, None]).sum(-1, keepdims=True) * v_).transpose(0, 2, 1, 3)
  return ((normed + bonus.reshape(bsz, length, d)) * g) @ p["output"]["kernel"]


def test_initial_values():
  """RWKV-LM x070's inits at layer 0 of a one-layer model (ratio_0_to_1 = 0, ratio_1_to_almost0 = 1)."""
  d, kd = 16, 8
  mixer = attention_zoo.create_mixer("rwkv7", head_dim=kd)
  params = jax.jit(mixer.init)(jax.random.key(0), jnp.zeros((1, 3, d)), jnp.ones((1, 3), bool))["params"]
  n = np.arange(d)
  ddd, linear = n / d, n / (d - 1) - 0.5
  z = ((n % kd) - (kd - 1) / 2) / ((kd - 1) / 2)
  zigzag = z * np.abs(z)
  np.testing.assert_allclose(params["x_r"], 1 - ddd**0.2, atol=1e-6)
  np.testing.assert_allclose(params["x_w"], 1 - ddd**0.9, atol=1e-6)
  np.testing.assert_allclose(params["x_k"], 1 - ddd**0.7, atol=1e-6)
  np.testing.assert_allclose(params["w0"], -6 + 6 * n / (d - 1) + 0.5 + 2.5 * zigzag, atol=1e-6)
  np.testing.assert_allclose(params["a0"], -0.19 + 0.3 * zigzag + 0.4 * linear, atol=1e-6)
  np.testing.assert_allclose(params["k_k"], 0.71 - 0.1 * linear, atol=1e-6)
  np.testing.assert_allclose(params["k_a"], 1.02, atol=1e-6)
  np.testing.assert_allclose(params["r_k"], -0.04, atol=1e-7)
  assert params["w1"].shape == (d, 32) and params["g1"].shape == (d, 32)  # max(32, round(c sqrt(16) / 32) 32)
  w2 = np.asarray(params["w2"])  # [32, 16]: orthogonal columns, gain 0.1 * sqrt(32 / 16)
  np.testing.assert_allclose(w2.T @ w2, 0.01 * 2 * np.eye(d), atol=1e-6)
  assert rwkv7.RWKV7Config().ranks(512) == (64, 64, 128)
  assert rwkv7.RWKV7Config.family == "linear-recurrent" and rwkv7.RWKV7Config.paper_name == "RWKV-7"


class TestContract(forms.RWKVContract):
  """The family's tests (tests/mixer_forms.py) with this file's comparison and reference."""

  name = "rwkv7"
  agree = staticmethod(_agree)
  reference = staticmethod(reference)
