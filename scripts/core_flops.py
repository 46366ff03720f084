"""XLA FLOPs of attention CORES alone (forward + backward), and their slope in the sequence length.

The `lra-bench bench` sweep measures whole training steps, where the length-linear projections and MLP
dilute the attention's scaling (vanilla's step FLOPs slope is ~1.7, not 2). This compiles only the core
(batch 1, 4 heads of 64, as the LRA Text model) and fits log FLOPs on log length. Compile-only: no step
is run, so it is cheap on any machine.

    python scripts/core_flops.py --lengths 1024,2048,4096,8192 --attentions all
"""

from __future__ import annotations

import argparse
import sys

import attention_zoo
from lra_bench.report.plots import fit_slope


def core_flops(name: str, length: int, heads: int = 4, head_dim: int = 64) -> float:
  """XLA cost-analysis FLOPs of the core's forward + backward at this length (the same compile as
  ``lra-bench check``: one FLOP counter in the project)."""
  from lra_bench.check import core_cost

  return float(core_cost(name, length, heads, head_dim)["flops"])


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", default="1024,2048,4096,8192")
  parser.add_argument("--attentions", default="all")
  args = parser.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(",")]
  names = (attention_zoo.list_attentions() if args.attentions == "all"
           else [n.strip() for n in args.attentions.split(",")])
  for name in names:
    attention_zoo.attention_config(name)  # unknown name -> ValueError listing the known ones
  print("| attention | " + " | ".join(f"GFLOP @ {n}" for n in lengths) + " | slope |")
  print("|---|" + "---:|" * (len(lengths) + 1))
  for name in names:
    flops = [core_flops(name, n) for n in lengths]
    slope = fit_slope(lengths, flops)
    slope = float("nan") if slope is None else slope
    print(f"| {name} | " + " | ".join(f"{f / 1e9:.2f}" for f in flops) + f" | {slope:.2f} |", flush=True)
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
