"""Exact attention on ONE CPU thread, side by side: our ``vanilla`` and ``flash`` cores against PyTorch's fused
CPU ``scaled_dot_product_attention`` (forward + backward), in one process, interleaved.

Candidates, each the gradient with respect to q, k, v of ``sum(out * cotangent)``, same inputs (float32,
non-causal, every position real), q, k, v [B, L, H, D] for JAX, [B, H, L, D] for PyTorch:

- ``vanilla``: the explicit exact core (``attention_zoo/vanilla.py``);
- ``flash``: the ``flash`` core as configured by default; on the CPU ``resolve_implementation`` answers
  "blockwise" (the online-softmax path over key blocks with its own backward, ``attention_zoo/flash.py``),
  and the script checks that it does;
- ``flash xla``: the ``flash`` core with ``implementation="xla"`` (XLA's dense ``dot_product_attention``);
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on inputs with ``requires_grad``, held to
  PyTorch's flash-attention CPU kernel (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``, so it raises rather
  than time another kernel).

One thread: ``XLA_FLAGS`` gets ``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` before
jax is imported, and ``torch.set_num_threads(1)`` / ``set_num_interop_threads(1)``. The JAX candidates are
jit-compiled; compile and two warm-up calls per candidate are excluded; every repetition runs each candidate
once, in an order rotated from one repetition to the next, so background load hits all alike. Reported: the
median wall-clock milliseconds of ``--reps`` repetitions (at least 5), ratios of medians (flash / vanilla,
flash / sdpa, vanilla / sdpa, flash xla / vanilla), a second table of the medians of process CPU time
(less sensitive to other processes taking the core) and the versions. Before timing, the outputs of
``flash`` and ``sdpa`` are compared at the smallest length (a sanity check of the inputs and layouts).

Defaults: B = 1, H = 8, D = 64 (LRA Text is H = 4 heads of D = 64 at batch 32: 32x the work of B = 1,
H = 4, too slow for one thread at 4K; B·H = 8 rows of D = 64 here), L in 1024, 2048, 4096. About three
minutes on one core of a 2-core AMD EPYC.

PyTorch is NOT a dependency of lra-bench. Run this from a separate virtual environment that has torch (CPU
wheel) and the same jax, jaxlib, flax, ml_dtypes and numpy as the project's:

    python3 -m venv ~/torchvenv
    ~/torchvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu   # or: pip install torch
    ~/torchvenv/bin/pip install $(.venv/bin/pip freeze | grep -E "^(jax|jaxlib|flax|ml.dtypes|numpy)==")
    PYTHONPATH=. ~/torchvenv/bin/python scripts/cpu_attention_vs_sdpa.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""),
                                                 "--xla_cpu_multi_thread_eigen=false",
                                                 "intra_op_parallelism_threads=1"]))

# attention_zoo first: it adds its XLA:CPU workaround flag (attention_zoo/_xla_cpu.py) before any backend starts,
# so every candidate runs under the flags the project's own runs use.
import attention_zoo
import jax
import jax.numpy as jnp
import numpy as np
from attention_zoo import flash

TORCH_MISSING = """PyTorch is not installed in this environment (it is not a dependency of lra-bench). Get it in a
separate virtual environment, with the project's jax versions:

    python3 -m venv ~/torchvenv
    ~/torchvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu   # or: pip install torch
    ~/torchvenv/bin/pip install $(.venv/bin/pip freeze | grep -E "^(jax|jaxlib|flax|ml.dtypes|numpy)==")
    PYTHONPATH=. ~/torchvenv/bin/python scripts/cpu_attention_vs_sdpa.py"""

CANDIDATES = ("vanilla", "flash", "flash xla", "sdpa")


def jax_candidate(name: str, batch: int, length: int):
  """jitted (q, k, v, cotangent) -> (dq, dk, dv) of sum(core(q, k, v) * cotangent); inputs [B, L, H, D]."""
  overrides = {"flash xla": {"implementation": "xla"}}.get(name, {})
  core = attention_zoo.create_attention(name.split()[0], **overrides)
  if name == "flash":
    ran = flash.resolve_implementation(core.config, jnp.float32)
    if ran != "blockwise":
      raise SystemExit(f"flash resolves to {ran!r} on {jax.default_backend()}, not 'blockwise'")
  mask = jnp.ones((batch, length), bool)

  def loss(q, k, v, cotangent):
    return jnp.sum(core.apply({}, q, k, v, mask=mask) * cotangent)

  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  return lambda *args: jax.block_until_ready(grad(*args))


def sdpa_candidate(torch):
  """(q, k, v, cotangent) [B, H, L, D] torch tensors -> (dq, dk, dv) through the fused flash CPU kernel."""
  from torch.nn.attention import SDPBackend, sdpa_kernel

  def run(q, k, v, cotangent):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
      out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return torch.autograd.grad((out * cotangent).sum(), (q, k, v))

  return run


def inputs(torch, batch: int, length: int, heads: int, head_dim: int, seed: int = 0):
  """(jax inputs [B, L, H, D], torch inputs [B, H, L, D] with requires_grad on q, k, v): the same numbers."""
  rng = np.random.default_rng(seed)
  arrays = [rng.standard_normal((batch, length, heads, head_dim)).astype(np.float32) for _ in range(4)]
  jax_args = [jnp.asarray(a) for a in arrays]
  torch_args = [torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3))) for a in arrays]
  for t in torch_args[:3]:
    t.requires_grad_(True)
  return jax_args, torch_args


def sanity_check(torch, batch, length, heads, head_dim) -> float:
  """Max |flash - sdpa| of the outputs (float32 round-off expected)."""
  from torch.nn.attention import SDPBackend, sdpa_kernel

  (q, k, v, _), (tq, tk, tv, _) = inputs(torch, batch, length, heads, head_dim, seed=1)
  ours = np.asarray(attention_zoo.create_attention("flash").apply({}, q, k, v))
  with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
    theirs = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv).numpy().transpose(0, 2, 1, 3)
  return float(np.max(np.abs(ours - theirs)))


def measure(torch, batch, length, heads, head_dim, reps):
  """{candidate: (wall seconds, CPU seconds) per repetition}, candidates interleaved in rotated order."""
  jax_args, torch_args = inputs(torch, batch, length, heads, head_dim)
  runs = {}
  for name in CANDIDATES[:3]:
    grad = jax_candidate(name, batch, length)
    runs[name] = lambda grad=grad: grad(*jax_args)
  sdpa = sdpa_candidate(torch)
  runs["sdpa"] = lambda: sdpa(*torch_args)
  for run in runs.values():   # compile + warm-up
    run()
    run()
  times = {name: [] for name in runs}
  for rep in range(reps):
    order = CANDIDATES[rep % len(CANDIDATES):] + CANDIDATES[:rep % len(CANDIDATES)]
    for name in order:
      wall, cpu = time.perf_counter(), time.process_time()
      runs[name]()
      times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
  return times


def table(results, column: int, what: str) -> str:
  ms = {length: {name: 1e3 * statistics.median(t[column] for t in runs) for name, runs in by_name.items()}
        for length, by_name in results.items()}
  lines = [f"{what}, median ms:", "",
           "| L | vanilla | flash (blockwise) | flash xla | sdpa | flash/vanilla | flash/sdpa | vanilla/sdpa "
           "| flash xla/vanilla |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for length, m in ms.items():
    lines.append(f"| {length} | {m['vanilla']:.0f} | {m['flash']:.0f} | {m['flash xla']:.0f} | {m['sdpa']:.0f} "
                 f"| {m['flash'] / m['vanilla']:.2f} | {m['flash'] / m['sdpa']:.2f} "
                 f"| {m['vanilla'] / m['sdpa']:.2f} | {m['flash xla'] / m['vanilla']:.2f} |")
  return "\n".join(lines)


def versions(torch) -> str:
  import flax
  import jaxlib
  import ml_dtypes

  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  return (f"python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
          f"flax {flax.__version__}, ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, "
          f"torch {torch.__version__} (CPU capability {torch.backends.cpu.get_cpu_capability()}); "
          f"{cpu}, {os.cpu_count()} CPUs; XLA_FLAGS={os.environ['XLA_FLAGS']!r}, "
          f"torch threads {torch.get_num_threads()}")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--lengths", default="1024,2048,4096")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--reps", type=int, default=5)
  args = parser.parse_args(argv)
  if args.reps < 5:
    parser.error("--reps must be at least 5 (medians of fewer say little)")
  try:
    import torch
  except ImportError:
    print(TORCH_MISSING, file=sys.stderr)
    return 2
  torch.set_num_threads(1)
  torch.set_num_interop_threads(1)
  if jax.default_backend() != "cpu":
    print(f"warning: jax backend is {jax.default_backend()}, not cpu", file=sys.stderr)
  lengths = [int(x) for x in args.lengths.split(",")]
  shape = f"B={args.batch}, H={args.heads}, D={args.head_dim}"
  print(f"Exact attention forward + backward, float32, non-causal, no padding, {shape}, one thread; "
        f"median of {args.reps} interleaved repetitions.")
  print(f"sanity: max |flash - sdpa| at L={lengths[0]}: "
        f"{sanity_check(torch, args.batch, lengths[0], args.heads, args.head_dim):.2e}", flush=True)
  results = {}
  for length in lengths:
    results[length] = measure(torch, args.batch, length, args.heads, args.head_dim, args.reps)
    print(f"L={length} done", file=sys.stderr, flush=True)
  print()
  print(table(results, 0, "Wall clock"))
  print()
  print(table(results, 1, "Process CPU time"))
  print()
  print(versions(torch))
  return 0


if __name__ == "__main__":
  sys.exit(main())
