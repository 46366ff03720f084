"""The conformance kit: what every sequence layer — attention core or sequence mixer — must do, as a library
a user's own pytest imports.

One code path checks every layer, dispatching once on its kind (:func:`kit`): the registry-wide tests
(``tests/test_attention_registry.py``) run these checks for each built-in layer, ``lra-bench check NAME``
prints them as a table, and a plugin's author runs them on theirs (a core below; a mixer the same way, with
``MIXER_CHECKS``, listed in the section "The sequence mixers' checks")::

    from lra_bench import testing

    def test_my_core_conforms():
      testing.assert_conformant("my_attention", quick=True)

    @pytest.mark.parametrize("check", testing.CHECKS)   # or one test per property
    def test_my_core(check):
      result = testing.check_one("my_attention", check)
      if result.passed is None:
        pytest.skip(result.detail)
      assert result.passed, f"{result.measured}; {result.detail}"

Every check measures one number and compares it with a tolerance, so a failure says by how much.
``passed`` is None where the property does not apply (no causal form; a property the config does not
declare).

The attention cores' checks (``CHECKS``):

- ``config``: the config is a frozen ``AttentionConfig`` dataclass, ``causal`` defaults to False and
  ``support(L)`` is None or bool [L, L];
- ``float32`` / ``bfloat16``: shape [B, L, H, V] (V != D), the input dtype, finite outputs (padded query
  rows included) and, for bf16 with large logits, finite bf16 gradients;
- ``jit``: the output under ``jax.jit`` equals the op-by-op (eager) output, dropout on, same RNG keys;
- ``gradients``: d(sum of real outputs)/d(q, k, v) is finite and non-zero for v;
- ``depends_on_qk``: redrawing the real queries (then the real keys), with the values and the mask
  fixed, moves the real outputs beyond round-off: the core attends by content. A core that ignores the
  query or the key by design declares it (``AttentionConfig.ignores``); the declaration is checked (the
  output must then not move), and a core that ignores both is reported as declared content-independent
  (n.a.), never as a pass. Uniform weights over the real keys, however well masked, fail here;
- ``padding_appended`` / ``padding_inserted``: whatever padded positions hold (a padded tail; a padded
  run inside the sequence), the outputs at real positions do not change;
- ``padding_zero_weight``: the effective matrix P (``value = eye(L)``) gives exactly zero weight to
  padded keys, for both padding layouts;
- ``nonnegative`` / ``rows_sum_to_one`` / ``support``: P on real rows against what the config class
  declares (``AttentionConfig.nonnegative``, ``rows_sum_to_one``, ``support(length)``);
- ``causal``: with ``causal=True`` no weight lies above the diagonal, the declared row properties
  hold, and changing the second half of a long sequence leaves the outputs of the first half alone;
- ``determinism``: another dropout key gives another output (the mask comes from the ``"dropout"``
  stream), and with ``deterministic=True`` the dropout key changes nothing beyond round-off (at most
  ``DETERMINISTIC_RTOL`` of the output's largest magnitude: on a GPU, scatter-adds with repeated indices
  use atomic additions whose order, and so whose float32 rounding, varies from run to run; a dropout
  key that leaks into deterministic outputs moves them at dropout's scale, about 1e-1);
- ``dropout_unbiased``: averaged over many dropout keys the output is the deterministic one (inverted
  dropout), and one sample is not (dropout does something).

The kit also owns the effective-matrix probe (docs/ARCHITECTURE.md, "The effective matrix"): every core is
linear in ``value``, so with one head and ``value = eye(L)`` its output *is* the matrix P [L, L] it
applies to the values (row i: the weights query i gives every key). ``effective_matrix`` (op by op, or
compiled), ``effective_attention`` (one core, random queries and keys: what the report's heatmaps draw)
and ``init_and_apply`` are the one probe: these checks, the report's heatmaps (``lra_bench.report.viz``)
and the per-core tests (``tests/attention_probe.py``) all feed cores through it. The kit imports no part
of ``lra_bench`` beside itself: whoever runs the probe where memory is scarce passes its own compiler
and memory check (``effective_attention(compiler=..., before_run=...)``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

import attention_zoo

CHECKS = ("config", "float32", "bfloat16", "jit", "gradients", "depends_on_qk", "padding_appended",
          "padding_inserted", "padding_zero_weight", "nonnegative", "rows_sum_to_one", "support", "causal",
          "determinism", "dropout_unbiased")


@dataclasses.dataclass(frozen=True)
class Check:
  """The outcome of one check: ``passed`` is None when the property does not apply to this core."""

  name: str
  passed: bool | None
  measured: str
  detail: str = ""

  @property
  def status(self) -> str:
    return {True: "pass", False: "FAIL", None: "n.a."}[self.passed]


@dataclasses.dataclass(frozen=True)
class Options:
  """Shapes and sample sizes of the checks (``check_one(..., **opts)`` overrides any field).

  ``length`` is deliberately not a multiple of any block size or a square; ``causal_length`` spans
  several blocks / chunks / windows of most cores' defaults, where a data-dependent grouping could
  carry the future into the past.
  """

  length: int = 37
  pad: int = 9
  causal_length: int = 203
  dropout_samples: int = 1024


QUICK = Options(causal_length=96, dropout_samples=256)

# Tolerances (float32). P's zeros are exact in every built-in core (masked, then multiplied by 0).
ZERO_WEIGHT = 1e-6      # |P| on padded keys of real queries
SUPPORT = 1e-7          # |P| outside the declared support / above the diagonal under causal
NONNEGATIVE = -1e-6     # min P on real rows
ROW_SUM = 1e-4          # |row sum - 1|
SAME = 2e-5             # |delta| of outputs that must not change (atol; rtol the same)
# Redrawing the queries (or keys) of a core that attends moves its real outputs by O(0.1..1) (relative
# L2; vanilla: ~0.5); float32 round-off is ~1e-7. A core below this ignores that input.
DEPENDS = 1e-3
INPUTS = ("query", "key")  # what AttentionConfig.ignores may name
# Dropout: one sample is ~0.65 away (relative L2) from the deterministic output, the mean of n samples
# ~0.65 / sqrt(n) (0.02 at 1024); a missing 1/(1 - p) gives 0.3. The tolerance scales with 1/sqrt(n).
DROPOUT_MEAN = 0.06     # at 1024 samples

STREAMS = ("params", "dropout", "attention")  # the flax RNG streams a core may use


def probe_rngs(seed: int = 0, streams: tuple[str, ...] = STREAMS) -> dict[str, Any]:
  """The RNG keys of the probe and of every check: ``params`` key(seed), ``dropout`` key(seed + 1),
  ``attention`` key(seed + 2) (random features, hashing, ...); only those of ``streams``."""
  import jax

  return {s: jax.random.key(seed + STREAMS.index(s)) for s in streams}


def _rngs(*streams: str) -> dict[str, Any]:
  return probe_rngs(0, streams)


def random_qkv(seed: int, batch: int, length: int, heads: int, head_dim: int, value_dim: int,
               dtype=None, scale: float = 1.0):
  """N(0, scale^2) queries and keys [B, L, H, D] and N(0, 1) values [B, L, H, V], seeded."""
  import jax
  import jax.numpy as jnp

  dtype = dtype or jnp.float32
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  q = scale * jax.random.normal(kq, (batch, length, heads, head_dim), dtype)
  k = scale * jax.random.normal(kk, (batch, length, heads, head_dim), dtype)
  v = jax.random.normal(kv, (batch, length, heads, value_dim), dtype)
  return q, k, v


def padding_masks(length: int, pad: int) -> np.ndarray:
  """bool [3, L]: example 0 padded at the end, example 1 padded inside (a run of ``pad`` positions in
  the middle), example 2 unpadded."""
  mask = np.ones((3, length), bool)
  mask[0, length - pad:] = False
  start = (length - pad) // 2
  mask[1, start:start + pad] = False
  return mask


def _create(name: str, **overrides):
  return attention_zoo.create_layer(name, **overrides)


# ----------------------------------------------------------------------------------------------------
# The effective-matrix probe (the module docstring; docs/ARCHITECTURE.md, "The effective matrix").


def init_variables(core, q, k, v, mask=None, *, seed=0):
  """``core``'s variables for these inputs: ``core.init`` with ``probe_rngs(seed)``, deterministic."""
  return core.init(probe_rngs(seed), q, k, v, mask=mask, deterministic=True)


def init_and_apply(core, q, k, v, mask=None, *, deterministic=True, seed=0, variables=None):
  """Initializes ``core`` on these inputs (unless ``variables`` is given) and applies it; (out, variables).

  Streams: ``probe_rngs(seed)`` (``params`` key(seed), ``dropout`` key(seed + 1), ``attention``
  key(seed + 2)).
  """
  if variables is None:
    rngs = probe_rngs(seed)
    variables = core.init(rngs, q, k, v, mask=mask, deterministic=True)  # init_variables, same keys
  else:
    rngs = probe_rngs(seed, ("dropout", "attention"))
  out = core.apply(variables, q, k, v, mask=mask, deterministic=deterministic,
                   rngs={"dropout": rngs["dropout"], "attention": rngs["attention"]}, mutable=False)
  return out, variables


def _compiled(core, q, k, v, mask=None, deterministic=True, seed=0, variables=None):
  """(variables, apply): ``core`` initialised on these inputs (under ``jax.jit``, unless ``variables``
  is given) and ``apply(q, k, v, mask)`` = ``init_and_apply``'s output under ``jax.jit`` (one compile
  per input shape instead of op-by-op dispatch)."""
  import jax

  if variables is None:
    variables = jax.jit(lambda q, k, v, m: init_variables(core, q, k, v, m, seed=seed))(q, k, v, mask)
  return variables, jax.jit(lambda q, k, v, m=None: init_and_apply(
      core, q, k, v, m, deterministic=deterministic, seed=seed, variables=variables)[0])


def identity_values(q):
  """``value = eye(L)`` for one head: [B, L, 1, L] in the queries' dtype."""
  import jax.numpy as jnp

  batch, length = q.shape[:2]
  return jnp.broadcast_to(jnp.eye(length, dtype=q.dtype)[None, :, None, :], (batch, length, 1, length))


def effective(core, q, k, mask=None, variables=None, seed=0):
  """``effective_matrix`` as a traceable function (a jax array [B, L, L]): what a caller compiles."""
  out, _ = init_and_apply(core, q, k, identity_values(q), mask, variables=variables, seed=seed)
  return out[:, :, 0, :]


def effective_matrix(core, q, k, mask=None, variables=None, seed=0, *, jit: bool = False) -> np.ndarray:
  """P [B, L, L] of ``core`` for one-head ``q, k`` [B, L, 1, D]: its output for ``value = eye(L)``.

  Op by op, or with ``jit`` compiled as the checks run it (initialisation and application under
  ``jax.jit`` each, the identity passed as the values: one compile per input shape).
  """
  if not jit:
    return np.asarray(effective(core, q, k, mask, variables, seed))
  eye = identity_values(q)
  _, apply = _compiled(core, q, k, eye, mask, seed=seed, variables=variables)
  return np.asarray(apply(q, k, eye, mask)[:, :, 0, :])


def _jit_compiled(fn, *args):
  """``jax.jit(fn)`` compiled for ``args`` (the probe's default compiler)."""
  import jax

  return jax.jit(fn).lower(*args).compile()


def effective_attention(name: str, length: int = 64, *, head_dim: int = 16, seed: int = 0, scale: float = 0.5,
                        compiler: Callable | None = None, before_run: Callable[[Any], None] | None = None,
                        **overrides) -> np.ndarray:
  """P [L, L] of core ``name`` (default config + ``overrides``) for one random head: one compiled program.

  ``scale`` multiplies the N(0, 1) queries and keys: below 1 the softmax is soft enough that every
  pair a core lets interact gets visible weight, so the picture shows the core's support.
  ``compiler(fn, q, k)`` returns the compiled probe (default: ``jax.jit``; the command line passes
  ``training.steps.compile_run_once``, which compiles a program run once faster on CPU), and
  ``before_run(compiled)`` may refuse it before it runs (the command line's memory check).
  """
  import jax

  kq, kk, _ = jax.random.split(jax.random.key(seed), 3)  # the queries and keys of earlier reports
  q = scale * jax.random.normal(kq, (1, length, 1, head_dim))
  k = scale * jax.random.normal(kk, (1, length, 1, head_dim))
  core = attention_zoo.create_attention(name, **overrides)
  # One compiled program per core: op by op, the report's grid of 46 cores took 51 s; compiled, 10 s.
  probe = (compiler or _jit_compiled)(lambda q, k: effective(core, q, k, seed=seed), q, k)
  if before_run is not None:
    before_run(probe)
  return np.asarray(probe(q, k))[0]


# Several checks read the same probe; it is computed once per (core class, config, shapes).
_MEMO: dict[tuple, Any] = {}


def _memo(key: tuple, compute: Callable[[], Any]) -> Any:
  if key not in _MEMO:
    if len(_MEMO) > 16:
      _MEMO.clear()
    _MEMO[key] = compute()
  return _MEMO[key]


def _core_key(name: str) -> tuple:
  """What identifies a core for the memo: its class and its config's value (repr: a config field
  need not be hashable)."""
  return (type(_create(name)), repr(attention_zoo.attention_config(name)))


def _padded_probe(name: str, o: Options) -> tuple[np.ndarray, np.ndarray]:
  """(P [3, L, L], mask [3, L]) for the three padding layouts of ``padding_masks``."""
  def compute():
    q, k, _ = random_qkv(5, 3, o.length, 1, 8, 1)
    mask = padding_masks(o.length, o.pad)
    return effective_matrix(_create(name), q, k, mask, jit=True), mask
  return _memo(("padded_probe", *_core_key(name), o.length, o.pad), compute)


def _fmt(x: float) -> str:
  return f"{x:.2g}" if x != 0 else "0"


def _max_abs(x) -> float:
  x = np.asarray(x, np.float64)
  return float(np.max(np.abs(x))) if x.size else 0.0


def _close(a, b, tol: float = SAME) -> tuple[bool, float]:
  """(|a - b| <= tol + tol |b| everywhere, max |a - b|)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return bool(np.all(np.abs(a - b) <= tol + tol * np.abs(b))), _max_abs(a - b)


# ----------------------------------------------------------------------------------------------------
# The checks: each returns (passed, measured, detail).


def _check_config(name: str, o: Options):
  config = attention_zoo.layer_config(name)
  problems = []
  if not (dataclasses.is_dataclass(config) and isinstance(config, attention_zoo.AttentionConfig)):
    problems.append("config is not an AttentionConfig dataclass")
  if getattr(config, "causal", None) is not False:
    problems.append(f"causal defaults to {getattr(config, 'causal', None)!r}, not False")
  try:
    config.causal = True  # a fresh instance: harmless if it is (wrongly) mutable
    problems.append("config is not frozen")
  except dataclasses.FrozenInstanceError:
    pass
  ignores = getattr(config, "ignores", ())
  if not (isinstance(ignores, tuple) and set(ignores) <= set(INPUTS)):
    problems.append(f"ignores is {ignores!r}, not a tuple of {INPUTS}")
  support = config.support(o.length)
  if support is not None and (np.shape(support) != (o.length, o.length) or np.asarray(support).dtype != bool):
    problems.append(f"support({o.length}) is {np.asarray(support).dtype} {np.shape(support)}, "
                    f"not bool ({o.length}, {o.length})")
  if problems:
    return False, f"{type(config).__name__}: {len(problems)} problem(s)", "; ".join(problems)
  return True, "frozen, causal=False", type(config).__name__


def _check_dtype(name: str, o: Options, dtype_name: str):
  import jax
  import jax.numpy as jnp

  dtype = jnp.dtype(dtype_name)
  if dtype == jnp.float32:  # the padded inputs (value_dim 5 != head_dim 8), one program with ``gradients``
    (q, k, v), out, grads = _padded_gradients(name, o)
  else:  # large logits too: mixed precision must not overflow
    core = _create(name)
    mask = jnp.asarray(padding_masks(o.length, o.pad))
    q, k, v = random_qkv(8, 3, o.length, 2, 8, 5, dtype=dtype, scale=3.0)
    variables = jax.jit(lambda q, k, v, m: core.init(_rngs("params", "attention"), q, k, v, mask=m))(q, k, v, mask)

    def loss(q, k, v):
      out = core.apply(variables, q, k, v, mask=mask, rngs=_rngs("attention"))
      return jnp.sum(out.astype(jnp.float32) * mask[:, :, None, None]), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  want = (q.shape[0], o.length, q.shape[2], v.shape[3])
  bad_out = int(np.sum(~np.isfinite(np.asarray(out, np.float32))))
  bad_grad = sum(int(np.sum(~np.isfinite(np.asarray(g, np.float32)))) for g in grads)
  grad_dtypes = {str(g.dtype) for g in grads}
  problems = []
  if out.shape != want:
    problems.append(f"shape {tuple(out.shape)}, expected {want}")
  if out.dtype != dtype:
    problems.append(f"output dtype {out.dtype}, expected {dtype}")
  if grad_dtypes != {str(dtype)}:
    problems.append(f"gradient dtypes {sorted(grad_dtypes)}, expected {dtype}")
  if bad_out:
    problems.append(f"{bad_out} non-finite outputs (padded query rows included)")
  if bad_grad:
    problems.append(f"{bad_grad} non-finite gradients")
  measured = f"{tuple(out.shape)} {out.dtype}, {bad_out + bad_grad} non-finite"
  return not problems, measured, "; ".join(problems)


# The padded inputs of most checks: 3 heads, head_dim 8, value_dim 5 (!= head_dim: a core that mixes up the two
# fails), on the three padding layouts of ``padding_masks``.
PADDED_HEADS, PADDED_HEAD_DIM, PADDED_VALUE_DIM = 3, 8, 5


def _padded_qkv(seed: int, o: Options):
  return random_qkv(seed, 3, o.length, PADDED_HEADS, PADDED_HEAD_DIM, PADDED_VALUE_DIM)


def _padded_setup(name: str, o: Options):
  """(core, variables, jitted apply, (q, k, v), mask [3, L]) on the three padding layouts: shared by
  the float32, jit, gradients, padding and determinism checks (one init and one compile of the forward for
  all of them)."""
  def compute():
    import jax.numpy as jnp

    core = _create(name)
    qkv = _padded_qkv(1, o)
    mask = padding_masks(o.length, o.pad)
    variables, apply = _compiled(core, *qkv, jnp.asarray(mask))
    return core, variables, apply, qkv, mask
  return _memo(("padded_setup", *_core_key(name), o.length, o.pad), compute)


def _dropout_runs(name: str, o: Options) -> dict[str, np.ndarray]:
  """Outputs of the core with ``dropout_rate=0.5`` on the padded inputs, shared by the jit and
  determinism checks: eager and jit with dropout keys A, jit with key B, and deterministic (jit) with
  keys A and B."""
  def compute():
    import jax

    core = _create(name, dropout_rate=0.5)
    _, variables, _, (q, k, v), mask = _padded_setup(name, o)  # the variables do not depend on the rate
    mask = jax.numpy.asarray(mask)
    keys = {"A": {"dropout": jax.random.key(11), "attention": jax.random.key(12)}}
    keys["B"] = dict(keys["A"], dropout=jax.random.key(13))
    run = lambda deterministic: jax.jit(lambda rngs: core.apply(variables, q, k, v, mask=mask, rngs=rngs,
                                                                deterministic=deterministic))
    sample, fixed = run(False), run(True)
    eager = core.apply(variables, q, k, v, mask=mask, deterministic=False, rngs=keys["A"])  # another trace
    outs = {"eager_A": eager, "jit_A": sample(keys["A"]), "jit_B": sample(keys["B"]),
            "det_A": fixed(keys["A"]), "det_B": fixed(keys["B"])}
    return {key: np.asarray(value) for key, value in outs.items()}
  return _memo(("dropout_runs", *_core_key(name), o.length, o.pad), compute)


def _check_jit(name: str, o: Options):
  runs = _dropout_runs(name, o)
  ok, delta = _close(runs["jit_A"], runs["eager_A"])
  return ok, f"max |jit - eager| {_fmt(delta)} (dropout on, same keys)", \
      "" if ok else f"jit and op-by-op outputs differ (tolerance {SAME:g})"


def _padded_gradients(name: str, o: Options):
  """((q, k, v), outputs, d/d(q, k, v) of the sum of the real outputs) on the padded inputs: one compiled
  program for the float32 and gradients checks."""
  def compute():
    import jax
    import jax.numpy as jnp

    core, variables, _, (q, k, v), mask = _padded_setup(name, o)
    mask = jnp.asarray(mask)
    weights = mask[:, :, None, None]

    def loss(q, k, v):
      out = core.apply(variables, q, k, v, mask=mask, rngs=_rngs("attention"))
      return jnp.sum(out.astype(jnp.float32) * weights), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return (q, k, v), out, grads
  return _memo(("padded_gradients", *_core_key(name), o.length, o.pad), compute)


def _check_gradients(name: str, o: Options):
  _, _, grads = _padded_gradients(name, o)
  grads = [np.asarray(g) for g in grads]
  bad = sum(int(np.sum(~np.isfinite(g))) for g in grads)
  dv = _max_abs(grads[2])
  problems = ([f"{bad} non-finite"] if bad else []) + (["d/dvalue is zero"] if dv == 0 else [])
  return not problems, f"{bad} non-finite, max |d/dv| {_fmt(dv)}", "; ".join(problems)


def _redrawn_outputs(name: str, o: Options) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
  """(outputs, {"query" | "key": outputs with that input redrawn at the real positions}, mask [3, L])
  on the three padding layouts; the values, the mask and the other input stay as they were."""
  def compute():
    import jax.numpy as jnp

    _, _, apply, (q, k, v), mask = _padded_setup(name, o)
    real = mask[:, :, None, None]
    q2, k2, _ = _padded_qkv(6, o)
    moved = {"query": apply(jnp.where(real, q2, q), k, v, mask),
             "key": apply(q, jnp.where(real, k2, k), v, mask)}
    return np.asarray(apply(q, k, v, mask)), {x: np.asarray(out) for x, out in moved.items()}, mask
  return _memo(("redrawn_outputs", *_core_key(name), o.length, o.pad), compute)


def _relative_change(a: np.ndarray, b: np.ndarray) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(b - a)) / (float(np.linalg.norm(a)) or 1.0)


def _check_depends_on_qk(name: str, o: Options):
  out, redrawn, mask = _redrawn_outputs(name, o)
  ignores = tuple(getattr(attention_zoo.attention_config(name), "ignores", ()))
  change = {x: _relative_change(out[mask], redrawn[x][mask]) for x in INPUTS}
  measured = ", ".join(f"{x} redrawn: rel. Δ {_fmt(change[x])}" for x in INPUTS)
  problems = []
  for x in INPUTS:
    if x in ignores:
      if not _close(out[mask], redrawn[x][mask])[0]:
        problems.append(f"declares ignores {x!r}, yet the output moves when the {x} changes")
    elif not change[x] >= DEPENDS:
      problems.append(f"the output does not depend on the {x} (rel. Δ below {DEPENDS:g}): the weights "
                      f"ignore the content; a core that does so by design declares ignores = {INPUTS}")
  if problems:
    return False, measured, "; ".join(problems)
  if set(ignores) >= set(INPUTS):
    return None, measured, "declared content-independent (ignores query and key)"
  return True, measured, f"declared to ignore the {ignores[0]}" if ignores else ""


def _padding_outputs(name: str, o: Options):
  """(outputs, outputs with other padded contents, mask [3, L]) for the three padding layouts."""
  def compute():
    import jax.numpy as jnp

    _, _, apply, (q, k, v), mask = _padded_setup(name, o)
    pad = ~mask[:, :, None, None]
    other = _padded_qkv(4, o)
    q2, k2, v2 = (jnp.where(pad, 7.0 * x2 + 3.0, x) for x, x2 in zip((q, k, v), other))
    return np.asarray(apply(q, k, v, mask)), np.asarray(apply(q2, k2, v2, mask)), mask
  return _memo(("padding_outputs", *_core_key(name), o.length, o.pad), compute)


def _check_padding(name: str, o: Options, example: int, where: str):
  out, out2, mask = _padding_outputs(name, o)
  real = mask[example]
  ok, delta = _close(out[example][real], out2[example][real])
  finite = bool(np.all(np.isfinite(out2[example])))
  detail = "" if ok else f"real outputs move when the {where} padded positions change (tolerance {SAME:g})"
  if not finite:
    detail = (detail + "; " if detail else "") + "non-finite outputs"
  return ok and finite, f"max |Δ| real outputs {_fmt(delta)}", detail


def _check_zero_weight(name: str, o: Options):
  p, mask = _padded_probe(name, o)
  worst = 0.0
  for b in range(mask.shape[0]):
    worst = max(worst, _max_abs(p[b][mask[b]][:, ~mask[b]]))
  ok = worst <= ZERO_WEIGHT
  return ok, f"max |P| on padded keys {_fmt(worst)}", "" if ok else \
      f"real queries put weight on padded keys (tolerance {ZERO_WEIGHT:g})"


def _declared(name: str, prop: str) -> bool:
  return bool(getattr(attention_zoo.attention_config(name), prop))


def _min_weight(p: np.ndarray, rows: np.ndarray) -> float:
  return float(np.min(p[rows]))


def _row_error(p: np.ndarray, rows: np.ndarray) -> float:
  return _max_abs(p.sum(-1)[rows] - 1.0)


def _check_nonnegative(name: str, o: Options):
  p, mask = _padded_probe(name, o)
  low = _min_weight(p, mask)
  measured = f"min P {_fmt(low)}"
  if not _declared(name, "nonnegative"):
    return None, measured, "not declared (nonnegative = False)"
  ok = low >= NONNEGATIVE
  return ok, measured, "" if ok else f"declares nonnegative weights (tolerance {NONNEGATIVE:g})"


def _check_rows(name: str, o: Options):
  p, mask = _padded_probe(name, o)
  err = _row_error(p, mask)
  measured = f"max |row sum - 1| {_fmt(err)}"
  if not _declared(name, "rows_sum_to_one"):
    return None, measured, "not declared (rows_sum_to_one = False)"
  ok = err <= ROW_SUM
  return ok, measured, "" if ok else f"declares rows that sum to 1 (tolerance {ROW_SUM:g})"


def _check_support(name: str, o: Options):
  support = attention_zoo.attention_config(name).support(o.length)
  if support is None:
    return None, "-", "declares no fixed support"
  q, k, _ = random_qkv(5, 1, o.length, 1, 8, 1)
  p = effective_matrix(_create(name), q, k, jit=True)[0]
  outside = _max_abs(p[~np.asarray(support, bool)])
  ok = outside <= SUPPORT
  return ok, f"max |P| outside support {_fmt(outside)}", "" if ok else \
      f"weight outside the declared support (tolerance {SUPPORT:g})"


def _check_causal(name: str, o: Options):
  import jax

  core = _create(name, causal=True)
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  try:  # traced, not compiled: a core without a causal form says so at trace time
    jax.eval_shape(lambda q, k, v: core.init(_rngs("params", "dropout", "attention"), q, k, v), q, k, v)
  except NotImplementedError as err:
    return None, "-", f"no causal form: {err}"
  q, k, v = random_qkv(7, 1, o.length, 1, 8, 8)
  p = effective_matrix(core, q, k, jit=True)[0]
  ahead = _max_abs(np.triu(p, 1))
  rows = np.ones(o.length, bool)
  problems = []
  if ahead > SUPPORT:
    problems.append(f"weight above the diagonal (tolerance {SUPPORT:g})")
  if _declared(name, "nonnegative") and _min_weight(p, rows) < NONNEGATIVE:
    problems.append(f"negative weight {_fmt(_min_weight(p, rows))} though declared nonnegative")
  if _declared(name, "rows_sum_to_one") and _row_error(p, rows) > ROW_SUM:
    problems.append(f"|row sum - 1| {_fmt(_row_error(p, rows))} though declared to sum to 1")
  q, k, v = random_qkv(9, 1, o.causal_length, 1, 8, 8)
  cut = o.causal_length // 2
  _, apply = _compiled(core, q, k, v)
  q2, k2, v2 = (x.at[:, cut:].add(5.0) for x in (q, k, v))
  ok, delta = _close(np.asarray(apply(q, k, v))[:, :cut], np.asarray(apply(q2, k2, v2))[:, :cut], tol=1e-5)
  if not ok:
    problems.append(f"the first {cut} outputs move when positions {cut}.. change (L={o.causal_length})")
  return not problems, f"max P above diagonal {_fmt(ahead)}, max |Δ past| {_fmt(delta)}", "; ".join(problems)


# Round-off allowed between two deterministic runs that differ only in the dropout key, relative to the
# output's largest magnitude: float32 sums reordered by a GPU's atomic scatter-adds differ by ~1e-7
# (routing's scatter-mean of overlapping windows on an H200: 6e-8 on outputs up to 3.3).
DETERMINISTIC_RTOL = 1e-5


def _check_determinism(name: str, o: Options):
  """Dropout masks come from the "dropout" stream: another key gives another output, while
  ``deterministic=True`` ignores the key. (Same keys, two traces: the ``jit`` check.)"""
  runs = _dropout_runs(name, o)
  a, b = runs["jit_A"], runs["jit_B"]
  other = float(np.linalg.norm(b - a)) / (float(np.linalg.norm(a)) or 1.0)
  same_det = _max_abs(runs["det_A"] - runs["det_B"])
  problems = []
  if not np.all(np.isfinite(a)):
    problems.append("non-finite outputs under dropout")
  if other < 1e-3:
    problems.append("another dropout key gives the same output (a fixed key instead of the 'dropout' stream?)")
  allowed = DETERMINISTIC_RTOL * _max_abs(runs["det_A"])
  if not same_det <= allowed:
    problems.append(f"deterministic=True output depends on the dropout key (max |Δ| {_fmt(same_det)}, "
                    f"round-off allowed {_fmt(allowed)})")
  measured = f"other dropout key rel. Δ {other:.2f}; deterministic max |Δ| {_fmt(same_det)}"
  return not problems, measured, "; ".join(problems)


def _check_dropout_unbiased(name: str, o: Options):
  import jax
  import jax.numpy as jnp

  core = _create(name, dropout_rate=0.3)
  q, k, v = random_qkv(7, 1, o.length, 2, 8, 8)
  variables, deterministic = _compiled(core, q, k, v)
  det = deterministic(q, k, v)
  sample = lambda key: core.apply(variables, q, k, v, deterministic=False,
                                  rngs={"dropout": key, "attention": jax.random.key(2)})
  n = o.dropout_samples
  samples = jax.jit(jax.vmap(sample))(jax.random.split(jax.random.key(3), n))
  scale = float(jnp.linalg.norm(det)) or 1.0
  bias = float(jnp.linalg.norm(samples.mean(0) - det)) / scale
  one = float(jnp.linalg.norm(samples[0] - det)) / scale
  tol = DROPOUT_MEAN * math.sqrt(1024 / n)
  problems = []
  if not bias <= tol:
    problems.append(f"the mean over {n} dropout keys is {bias:.3f} away from the deterministic output "
                    f"(tolerance {tol:.3f}; a missing 1/(1-p) gives ~0.3)")
  if one < 1e-3:
    problems.append("dropout_rate=0.3 does not change the output")
  return not problems, f"rel. L2 |mean - det| {bias:.3f} over {n} keys (one sample {one:.2f})", "; ".join(problems)


_CHECK_FNS: dict[str, Callable[[str, Options], tuple[bool | None, str, str]]] = {
    "config": _check_config,
    "float32": lambda name, o: _check_dtype(name, o, "float32"),
    "bfloat16": lambda name, o: _check_dtype(name, o, "bfloat16"),
    "jit": _check_jit,
    "gradients": _check_gradients,
    "depends_on_qk": _check_depends_on_qk,
    "padding_appended": lambda name, o: _check_padding(name, o, 0, "trailing"),
    "padding_inserted": lambda name, o: _check_padding(name, o, 1, "inserted"),
    "padding_zero_weight": _check_zero_weight,
    "nonnegative": _check_nonnegative,
    "rows_sum_to_one": _check_rows,
    "support": _check_support,
    "causal": _check_causal,
    "determinism": _check_determinism,
    "dropout_unbiased": _check_dropout_unbiased,
}
assert tuple(_CHECK_FNS) == CHECKS


# ----------------------------------------------------------------------------------------------------
# The sequence mixers' checks. A mixer has no query, key or value, so its checks are on the layer's outputs
# (``MIXER_CHECKS``): ``config`` (a frozen ``MixerConfig``, causal False); ``float32`` / ``bfloat16`` (output
# [B, L, D] in the input's dtype, finite, padded rows included); ``jit`` (jit == op by op, dropout on);
# ``gradients`` (d/dx and every parameter's gradient finite and non-zero); ``padding`` (a zeroed padded tail
# moves no real output: the row cut to its real length gives the same); ``causal`` (with ``causal=True`` the
# second half does not reach the first); ``determinism`` (another dropout key moves the output, not under
# ``deterministic=True``); ``modes`` (``mode="chunk"`` equals ``mode="recurrent"`` for a mixer that has both).
# Initialisation, outputs and gradients are compiled (``jax.jit``, as training runs them and as the cores' checks
# do: op by op they cost a scanning mixer several times more), one program per mixer config and input shape, the
# variables shared by the checks of a process; ``jit`` compares the compiled output with the op-by-op one
# (``apply`` outside ``jax.jit``: each operation dispatched alone, a ``lax.scan`` as one).

MIXER_CHECKS = ("config", "float32", "bfloat16", "jit", "gradients", "padding", "causal", "determinism",
                "modes")

MIXER_BATCH, MIXER_LENGTH, MIXER_PAD, MIXER_DIM = 2, 37, 9, 16
MIXER_CAUSAL_LENGTH = 96
MIXER_DROPOUT = 0.3


def _mixer_create(name: str, **overrides):
  return attention_zoo.create_layer(name, **overrides)


def _mixer_inputs(seed: int, length: int = MIXER_LENGTH, dtype=np.float32):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(MIXER_BATCH, length, MIXER_DIM)).astype(dtype)


def _mixer_call(mixer, variables, x, mask, *, deterministic=True, rngs=None, jit=True):
  """The mixer's output, compiled (``jit``: one ``jax.jit`` program per mixer config and input shape, as training
  runs it) or op by op (the ``jit`` check's other side)."""
  import jax
  import jax.numpy as jnp

  x, mask = jnp.asarray(x), jnp.asarray(mask)
  if not jit:
    return _mixer_apply(mixer, variables, x, mask, rngs or {}, deterministic)
  key = ("mixer_apply", type(mixer), repr(mixer.config), deterministic)
  run = _memo(key, lambda: jax.jit(lambda v, x, m, r: _mixer_apply(mixer, v, x, m, r, deterministic)))
  return run(variables, x, mask, rngs or {})


def _mixer_apply(mixer, variables, x, mask, rngs, deterministic):
  extra = {"residual": x} if type(mixer.config).gated_residual else {}
  return mixer.apply(variables, x, mask, deterministic=deterministic, rngs=rngs, **extra)


def _mixer_init(mixer, x, mask, seed: int = 0):
  """The mixer's variables on these inputs (compiled: op by op, a scanning mixer's init costs seconds)."""
  import jax
  import jax.numpy as jnp

  def init(x, mask):
    extra = {"residual": x} if type(mixer.config).gated_residual else {}
    return mixer.init({"params": jax.random.key(seed), "dropout": jax.random.key(seed + 1)}, x, mask,
                      deterministic=True, **extra)

  return jax.jit(init)(jnp.asarray(x), jnp.asarray(mask))


def _mixer_setup(name: str, **overrides):
  """(mixer, x, mask, variables): the mixer with ``overrides`` on the padded batch of ``_mixer_padded``."""
  mixer = _mixer_create(name, **overrides)
  x, mask = _mixer_padded()
  variables = _memo(("mixer_init", type(mixer), repr(mixer.config)), lambda: _mixer_init(mixer, x, mask))
  return mixer, x, mask, variables


def _mixer_padded(length: int = MIXER_LENGTH, pad: int = MIXER_PAD):
  """x [B, L, D] with row 0 padded at its tail (zeroed, as the encoder passes it) and row 1 full."""
  x = _mixer_inputs(0, length)
  mask = np.ones((MIXER_BATCH, length), bool)
  mask[0, length - pad:] = False
  x = x * mask[..., None]
  return x, mask


def _mixer_check_config(name: str):
  config = attention_zoo.layer_config(name)
  problems = []
  if not isinstance(config, attention_zoo.MixerConfig) or not dataclasses.is_dataclass(config):
    problems.append(f"{type(config).__name__} is not a MixerConfig dataclass")
  elif not type(config).__dataclass_params__.frozen:  # type: ignore[attr-defined]
    problems.append("the config is not frozen")
  if getattr(config, "causal", None) is not False:
    problems.append(f"causal defaults to {getattr(config, 'causal', None)!r}, not False")
  return not problems, type(config).__name__, "; ".join(problems)


def _mixer_check_dtype(name: str, dtype_name: str):
  import jax.numpy as jnp

  dtype = jnp.dtype(dtype_name)
  mixer, x, mask, variables = _mixer_setup(name)
  out = _mixer_call(mixer, variables, jnp.asarray(x, dtype), mask)
  problems = []
  if tuple(out.shape) != x.shape:
    problems.append(f"shape {list(out.shape)}, expected {list(x.shape)}")
  if out.dtype != dtype:
    problems.append(f"dtype {out.dtype}, expected {dtype}")
  finite = bool(np.all(np.isfinite(np.asarray(out, np.float32))))
  if not finite:
    problems.append("non-finite outputs")
  return not problems, f"{out.dtype} {list(out.shape)}, finite={finite}", "; ".join(problems)


def _mixer_check_jit(name: str):
  import jax

  mixer, x, mask, variables = _mixer_setup(name, dropout_rate=MIXER_DROPOUT)
  rngs = {"dropout": jax.random.key(5)}
  eager = np.asarray(_mixer_call(mixer, variables, x, mask, deterministic=False, rngs=rngs, jit=False))
  jitted = np.asarray(_mixer_call(mixer, variables, x, mask, deterministic=False, rngs=rngs))
  err = _max_abs(eager - jitted)
  tol = SAME * (1 + _max_abs(eager))
  return err <= tol, f"max |jit - eager| {err:.2e}", "" if err <= tol else f"tolerance {tol:.1e}"


def _mixer_check_gradients(name: str):
  import jax
  import jax.numpy as jnp

  mixer, x, mask, variables = _mixer_setup(name)
  weights = jnp.asarray(mask[..., None], jnp.float32)

  def loss(params, x):
    out = _mixer_call(mixer, {**variables, "params": params}, x, mask)
    return jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights)  # sin: no cancellation of a plain sum

  g_params, g_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(variables["params"], jnp.asarray(x))
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


def _mixer_check_padding(name: str):
  mixer, x, mask, variables = _mixer_setup(name)
  padded = np.asarray(_mixer_call(mixer, variables, x, mask), np.float64)
  real = MIXER_LENGTH - MIXER_PAD
  cut = np.asarray(_mixer_call(mixer, variables, x[:1, :real], mask[:1, :real]), np.float64)
  err = _max_abs(padded[0, :real] - cut[0])
  tol = SAME * (1 + _max_abs(cut))
  return (err <= tol, f"max |padded - cut| {err:.2e} on {real} real positions",
          "" if err <= tol else f"the padded tail reaches real positions (tolerance {tol:.1e})")


def _mixer_check_causal(name: str):
  config = attention_zoo.layer_config(name)
  if type(config).no_causal_form:
    return None, "no causal form", str(type(config).no_causal_form)
  mixer = _mixer_create(name, causal=True)
  x = _mixer_inputs(1, MIXER_CAUSAL_LENGTH)
  mask = np.ones(x.shape[:2], bool)
  variables = _mixer_init(mixer, x, mask)
  half = MIXER_CAUSAL_LENGTH // 2
  other = x.copy()
  other[:, half:] = _mixer_inputs(2, MIXER_CAUSAL_LENGTH)[:, half:]
  a = np.asarray(_mixer_call(mixer, variables, x, mask), np.float64)
  b = np.asarray(_mixer_call(mixer, variables, other, mask), np.float64)
  err = _max_abs(a[:, :half] - b[:, :half])
  tol = SAME * (1 + _max_abs(a))
  moved = _max_abs(a[:, half:] - b[:, half:])
  problems = [] if err <= tol else [f"the future reaches the past (tolerance {tol:.1e})"]
  if moved <= tol:
    problems.append("changing the second half does not change its own outputs")
  return not problems, f"max |delta| on the first half {err:.2e}", "; ".join(problems)


def _mixer_check_determinism(name: str):
  import jax

  mixer, x, mask, variables = _mixer_setup(name, dropout_rate=MIXER_DROPOUT)
  run = lambda key, det: np.asarray(_mixer_call(mixer, variables, x, mask, deterministic=det,
                                          rngs={"dropout": jax.random.key(key)}))
  moved = _max_abs(run(1, False) - run(2, False))
  still = _max_abs(run(1, True) - run(2, True))
  problems = []
  if moved == 0:
    problems.append(f"dropout_rate={MIXER_DROPOUT}: another dropout key gives the same output")
  if still != 0:
    problems.append("deterministic=True still depends on the dropout key")
  return not problems, f"|delta| with dropout {moved:.2e}, deterministic {still:.1e}", "; ".join(problems)


def _mixer_check_modes(name: str):
  """``mode="chunk"`` (the chunked-parallel / parallel-scan form) equals ``mode="recurrent"`` (token by token),
  bidirectional on the padded batch and causal, for a mixer whose config has a ``mode`` field."""
  import jax.numpy as jnp

  config = attention_zoo.layer_config(name)
  fields = {f.name for f in dataclasses.fields(config)}
  if "mode" not in fields:
    return None, "one form", "the config has no mode field"
  worst, scale = 0.0, 0.0
  for causal in (False, True):
    chunk, x, mask, variables = _mixer_setup(name, mode="chunk", causal=causal)  # the other checks' when default
    a = np.asarray(_mixer_call(chunk, variables, jnp.asarray(x), mask), np.float64)
    b = np.asarray(_mixer_call(_mixer_create(name, mode="recurrent", causal=causal), variables, jnp.asarray(x), mask),
                   np.float64)
    worst, scale = max(worst, _max_abs(a - b)), max(scale, _max_abs(a))
  tol = 10 * SAME * (1 + scale)  # float32: the two forms sum in different orders
  return (worst <= tol, f"max |chunk - recurrent| {worst:.2e} (bidirectional and causal)",
          "" if worst <= tol else f"tolerance {tol:.1e}")


_MIXER_CHECK_FNS: dict[str, Callable[[str], tuple[bool | None, str, str]]] = {
    "config": _mixer_check_config,
    "float32": lambda name: _mixer_check_dtype(name, "float32"),
    "bfloat16": lambda name: _mixer_check_dtype(name, "bfloat16"),
    "jit": _mixer_check_jit,
    "gradients": _mixer_check_gradients,
    "padding": _mixer_check_padding,
    "causal": _mixer_check_causal,
    "determinism": _mixer_check_determinism,
    "modes": _mixer_check_modes,
}
assert tuple(_MIXER_CHECK_FNS) == MIXER_CHECKS



def _options(quick: bool, opts: dict[str, Any]) -> Options:
  fields = {f.name for f in dataclasses.fields(Options)}
  unknown = sorted(set(opts) - fields)
  if unknown:
    raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: quick, {', '.join(sorted(fields))}")
  return dataclasses.replace(QUICK if quick else Options(), **opts)


@dataclasses.dataclass(frozen=True)
class Kit:
  """The checks of one kind of sequence layer: their names, how to run one, and the title of their table."""

  kind: str
  checks: tuple[str, ...]
  run: Callable[[str, str, dict[str, Any]], tuple[bool | None, str, str]]
  title: Callable[[bool], str]


def _core_check(name: str, check: str, opts: dict[str, Any]):
  o = _options(bool(opts.pop("quick", False)), opts)
  return _CHECK_FNS[check](name, o)


def _mixer_check(name: str, check: str, opts: dict[str, Any]):
  del opts  # a mixer's checks run at their one set of shapes (MIXER_LENGTH, ...)
  return _MIXER_CHECK_FNS[check](name)


KITS = {
    "attention": Kit("attention", CHECKS, _core_check,
                     lambda quick: (f"`lra_bench.testing`, L = {(QUICK if quick else Options()).length}, causal L = "
                                    f"{(QUICK if quick else Options()).causal_length}")),
    "mixer": Kit("mixer", MIXER_CHECKS, _mixer_check,
                 lambda quick: (f"`lra_bench.testing` (mixer checks), L = {MIXER_LENGTH}, causal L = "
                                f"{MIXER_CAUSAL_LENGTH}")),
}


def kit(name: str) -> Kit:
  """The checks that apply to ``name``: the one place the kit asks which kind of layer a name is (an unknown
  name raises ValueError listing the known ones)."""
  return KITS[attention_zoo.layer_kind(name)]


def check_one(name: str, check: str, **opts: Any) -> Check:
  """Runs one check on the layer (attention core or sequence mixer) registered as ``name``; ``opts``:
  ``quick`` and ``Options`` fields (a core's; a mixer's checks take none). (``lra_bench.check.run_check`` is
  the other thing: the whole verdict of ``lra-bench check``.)

  A layer that raises is a failed check whose detail is the error (never an exception here); an unknown
  layer or check name raises ValueError.
  """
  layer_kit = kit(name)
  if check not in layer_kit.checks:
    raise ValueError(f"unknown check {check!r} for {name!r}; its checks: {', '.join(layer_kit.checks)}")
  if layer_kit.kind == "attention":
    _options(bool(opts.get("quick", False)), {k: v for k, v in opts.items() if k != "quick"})  # bad options raise
  return run_guarded(check, lambda: layer_kit.run(name, check, dict(opts)))


def run_guarded(check: str, measure: Callable[[], tuple[bool | None, str, str]]) -> Check:
  """``measure()`` -> (passed, measured, detail) as a ``Check``; one that raises is a failed check whose
  detail is the error's first line (both kits: a layer that crashes fails, it never raises here).

  The checks measure a layer's mathematics against float32 round-off (SAME, ROW_SUM, ...). GPUs run
  float32 matrix products as TF32 by default (TPUs as bfloat16 passes), whose ~1e-3 error failed
  jit/rows_sum_to_one/causal on an H100 for cores that are right (reports/gpu_*/README.md): the checks
  run at full float32 precision on every backend (a no-op on the CPU).
  """
  try:
    import jax
    with jax.default_matmul_precision("highest"):
      passed, measured, detail = measure()
  except Exception as err:  # noqa: BLE001 - a layer that crashes fails the check; the error is the detail
    message = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    return Check(check, False, "raised", f"{type(err).__name__}: {message}")
  return Check(check, passed, measured, detail)


def run_conformance(name: str, *, quick: bool = False,
                    progress: Callable[[Check], None] | None = None) -> list[Check]:
  """Every check of ``name``'s kind (``CHECKS`` for a core, ``MIXER_CHECKS`` for a mixer) on ``name``;
  ``progress(check)`` is called after each one."""
  results = []
  for check in kit(name).checks:
    results.append(check_one(name, check, quick=quick))
    if progress is not None:
      progress(results[-1])
  return results


def failures(results: list[Check]) -> list[Check]:
  return [r for r in results if r.passed is False]


def assert_conformant(name: str, *, quick: bool = False) -> None:
  """Raises AssertionError listing every failed check of ``name`` with its measured number."""
  failed = failures(run_conformance(name, quick=quick))
  if failed:
    lines = [f"  {r.name}: {r.measured}" + (f" ({r.detail})" if r.detail else "") for r in failed]
    noun = type(attention_zoo.layer_config(name)).noun
    raise AssertionError(f"{noun} {name!r} fails {len(failed)} conformance check(s):\n" + "\n".join(lines))
