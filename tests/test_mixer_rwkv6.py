"""RWKV-6 mixer (attention_zoo/mixers/rwkv6.py): the whole layer against a float64 numpy transcription of
RWKV-LM's ``RWKV_Tmix_x060.forward`` around fla's ``naive_recurrent_rwkv6`` loop (causal) and Vision-RWKV-6's
Bi-WKV loop (bidirectional), built from the layer's own parameters; chunk == recurrent (outputs and
gradients); padding at the end and in the middle; causality; the state size; the initial values.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import attention_zoo
from attention_zoo.mixers import _layer_common, rwkv6
from tests import mixer_forms as forms

TOL = 1e-9


def _agree(got, want):
  assert forms.rel_err(got, want) <= TOL


def reference(params, x, head_dim, causal=True, eps=64e-5):
  """float64 numpy RWKV-6 time mix, no padding: RWKV-LM x060 (token shift, ddlerp, LoRAs, ln_x, gate, output)
  with fla's naive_recurrent_rwkv6 loop (scale 1); bidirectional: Vision-RWKV-6's Bi-WKV (a backward loop
  that reads before writing) and the one-axis q-shift (half of each head's channels from the next token)."""
  p = params
  x = np.asarray(x, np.float64)
  bsz, length, d = x.shape
  h, kd = _layer_common.rwkv_heads(d, head_dim)
  xx = forms.rwkv_shift(x, kd, causal)
  xxx = np.tanh((x + xx * p["time_maa_x"]) @ p["time_maa_w1"]).reshape(bsz, length, 5, -1)
  mw, mk, mv, mr, mg = (np.einsum("blr,rd->bld", xxx[:, :, i], p["time_maa_w2"][i]) for i in range(5))
  xw = x + xx * (p["time_maa_w"] + mw)
  xk = x + xx * (p["time_maa_k"] + mk)
  xv = x + xx * (p["time_maa_v"] + mv)
  xr = x + xx * (p["time_maa_r"] + mr)
  xg = x + xx * (p["time_maa_g"] + mg)
  r = xr @ p["receptance"]["kernel"]
  k = xk @ p["key"]["kernel"]
  v = xv @ p["value"]["kernel"]
  gate = xg @ p["gate"]["kernel"]
  g = gate / (1 + np.exp(-gate))
  w = p["time_decay"] + np.tanh(xw @ p["time_decay_w1"]) @ p["time_decay_w2"]
  heads_first = lambda z: z.reshape(bsz, length, h, kd).transpose(0, 2, 1, 3)  # [B, H, T, K], fla's layout
  q_, k_, v_, w_ = heads_first(r), heads_first(k), heads_first(v), heads_first(-np.exp(w))
  u = p["time_faaaa"]
  # fla naive_recurrent_rwkv6: o_i = sum_k (h + u k_i v_i^T) q_i ; h = h * exp(w_i) + k_i v_i^T
  o = np.zeros_like(v_)
  state = np.zeros((bsz, h, kd, kd))
  for i in range(length):
    kv = k_[:, :, i, :, None] * v_[:, :, i, None, :]
    o[:, :, i] = ((state + u[None, :, :, None] * kv) * q_[:, :, i, :, None]).sum(-2)
    state = state * np.exp(w_[:, :, i])[..., None] + kv
  if not causal:  # Vision-RWKV-6 kernel_forward's first loop: from the end, y += r . state2 before writing
    state = np.zeros((bsz, h, kd, kd))
    for i in range(length - 1, -1, -1):
      o[:, :, i] += (state * q_[:, :, i, :, None]).sum(-2)
      state = state * np.exp(w_[:, :, i])[..., None] + k_[:, :, i, :, None] * v_[:, :, i, None, :]
  normed = forms.rwkv_ln_x(o.transpose(0, 2, 1, 3), p["ln_x_scale"], p["ln_x_bias"], eps)  # o [B, T, H, V]
  return (normed * g) @ p["output"]["kernel"]


def test_token_shift_skips_padding(x64):
  x = jnp.arange(1.0, 7.0)[None, :, None] * jnp.ones((1, 1, 4))
  mask = jnp.asarray([[False, True, False, False, True, True]])
  prev = np.asarray(_layer_common.token_shift(x, mask, causal=True, block=4))[0, :, 0]
  assert list(prev[[1, 4, 5]]) == [0.0, 2.0, 5.0]  # previous real tokens: none, 2, 5
  both = np.asarray(_layer_common.token_shift(x, mask, causal=False, block=4))[0]
  assert list(both[[1, 4, 5], 0]) == [0.0, 2.0, 5.0]  # channels 0, 1: from the previous real token
  assert list(both[[1, 4, 5], 3]) == [5.0, 6.0, 0.0]  # channels 2, 3: from the next real token


def test_initial_values():
  """RWKV-LM x060's inits at layer 0 of a one-layer model (ratio_0_to_1 = 0, ratio_1_to_almost0 = 1)."""
  mixer = attention_zoo.create_mixer("rwkv6")
  d = 16
  params = jax.jit(mixer.init)(jax.random.key(0), jnp.zeros((1, 3, d)), jnp.ones((1, 3), bool))["params"]
  n = np.arange(d)
  ddd = n / d
  np.testing.assert_allclose(params["time_maa_x"], 1 - ddd, atol=1e-7)
  np.testing.assert_allclose(params["time_maa_v"], 1 - ddd, atol=1e-7)
  np.testing.assert_allclose(params["time_maa_r"], 1 - ddd**0.5, atol=1e-7)
  np.testing.assert_allclose(params["time_decay"], -6 + 5 * (n / (d - 1)) ** 0.7, atol=1e-6)
  np.testing.assert_allclose(params["time_faaaa"].reshape(-1), ((n + 1) % 3 - 1) * 0.1, atol=1e-7)
  assert np.max(np.abs(params["time_maa_w2"])) <= 0.01 and np.max(np.abs(params["time_maa_w1"])) <= 1e-4
  kernel = np.asarray(params["key"]["kernel"])
  np.testing.assert_allclose(kernel.T @ kernel, 0.01 * np.eye(d), atol=1e-6)  # orthogonal, gain 0.1
  assert params["time_maa_w1"].shape == (d, 5 * 32) and params["time_decay_w1"].shape == (d, 64)
  assert rwkv6.RWKV6Config.family == "linear-recurrent" and rwkv6.RWKV6Config.paper_name == "RWKV-6"


class TestContract(forms.RWKVContract):
  """The family's tests (tests/mixer_forms.py) with this file's comparison and reference."""

  name = "rwkv6"
  agree = staticmethod(_agree)
  reference = staticmethod(reference)
