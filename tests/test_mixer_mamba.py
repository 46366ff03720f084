"""Mamba mixer (attention_zoo/mixers/mamba.py): the whole block against a float64 numpy transcription of
``state-spaces/mamba`` (``Mamba.forward``'s reference path and ``selective_scan_ref``; Vim's "v2" block for
the bidirectional form), mode="chunk" against mode="recurrent" (outputs and gradients), padding at the
end and in the middle, causality, the initialisation and ``state_size``.
The conformance kit: tests/test_attention_registry.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo

from tests import mixer_forms as forms

D_MODEL = 16
pytestmark = pytest.mark.usefixtures("fast_compile")  # most XLA optimisations off (conftest: ~2x faster on CPU)


# ---- float64 numpy transcription of the original (PyTorch layout: channels before length) -------------

def conv1d_torch(x, weight, bias):
  """PyTorch ``nn.Conv1d(E, E, W, groups=E, padding=W-1)(x)[..., :L]``: x (B E L), weight (E 1 W)."""
  _, _, length = x.shape
  width = weight.shape[-1]
  padded = np.pad(x, ((0, 0), (0, 0), (width - 1, width - 1)))
  out = np.stack([np.einsum("bew,ew->be", padded[:, :, t:t + width], weight[:, 0]) for t in range(length)], -1)
  return out + bias[None, :, None]


def selective_scan_ref(u, delta, a, b, c, d, z, delta_bias):
  """``selective_scan_ref`` with delta_softplus=True, real A, variable B, C (B N L): u, delta, z (B E L)."""
  delta = forms.softplus(delta + delta_bias[:, None])
  state = np.zeros((u.shape[0], a.shape[0], a.shape[1]))
  delta_a = np.exp(np.einsum("bdl,dn->bdln", delta, a))
  delta_b_u = np.einsum("bdl,bnl,bdl->bdln", delta, b, u)
  ys = []
  for i in range(u.shape[2]):
    state = delta_a[:, :, i] * state + delta_b_u[:, :, i]
    ys.append(np.einsum("bdn,bn->bd", state, c[:, :, i]))
  y = np.stack(ys, axis=2)
  return (y + u * d[:, None]) * forms.silu(z)


def gated_branch(xz, p, suffix, d_state, dt_rank):
  """One direction of ``Mamba.forward`` without out_proj (Vim's ``mamba_inner_fn_no_out_proj``): (B E L)."""
  x, z = np.split(xz, 2, axis=1)
  weight = np.asarray(p[f"conv1d{suffix}_weight"]).T[:, None, :]          # ours [W, E] -> torch [E, 1, W]
  x = forms.silu(conv1d_torch(x, weight, np.asarray(p[f"conv1d{suffix}_bias"])))
  x_dbl = np.einsum("bel,ef->blf", x, np.asarray(p[f"x_proj{suffix}_kernel"]))
  dt, b, c = np.split(x_dbl, [dt_rank, dt_rank + d_state], axis=-1)
  dt = np.einsum("blr,re->bel", dt, np.asarray(p[f"dt_proj{suffix}_kernel"]))
  a = -np.exp(np.asarray(p[f"ssm_A{suffix}_log"]))
  return selective_scan_ref(x, dt, a, b.transpose(0, 2, 1), c.transpose(0, 2, 1), np.asarray(p[f"ssm_D{suffix}"]),
                            z, np.asarray(p[f"dt_proj{suffix}_bias"]))


def reference_block(p, x, bidirectional, d_state=16, dt_rank=1):
  """float64 Mamba block; bidirectional = Vim v2: out_proj(y_f + flip(y_b(flip(xz))))."""
  x = np.asarray(x)
  xz = np.einsum("bld,df->bfl", x, np.asarray(p["in_proj_kernel"]))     # (B 2E L)
  y = gated_branch(xz, p, "", d_state, dt_rank)
  if bidirectional:
    y = y + gated_branch(xz[:, :, ::-1], p, "_b", d_state, dt_rank)[:, :, ::-1]
  return np.einsum("bel,ed->bld", y, np.asarray(p["out_proj_kernel"]))


# ---- tests --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_block_matches_original_reference(x64, causal):
  """Whole block, float64, from the module's own parameters; chunk mode with 13 = 3·4 + 1 positions
  (causal) and one chunk over the whole length (bidirectional)."""
  x = forms.block_inputs(0, 2, 13)
  module = attention_zoo.create_mixer("mamba", causal=causal, chunk_size=4 if causal else 64)
  out, variables = forms.init_apply(module, x, jnp.ones((2, 13), bool))
  params = variables["params"]
  assert ("x_proj_b_kernel" in params) == (not causal)
  assert out.dtype == np.float64
  want = reference_block(params, x, bidirectional=not causal)
  np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("causal", [True, False])
def test_chunk_equals_recurrent(x64, causal):
  """Outputs and gradients (every parameter and the input) agree to 1e-9, with padding in the middle of
  row 1 and a length that is not a multiple of the chunk."""
  forms.block_chunk_equals_recurrent("mamba", causal, forms.block_agree, chunk_size=4)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_padding_end_and_middle_equals_removed(x64, mode):
  """Rows padded in the middle and at the end (row 0) and at the start, in the middle and at the end
  (row 1), the padded slots holding large non-zero values: the real outputs equal those of the row with
  the padding removed (both directions); padded outputs are zero. With ``bias=True``, so a padded slot
  that reached the convolution (in_proj's bias) would show."""
  module = attention_zoo.create_mixer("mamba", mode=mode, chunk_size=4, bias=True)  # in_proj's bias reaches u
  forms.block_padding_removed(module, lambda m, x, mask: m.init(jax.random.PRNGKey(0), x, mask), forms.block_same)


def test_causal_future_does_not_move_past(x64):
  forms.block_causal("mamba", "x_proj_b_kernel", chunk_size=4)


def test_state_size():
  config = attention_zoo.mixer_config("mamba")
  # E·(N + W − 1) with E = 2·64, N = 16, W = 4
  assert config.state_size(1000, 64) == 128 * (16 + 3) == 2432
  assert attention_zoo.mixer_config("mamba", d_state=8, d_conv=2, expand=3).state_size(7, 16) == 48 * 9
  assert config.state_size(10, 64) == config.state_size(10_000, 64)


def test_config_and_init():
  config = attention_zoo.mixer_config("mamba")
  assert (config.d_state, config.d_conv, config.expand, config.dt_rank, config.dt_min, config.dt_max,
          config.dt_init, config.dt_scale, config.dt_init_floor, config.conv_bias, config.bias) == (
              16, 4, 2, None, 1e-3, 1e-1, "random", 1.0, 1e-4, True, False)
  assert (config.causal, config.bidirectional, config.mode, config.chunk_size) == (False, True, "chunk", 64)
  assert config.family == "ssm" and config.paper_name == "Mamba"
  assert config.rank(16) == 1 and config.rank(17) == 2 and config.rank(512) == 32
  d_model = 64
  x = jnp.zeros((1, 3, d_model), jnp.float32)
  params = attention_zoo.create_mixer("mamba").lazy_init(jax.random.PRNGKey(1), x, jnp.ones((1, 3), bool))["params"]
  p = jax.tree_util.tree_map(np.asarray, params)
  e, n, r = 128, 16, 4
  for suffix in ("", "_b"):
    assert p[f"conv1d{suffix}_weight"].shape == (4, e) and np.abs(p[f"conv1d{suffix}_weight"]).max() <= 0.5
    assert p[f"conv1d{suffix}_bias"].shape == (e,) and np.abs(p[f"conv1d{suffix}_bias"]).max() <= 0.5
    assert p[f"x_proj{suffix}_kernel"].shape == (e, r + 2 * n) and f"x_proj{suffix}_bias" not in p
    assert np.abs(p[f"x_proj{suffix}_kernel"]).max() <= e ** -0.5
    kernel, bias = p[f"dt_proj{suffix}_kernel"], p[f"dt_proj{suffix}_bias"]
    assert kernel.shape == (r, e) and np.abs(kernel).max() <= r ** -0.5
    assert np.abs(kernel).max() > 0.8 * r ** -0.5                         # uniform over the whole range
    step = np.logaddexp(0.0, bias.astype(np.float64))                     # forms.softplus(bias) = the initial Δ
    assert np.all(step >= 1e-3 * (1 - 1e-5)) and np.all(step <= 1e-1 * (1 + 1e-5))
    log_step = np.log(step)                                               # log-uniform on [1e-3, 1e-1]
    assert abs(log_step.mean() - np.log(1e-2)) < 0.4 and log_step.std() > 0.9
  for name in ("ssm_A_log", "ssm_A_b_log"):
    np.testing.assert_allclose(p[name], np.broadcast_to(np.log(np.arange(1, n + 1)), (e, n)), rtol=1e-6)
  for name in ("ssm_D", "ssm_D_b"):
    np.testing.assert_array_equal(p[name], np.ones(e))
  assert p["in_proj_kernel"].shape == (d_model, 2 * e) and "in_proj_bias" not in p
  assert np.abs(p["in_proj_kernel"]).max() <= d_model ** -0.5
  assert p["out_proj_kernel"].shape == (e, d_model) and "out_proj_bias" not in p
  assert np.abs(p["out_proj_kernel"]).max() <= e ** -0.5
  assert {k for k in p if k.startswith("ssm_")} == {"ssm_A_log", "ssm_A_b_log", "ssm_D", "ssm_D_b"}
  with_bias = attention_zoo.create_mixer("mamba", bias=True, causal=True, dt_init="constant")
  p = with_bias.lazy_init(jax.random.PRNGKey(1), x, jnp.ones((1, 3), bool))["params"]
  assert p["in_proj_bias"].shape == (2 * e,) and p["out_proj_bias"].shape == (d_model,)
  np.testing.assert_allclose(np.asarray(p["dt_proj_kernel"]), r ** -0.5, rtol=1e-6)


def test_unknown_mode_is_an_error():
  x = jnp.zeros((1, 3, D_MODEL))
  with pytest.raises(ValueError, match="mode"):
    attention_zoo.create_mixer("mamba", mode="fast").lazy_init(jax.random.PRNGKey(0), x, jnp.ones((1, 3), bool))
