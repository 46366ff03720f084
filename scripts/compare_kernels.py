"""Times attention CORES (forward + backward) against exact reference kernels, interleaved, same inputs.

For every (batch, length) and every core, one timed repeat runs the core, then each reference, on the
same q, k, v [B, L, H, D] (B = batch, L = length, H heads of D), each a jitted
``grad(sum(out ** 2))`` with respect to q, k, v; compile and one warm-up call are excluded and every
call ends in ``block_until_ready``. Interleaving puts machine drift on both sides of each ratio.
The table gives each core's median milliseconds and the ratio core / reference (< 1: the core is faster):

- ``dpa``: ``jax.nn.dot_product_attention(..., implementation="xla")`` — exact softmax attention as
  JAX ships it (the reference of ``vanilla`` and ``flash``);
- ``naive``: the textbook ``softmax(q k^T / sqrt(D)) v`` in three jnp ops.

For an efficient core the ratios say when it beats exact attention at that length on this backend;
for ``vanilla`` / ``flash`` they say what our exact cores cost over JAX's own. Timings depend on the
machine and its load: compare ratios from one run, never absolute numbers across machines.

    python scripts/compare_kernels.py --lengths 1024,4096 --batch_sizes 1,8 --attentions vanilla,performer
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp

import attention_zoo


def naive_attention(q, k, v):
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
  return jnp.einsum("bhqk,bkhv->bqhv", jax.nn.softmax(logits, axis=-1), v)


def dpa_attention(q, k, v):
  return jax.nn.dot_product_attention(q, k, v, implementation="xla")


REFERENCES: dict[str, Callable] = {"dpa": dpa_attention, "naive": naive_attention}


def grad_fn(attention: Callable) -> Callable:
  """jit(grad(sum(attention(q, k, v)^2))) w.r.t. q, k, v."""
  return jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) ** 2), argnums=(0, 1, 2)))


def core_fn(name: str, q, **overrides) -> Callable:
  """The registered core as a function of (q, k, v), its parameters initialised once (fixed draws)."""
  core = attention_zoo.create_attention(name, **overrides)
  variables = core.init({"params": jax.random.key(0), "attention": jax.random.key(1)}, q, q, q)
  return lambda q, k, v: core.apply(variables, q, k, v, rngs={"attention": jax.random.key(2)})


def time_once(fn: Callable, args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def compare(name: str, batch: int, length: int, heads: int, head_dim: int, repeats: int,
            references: list[str]) -> dict[str, float]:
  """Median seconds of the core and of each reference, timed interleaved."""
  keys = jax.random.split(jax.random.key(batch * 100003 + length), 3)
  args = tuple(jax.random.normal(k, (batch, length, heads, head_dim), jnp.float32) for k in keys)
  fns = {name: grad_fn(core_fn(name, args[0]))} | {r: grad_fn(REFERENCES[r]) for r in references}
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
  args = parser.parse_args(argv)
  names = (attention_zoo.list_attentions() if args.attentions == "all"
           else [n.strip() for n in args.attentions.split(",")])
  for name in names:
    attention_zoo.attention_config(name)  # unknown name -> ValueError listing the known ones
  references = [r.strip() for r in args.references.split(",") if r.strip()]
  unknown = sorted(set(references) - set(REFERENCES))
  if unknown or args.repeats < 1:
    raise ValueError(f"references must be among {sorted(REFERENCES)} (got {unknown}) and --repeats >= 1")
  print(f"backend {jax.default_backend()}, {jax.devices()[0].device_kind}; fwd+bwd, H={args.heads}, "
        f"D={args.head_dim}, float32, median of {args.repeats} interleaved runs")
  header = "| attention | B | L | ms | " + " | ".join(f"{r} ms | ratio vs {r}" for r in references) + " |"
  print(header)
  print("|---|---:|---:|---:|" + "---:|---:|" * len(references))
  for batch in (int(b) for b in args.batch_sizes.split(",")):
    for length in (int(n) for n in args.lengths.split(",")):
      for name in names:
        med = compare(name, batch, length, args.heads, args.head_dim, args.repeats, references)
        cells = " | ".join(f"{1e3 * med[r]:.1f} | {med[name] / med[r]:.2f}" for r in references)
        print(f"| {name} | {batch} | {length} | {1e3 * med[name]:.1f} | {cells} |", flush=True)
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
