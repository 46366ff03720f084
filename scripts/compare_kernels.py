"""Times attention CORES (forward + backward) against exact reference kernels, interleaved, same inputs.

For every (batch, length) and every core, one timed repeat runs the core, then each reference, on the
same q, k, v [B, L, H, D] (B = batch, L = length, H heads of D), each a jitted
``grad(sum(out ** 2))`` with respect to q, k, v; compile and one warm-up call are excluded and every
call ends in ``block_until_ready``. Interleaving puts machine drift on both sides of each ratio.
The table gives each core's median milliseconds and the ratio core / reference (< 1: the core is faster):

- ``dpa``: ``jax.nn.dot_product_attention(..., implementation="xla")`` — exact softmax attention as
  JAX ships it (the reference of ``vanilla`` and ``flash``);
- ``naive``: the textbook ``softmax(q k^T / sqrt(D)) v`` in three jnp ops;
- ``own`` (where a core has one, ``OWN_REFERENCES``): the core's own pattern written plainly in the
  style of its original code (``bigbird``: Flax/HF-style block-sparse BigBird with the same blocks;
  ``combiner_axial_rowmajor``: the released row-major code's structure, timed against the core with
  ``row_summary="wsum"``, the released summary; ``performer``: FAVOR+ written from the method's
  definition in the structure of the released code, with the core's own random features (the core
  runs with ``redraw="fixed"``, so both use one matrix drawn once, not redrawn per call);
  ``performer_relu``: the generalized ReLU kernel the same way). Their outputs match the core's
  (checked in ``tests/test_attention_kernels.py`` and ``tests/test_compare_kernels.py``).

``--causal`` times the causal cores against causal references (``dpa`` / ``naive`` with the causal
mask; ``performer``: the released causal structure, prefix sums by a scan over positions with a
reverse scan for the gradient; the other own references have no causal form and are left out).

Rows are registered cores, plus ``performer_relu`` (the ``performer`` core with ``kernel="relu"``,
the kernel LRA ran). Cores with an own reference run with its overrides (``OWN_REFERENCES``) in every
column of their row.

For an efficient core the ratios say when it beats exact attention at that length on this backend;
for ``vanilla`` / ``flash`` they say what our exact cores cost over JAX's own. Timings depend on the
machine and its load: compare ratios from one run, never absolute numbers across machines.

    python scripts/compare_kernels.py --lengths 1024,4096 --batch_sizes 1,8 \
        --attentions vanilla,performer,performer_relu
    python scripts/compare_kernels.py --causal --attentions performer,performer_relu --references ''

(``--references ''``: the own column only, which skips the slow exact references at long lengths.)
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp

import attention_zoo


def naive_attention(q, k, v, causal: bool = False):
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
  if causal:
    logits = jnp.where(jnp.tril(jnp.ones(logits.shape[-2:], bool)), logits, -jnp.inf)
  return jnp.einsum("bhqk,bkhv->bqhv", jax.nn.softmax(logits, axis=-1), v)


def dpa_attention(q, k, v, causal: bool = False):
  return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")


def bigbird_blocks_reference(q, k, v, size: int = 64, num_rand: int = 3):
  """BigBird's ITC pattern written plainly, in the style of the Flax/HF block-sparse code: [B, H, ...]
  layout, the first and last query blocks dense, every middle query block against ONE concatenation
  [global first, global last, window b−1, b, b+1, r random] of its key blocks, duplicates removed by an
  additive bias, ``jax.nn.softmax``. Same blocks as the ``bigbird`` core at the top level (seed 0,
  module path hash 0); no padding support (L a multiple of ``size``)."""
  from attention_zoo import bigbird
  batch, length, heads, dim = q.shape
  blocks = length // size
  to_heads = lambda x: jnp.transpose(x, (0, 2, 1, 3))                            # [B, H, L, X]
  q, k, v = to_heads(q) / math.sqrt(dim), to_heads(k), to_heads(v)
  qb, kb, vb = (x.reshape(batch, heads, blocks, size, -1) for x in (q, k, v))    # [B, H, M, S, X]
  dense = lambda qs: jnp.einsum("bhgqk,bhkv->bhgqv",
                                jax.nn.softmax(jnp.einsum("bhgqd,bhkd->bhgqk", qs, k), -1), v)
  first, last = dense(qb[:, :, :1]), dense(qb[:, :, -1:])
  rand = bigbird.random_blocks(blocks, num_rand, heads, [0, 0])[:, 1:-1]         # [H, M', r]
  mid = jnp.arange(1, blocks - 1)
  index = jnp.concatenate([jnp.broadcast_to(jnp.array([0, blocks - 1]), (heads, blocks - 2, 2)),
                           jnp.broadcast_to(jnp.stack([mid - 1, mid, mid + 1], -1), (heads, blocks - 2, 3)),
                           jnp.where(rand >= 0, rand, mid[:, None])], -1)        # [H, M', 5 + r]
  duplicate = jnp.concatenate([jnp.zeros((blocks - 2, 2), bool),
                               jnp.stack([mid == 1, jnp.zeros_like(mid, bool), mid == blocks - 2], -1)], -1)
  bias = jnp.concatenate([jnp.where(duplicate, -1e9, 0.0)[None].repeat(heads, 0),
                          jnp.where(rand >= 0, 0.0, -1e9)], -1)                   # [H, M', 5 + r]
  take = jax.vmap(lambda x, i: x[:, i], in_axes=(1, 0), out_axes=1)              # per head
  k_sel, v_sel = take(kb, index), take(vb, index)                                # [B, H, M', 5+r, S, X]
  logits = jnp.einsum("bhmqd,bhmjtd->bhmqjt", qb[:, :, 1:-1], k_sel) + bias[None, :, :, None, :, None]
  shape = logits.shape
  weights = jax.nn.softmax(logits.reshape(*shape[:4], -1), -1).reshape(shape)
  middle = jnp.einsum("bhmqjt,bhmjtv->bhmqv", weights, v_sel)
  out = jnp.concatenate([first, middle, last], 2).reshape(batch, heads, length, -1)
  return jnp.transpose(out, (0, 2, 1, 3))


def rowmajor_reference(q, k, v):
  """Combiner-Axial row-major with weighted-sum span keys (``row_summary="wsum"``), written plainly in
  the released code's style: [B, H, R, C, X] grids, ``jax.nn.softmax`` for the row distributions and
  one softmax over the concatenated [own row (C keys), row summaries (R keys)] logits, the own row's
  summary removed by an additive bias. No padding support (L = R·C, C = ceil(sqrt(L)))."""
  batch, length, heads, dim = q.shape
  cols = math.ceil(math.sqrt(length))
  rows = length // cols
  grid = lambda x: jnp.transpose(x.reshape(batch, rows, cols, heads, -1), (0, 3, 1, 2, 4))
  q, k, v = grid(q) / math.sqrt(dim), grid(k), grid(v)                           # [B, H, R, C, X]
  row = jnp.einsum("bhrcd,bhrtd->bhrct", q, k)
  a = jax.nn.softmax(row, -1)
  v_hat, k_hat = jnp.einsum("bhzct,bhztv->bhzcv", a, v), jnp.einsum("bhzct,bhztd->bhzcd", a, k)
  span = jnp.einsum("bhrcd,bhzcd->bhrcz", q, k_hat) + jnp.where(jnp.eye(rows, dtype=bool), -1e9, 0.0)[:, None]
  weights = jax.nn.softmax(jnp.concatenate([row, span], -1), -1)
  out = (jnp.einsum("bhrct,bhrtv->bhrcv", weights[..., :cols], v)
         + jnp.einsum("bhrcz,bhzcv->bhrcv", weights[..., cols:], v_hat))
  return jnp.transpose(out, (0, 2, 3, 1, 4)).reshape(batch, length, heads, -1)


def _linear_attention(q_features, k_features, v, causal: bool = False):
  """Kernelized attention as the released FAVOR+ code computes it. Bidirectional: the key-value
  product and the key sum with einsum, the numerator divided by the renormaliser. Causal: prefix sums
  by a scan over positions (:func:`_prefix_products`)."""
  if causal:
    ones = jnp.ones(v.shape[:-1] + (1,), v.dtype)
    return _prefix_products(q_features, k_features, v) / _prefix_products(q_features, k_features, ones)
  kv = jnp.einsum("blhm,blhv->bhmv", k_features, v)
  numerator = jnp.einsum("blhm,bhmv->blhv", q_features, kv)
  denominator = jnp.einsum("blhm,bhm->blh", q_features, jnp.sum(k_features, axis=1))
  return numerator / denominator[..., None]


@jax.custom_vjp
def _prefix_products(q, k, v):
  """out_i = q_i · Σ_{j≤i} k_j v_jᵀ [B, L, H, V] by a scan over positions carrying the [B, H, M, V]
  state, with a reverse scan for the gradient that rebuilds the states by subtraction instead of
  storing L of them (the structure of the released causal FAVOR+)."""
  return _prefix_forward(q, k, v)[0]


def _prefix_forward(q, k, v):
  def step(state, qkv):
    q_i, k_i, v_i = qkv
    state = state + jnp.einsum("bhm,bhv->bhmv", k_i, v_i)
    return state, jnp.einsum("bhm,bhmv->bhv", q_i, state)

  init = jnp.zeros(k.shape[:1] + k.shape[2:] + v.shape[-1:], k.dtype)
  final, out = jax.lax.scan(step, init, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v)))
  return jnp.moveaxis(out, 0, 1), (q, k, v, final)


def _prefix_backward(saved, grad):
  q, k, v, final = saved

  def step(carry, inputs):
    state, from_later = carry                                  # Σ_{j≤i} k_j v_jᵀ, Σ_{j≥i+1} q_j g_jᵀ
    q_i, k_i, v_i, g_i = inputs
    dq = jnp.einsum("bhmv,bhv->bhm", state, g_i)
    from_later = from_later + jnp.einsum("bhm,bhv->bhmv", q_i, g_i)
    dk, dv = jnp.einsum("bhmv,bhv->bhm", from_later, v_i), jnp.einsum("bhmv,bhm->bhv", from_later, k_i)
    return (state - jnp.einsum("bhm,bhv->bhmv", k_i, v_i), from_later), (dq, dk, dv)

  inputs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, grad))
  _, grads = jax.lax.scan(step, (final, jnp.zeros_like(final)), inputs, reverse=True)
  return tuple(jnp.moveaxis(g, 0, 1) for g in grads)


_prefix_products.defvjp(_prefix_forward, _prefix_backward)


def favor_reference(q, k, v, *, projection, causal: bool = False, eps: float = 1e-6):
  """FAVOR+ (positive softmax random features) from the method's definition, with a FIXED projection W
  [M, D] given from outside: ``φ(x) = M^{-1/2}(exp(w·x̃ − |x̃|²/2 − c) + ε)``, ``x̃ = x·D^{-1/4}``, the
  stabiliser c the max of ``w·x̃`` over features for each query and over everything for the keys (also
  when causal, as released: not strictly causal). No padding support (the released code ignored the
  mask)."""
  def features(x, is_query):
    x = x * x.shape[-1] ** -0.25
    wx = jnp.einsum("blhd,md->blhm", x, projection)
    half_norm = 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    peak = jnp.max(wx, axis=-1, keepdims=True) if is_query else jnp.max(wx)
    return (jnp.exp(wx - half_norm - jax.lax.stop_gradient(peak)) + eps) / math.sqrt(projection.shape[0])

  return _linear_attention(features(q, True), features(k, False), v, causal)


def relu_kernel_reference(q, k, v, *, causal: bool = False, eps: float = 1e-3):
  """The generalized kernel attention of the released code with ``kernel_fn = relu``, deterministic
  features (no projection, no data scaling): ``φ(x) = relu(x) + ε``."""
  return _linear_attention(jax.nn.relu(q) + eps, jax.nn.relu(k) + eps, v, causal)


REFERENCES: dict[str, Callable] = {"dpa": dpa_attention, "naive": naive_attention}
# Method-specific references ("own" column): the same pattern written plainly, (reference, core overrides).
# A reference with a ``projection`` argument gets the core's sown random features.
OWN_REFERENCES: dict[str, tuple[Callable, dict]] = {
    "bigbird": (bigbird_blocks_reference, {}),
    "combiner_axial_rowmajor": (rowmajor_reference, {"row_summary": "wsum"}),
    "performer": (favor_reference, {"redraw": "fixed"}),
    "performer_relu": (relu_kernel_reference, {"kernel": "relu"}),
}
# Timed rows that are a registered core under another configuration: row label -> core name.
VARIANTS: dict[str, str] = {"performer_relu": "performer"}


def grad_fn(attention: Callable) -> Callable:
  """jit(grad(sum(attention(q, k, v)^2))) w.r.t. q, k, v."""
  return jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) ** 2), argnums=(0, 1, 2)))


def core_fn(name: str, q, **overrides) -> tuple[Callable, dict]:
  """The registered core as a function of (q, k, v), its parameters initialised once (fixed draws),
  and what it sows (e.g. performer's ``projection``)."""
  core = attention_zoo.create_attention(name, **overrides)
  rngs = {"attention": jax.random.key(2)}
  variables = core.init({"params": jax.random.key(0), "attention": jax.random.key(1)}, q, q, q)
  _, state = core.apply(variables, q, q, q, rngs=rngs, mutable=["intermediates"])
  sown = {key: value[0] for key, value in state.get("intermediates", {}).items()}
  return (lambda q, k, v: core.apply(variables, q, k, v, rngs=rngs)), sown


def time_once(fn: Callable, args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def _traces(reference: Callable, args) -> bool:
  """Whether a plain reference supports this shape (some assume a minimum number of blocks)."""
  try:
    jax.eval_shape(reference, *args)
    return True
  except (TypeError, ValueError):
    return False


def _accepts(fn: Callable, argument: str) -> bool:
  return argument in inspect.signature(fn).parameters


def compare(name: str, batch: int, length: int, heads: int, head_dim: int, repeats: int,
            references: list[str], causal: bool = False) -> dict[str, float]:
  """Median seconds of the core and of each reference, timed interleaved."""
  keys = jax.random.split(jax.random.key(batch * 100003 + length), 3)
  args = tuple(jax.random.normal(k, (batch, length, heads, head_dim), jnp.float32) for k in keys)
  own, overrides = OWN_REFERENCES.get(name, (None, {}))
  if causal:  # causal cores against causal references; an own reference without a causal form is left out
    overrides = overrides | {"causal": True}
    own = functools.partial(own, causal=True) if own is not None and _accepts(own, "causal") else None
  core, sown = core_fn(VARIANTS.get(name, name), args[0], **overrides)
  fns = {name: grad_fn(core)} | {r: grad_fn(functools.partial(REFERENCES[r], causal=causal)) for r in references}
  if own is not None and _accepts(own, "projection"):
    own = functools.partial(own, projection=sown["projection"])
  if own is not None and _traces(own, args):
    fns["own"] = grad_fn(own)
  for fn in fns.values():  # compile + one warm-up call, excluded
    time_once(fn, args)
  times: dict[str, list[float]] = {label: [] for label in fns}
  for _ in range(repeats):
    for label, fn in fns.items():
      times[label].append(time_once(fn, args))
  return {label: statistics.median(ts) for label, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", default="1024,4096")
  parser.add_argument("--batch_sizes", default="1,8")
  parser.add_argument("--attentions", default="all")
  parser.add_argument("--references", default="dpa,naive")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--causal", action="store_true", help="causal cores and references")
  args = parser.parse_args(argv)
  names = (attention_zoo.list_attentions() + list(VARIANTS) if args.attentions == "all"
           else [n.strip() for n in args.attentions.split(",")])
  for name in names:
    attention_zoo.attention_config(VARIANTS.get(name, name))  # unknown -> ValueError listing the known
  references = [r.strip() for r in args.references.split(",") if r.strip()]
  unknown = sorted(set(references) - set(REFERENCES))
  if unknown or args.repeats < 1:
    raise ValueError(f"references must be among {sorted(REFERENCES)} (got {unknown}) and --repeats >= 1")
  print(f"backend {jax.default_backend()}, {jax.devices()[0].device_kind}; fwd+bwd, H={args.heads}, "
        f"D={args.head_dim}, float32, {'causal' if args.causal else 'bidirectional'}, median of "
        f"{args.repeats} interleaved runs")
  columns = references + ["own"]
  owns = [f"{n}: {OWN_REFERENCES[n][0].__name__}" for n in names if n in OWN_REFERENCES]
  if owns:
    print("own references: " + ", ".join(owns))
  header = "| attention | B | L | ms | " + " | ".join(f"{r} ms | ratio vs {r}" for r in columns) + " |"
  print(header)
  print("|---|---:|---:|---:|" + "---:|---:|" * len(columns))
  for batch in (int(b) for b in args.batch_sizes.split(",")):
    for length in (int(n) for n in args.lengths.split(",")):
      for name in names:
        try:
          med = compare(name, batch, length, args.heads, args.head_dim, args.repeats, references, args.causal)
        except NotImplementedError:  # a core without a causal form
          print(f"| {name} | {batch} | {length} | not causal |", flush=True)
          continue
        cells = " | ".join(f"{1e3 * med[r]:.1f} | {med[name] / med[r]:.2f}" if r in med else "- | -"
                           for r in columns)
        print(f"| {name} | {batch} | {length} | {1e3 * med[name]:.1f} | {cells} |", flush=True)
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
