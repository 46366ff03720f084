"""The conformance kit of the sequence mixers (``attention_zoo.mixers``): what every mixer must do.

The attention kit (``lra_bench.testing``) probes a core through its effective matrix; a mixer has no
query, key or value, so its checks are on the layer's outputs. One code path checks every mixer: the
registry-wide tests (``tests/test_mixer_registry.py``), ``lra-bench check NAME`` and a plugin's own
pytest (``mixer_testing.assert_conformant("my_ssm")``). The checks (``CHECKS``):

- ``config``: the config is a frozen ``MixerConfig`` dataclass and ``causal`` defaults to False;
- ``float32`` / ``bfloat16``: output [B, L, D] in the input's dtype, finite (padded rows included);
- ``jit``: the output under ``jax.jit`` equals the op-by-op output, dropout on, same keys;
- ``gradients``: d(sum of real outputs)/d(x) is finite and non-zero, and every parameter gets a finite,
  non-zero gradient (a parameter that never moves is dead weight, or a bug);
- ``padding``: the outputs at the real positions of a row with a padded tail (zeroed, as the encoder
  passes it) equal the outputs of the same row cut to its real length, for both directions of a
  bidirectional mixer: neither what the padding held nor how long it is reaches a real position;
- ``causal``: with ``causal=True``, changing the second half of a sequence leaves the outputs of the
  first half alone (n.a. with the reason when the mixer declares ``no_causal_form``);
- ``determinism``: with dropout on, another ``dropout`` key gives another output, and with
  ``deterministic=True`` the key changes nothing.

Every check measures one number against a float32 tolerance; ``passed`` is None where the check does
not apply. The result type is the attention kit's ``Check``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

import attention_zoo
from lra_bench.testing import Check, _max_abs, failures, run_guarded

CHECKS = ("config", "float32", "bfloat16", "jit", "gradients", "padding", "causal", "determinism")

BATCH, LENGTH, PAD, DIM = 2, 37, 9, 16
CAUSAL_LENGTH = 96
SAME = 2e-5  # |delta| of outputs that must not change (atol and rtol), float32
DROPOUT = 0.3


def _create(name: str, **overrides):
  return attention_zoo.create_mixer(name, **overrides)


def _inputs(seed: int, length: int = LENGTH, dtype=np.float32):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(BATCH, length, DIM)).astype(dtype)


def _call(mixer, variables, x, mask, *, deterministic=True, rngs=None):
  import jax.numpy as jnp

  extra = {"residual": x} if type(mixer.config).gated_residual else {}
  return mixer.apply(variables, jnp.asarray(x), jnp.asarray(mask), deterministic=deterministic,
                     rngs=rngs or {}, **extra)


def _init(mixer, x, mask, seed: int = 0):
  import jax
  import jax.numpy as jnp

  extra = {"residual": jnp.asarray(x)} if type(mixer.config).gated_residual else {}
  return mixer.init({"params": jax.random.key(seed), "dropout": jax.random.key(seed + 1)}, jnp.asarray(x),
                    jnp.asarray(mask), deterministic=True, **extra)


def _setup(name: str, **overrides):
  """(mixer, x, mask, variables): the mixer with ``overrides`` on the padded batch of ``_padded``."""
  mixer = _create(name, **overrides)
  x, mask = _padded()
  return mixer, x, mask, _init(mixer, x, mask)


def _padded(length: int = LENGTH, pad: int = PAD):
  """x [B, L, D] with row 0 padded at its tail (zeroed, as the encoder passes it) and row 1 full."""
  x = _inputs(0, length)
  mask = np.ones((BATCH, length), bool)
  mask[0, length - pad:] = False
  x = x * mask[..., None]
  return x, mask


def _check_config(name: str):
  config = attention_zoo.mixer_config(name)
  problems = []
  if not isinstance(config, attention_zoo.MixerConfig) or not dataclasses.is_dataclass(config):
    problems.append(f"{type(config).__name__} is not a MixerConfig dataclass")
  elif not type(config).__dataclass_params__.frozen:  # type: ignore[attr-defined]
    problems.append("the config is not frozen")
  if getattr(config, "causal", None) is not False:
    problems.append(f"causal defaults to {getattr(config, 'causal', None)!r}, not False")
  return not problems, type(config).__name__, "; ".join(problems)


def _check_dtype(name: str, dtype_name: str):
  import jax.numpy as jnp

  dtype = jnp.dtype(dtype_name)
  mixer, x, mask, variables = _setup(name)
  out = _call(mixer, variables, jnp.asarray(x, dtype), mask)
  problems = []
  if tuple(out.shape) != x.shape:
    problems.append(f"shape {list(out.shape)}, expected {list(x.shape)}")
  if out.dtype != dtype:
    problems.append(f"dtype {out.dtype}, expected {dtype}")
  finite = bool(np.all(np.isfinite(np.asarray(out, np.float32))))
  if not finite:
    problems.append("non-finite outputs")
  return not problems, f"{out.dtype} {list(out.shape)}, finite={finite}", "; ".join(problems)


def _check_jit(name: str):
  import jax

  mixer, x, mask, variables = _setup(name, dropout_rate=DROPOUT)
  rngs = {"dropout": jax.random.key(5)}
  with jax.disable_jit():
    eager = np.asarray(_call(mixer, variables, x, mask, deterministic=False, rngs=rngs))
  jitted = np.asarray(jax.jit(lambda v, x, m: _call(mixer, v, x, m, deterministic=False, rngs=rngs))(
      variables, x, mask))
  err = _max_abs(eager - jitted)
  tol = SAME * (1 + _max_abs(eager))
  return err <= tol, f"max |jit - eager| {err:.2e}", "" if err <= tol else f"tolerance {tol:.1e}"


def _check_gradients(name: str):
  import jax
  import jax.numpy as jnp

  mixer, x, mask, variables = _setup(name)
  weights = jnp.asarray(mask[..., None], jnp.float32)

  def loss(params, x):
    out = _call(mixer, {**variables, "params": params}, x, mask)
    return jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights)  # sin: no cancellation of a plain sum

  g_params, g_x = jax.grad(loss, argnums=(0, 1))(variables["params"], jnp.asarray(x))
  problems = []
  if not np.all(np.isfinite(np.asarray(g_x))) or _max_abs(g_x) == 0:
    problems.append("d/dx is non-finite or zero")
  flat = jax.tree_util.tree_flatten_with_path(g_params)[0]
  dead = [jax.tree_util.keystr(path) for path, g in flat if _max_abs(g) == 0]
  bad = [jax.tree_util.keystr(path) for path, g in flat if not np.all(np.isfinite(np.asarray(g)))]
  if bad:
    problems.append(f"non-finite gradient of {', '.join(bad[:4])}")
  if dead:
    problems.append(f"zero gradient of {', '.join(dead[:4])}")
  return not problems, f"{len(flat)} parameters, |d/dx| max {_max_abs(g_x):.2e}", "; ".join(problems)


def _check_padding(name: str):
  mixer, x, mask, variables = _setup(name)
  padded = np.asarray(_call(mixer, variables, x, mask), np.float64)
  real = LENGTH - PAD
  cut = np.asarray(_call(mixer, variables, x[:1, :real], mask[:1, :real]), np.float64)
  err = _max_abs(padded[0, :real] - cut[0])
  tol = SAME * (1 + _max_abs(cut))
  return (err <= tol, f"max |padded - cut| {err:.2e} on {real} real positions",
          "" if err <= tol else f"the padded tail reaches real positions (tolerance {tol:.1e})")


def _check_causal(name: str):
  config = attention_zoo.mixer_config(name)
  if type(config).no_causal_form:
    return None, "no causal form", str(type(config).no_causal_form)
  mixer = _create(name, causal=True)
  x = _inputs(1, CAUSAL_LENGTH)
  mask = np.ones(x.shape[:2], bool)
  variables = _init(mixer, x, mask)
  half = CAUSAL_LENGTH // 2
  other = x.copy()
  other[:, half:] = _inputs(2, CAUSAL_LENGTH)[:, half:]
  a = np.asarray(_call(mixer, variables, x, mask), np.float64)
  b = np.asarray(_call(mixer, variables, other, mask), np.float64)
  err = _max_abs(a[:, :half] - b[:, :half])
  tol = SAME * (1 + _max_abs(a))
  moved = _max_abs(a[:, half:] - b[:, half:])
  problems = [] if err <= tol else [f"the future reaches the past (tolerance {tol:.1e})"]
  if moved <= tol:
    problems.append("changing the second half does not change its own outputs")
  return not problems, f"max |delta| on the first half {err:.2e}", "; ".join(problems)


def _check_determinism(name: str):
  import jax

  mixer, x, mask, variables = _setup(name, dropout_rate=DROPOUT)
  run = lambda key, det: np.asarray(_call(mixer, variables, x, mask, deterministic=det,
                                          rngs={"dropout": jax.random.key(key)}))
  moved = _max_abs(run(1, False) - run(2, False))
  still = _max_abs(run(1, True) - run(2, True))
  problems = []
  if moved == 0:
    problems.append(f"dropout_rate={DROPOUT}: another dropout key gives the same output")
  if still != 0:
    problems.append("deterministic=True still depends on the dropout key")
  return not problems, f"|delta| with dropout {moved:.2e}, deterministic {still:.1e}", "; ".join(problems)


_CHECK_FNS: dict[str, Callable[[str], tuple[bool | None, str, str]]] = {
    "config": _check_config,
    "float32": lambda name: _check_dtype(name, "float32"),
    "bfloat16": lambda name: _check_dtype(name, "bfloat16"),
    "jit": _check_jit,
    "gradients": _check_gradients,
    "padding": _check_padding,
    "causal": _check_causal,
    "determinism": _check_determinism,
}
assert tuple(_CHECK_FNS) == CHECKS


def check_one(name: str, check: str) -> Check:
  """Runs one check on mixer ``name``; a mixer that raises fails the check (the error is the detail)."""
  if check not in _CHECK_FNS:
    raise ValueError(f"unknown mixer check {check!r}; known checks: {', '.join(CHECKS)}")
  attention_zoo.mixer_config(name)  # unknown name -> ValueError listing the known ones
  return run_guarded(check, lambda: _CHECK_FNS[check](name))


def run_conformance(name: str, *, progress: Callable[[Check], None] | None = None, **_: Any) -> list[Check]:
  """Every check in ``CHECKS`` on mixer ``name``; ``progress(check)`` after each one."""
  results = []
  for check in CHECKS:
    results.append(check_one(name, check))
    if progress is not None:
      progress(results[-1])
  return results


def assert_conformant(name: str) -> None:
  """Raises AssertionError listing every failed check of mixer ``name``."""
  failed = failures(run_conformance(name))
  if failed:
    lines = [f"  {r.name}: {r.measured}" + (f" ({r.detail})" if r.detail else "") for r in failed]
    raise AssertionError(f"mixer {name!r} fails {len(failed)} conformance check(s):\n" + "\n".join(lines))
