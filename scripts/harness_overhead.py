"""The train loop's speed against the bare compiled train step, same config, same batches.

The bare loop calls the run's own compiled ``train_step`` on batches fetched beforehand (device arrays,
the same sequence the run's iterator yields) and blocks once at the end; the loop is ``Run.train()``
itself, reporting the steps/s its records carry (``StepTimer``: evaluation, checkpoints and the first
step after a start excluded) and, for information, its whole wall time per step (everything included).
Ratio = loop steps/s / bare steps/s (goal >= 0.95). ``input_cpu_ms_per_batch``: the CPU seconds (all
threads) the input pipeline took per batch while the bare loop's batches were fetched, the work that
competes with the train step on a small CPU. Prints one JSON line.

  python scripts/harness_overhead.py --protocol cpu --task listops --attention vanilla --data_dir DIR --steps 200
  python scripts/harness_overhead.py --protocol lra --task listops --attention local --data_dir DIR --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lra_bench.training import config as config_lib
from lra_bench.training import loop


def _sig(x: float) -> float:
  """Four significant digits: an LRA-size step on a CPU runs at 0.02 steps/s, which 3 decimals would blur."""
  return float(f"{x:.4g}")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--protocol", default="cpu")
  parser.add_argument("--task", default="listops")
  parser.add_argument("--attention", default="vanilla")
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--set", action="append", default=[], help="config override KEY=VALUE")
  args = parser.parse_args()
  overrides = [f"num_train_steps={args.steps}", *args.set]
  config = config_lib.load_config(args.protocol, args.task, overrides, attention=args.attention)

  with tempfile.TemporaryDirectory(prefix="harness-overhead-") as workdir:
    run = loop.Run(config, workdir, args.data_dir)
    batches = []
    data_start = time.process_time()  # every thread of the process: tf.data's workers included
    for batch in iter(run.data.train):
      batches.append(run.to_global(loop.to_numpy(batch)))
      if len(batches) == args.steps:
        break
    data_cpu = (time.process_time() - data_start) / len(batches)
    state = jax.tree.map(jnp.copy, run.state)
    state, _ = run.compiled(state, batches[0])          # warm-up (as the loop's timer skips its first step)
    jax.block_until_ready(state)
    start = time.perf_counter()
    for batch in batches[1:]:
      state, _ = run.compiled(state, batch)
    jax.block_until_ready(state)
    bare = (len(batches) - 1) / (time.perf_counter() - start)
    del state

    start = time.perf_counter()
    run.train()
    wall = time.perf_counter() - start
    looped = run.timer.steps_per_second
  print(json.dumps({"protocol": args.protocol, "task": args.task, "attention": args.attention,
                    "batch_size": config.batch_size, "steps": args.steps, "eval_every": config.eval_every,
                    "bare_steps_per_second": _sig(bare), "loop_steps_per_second": _sig(looped),
                    "ratio": round(looped / bare, 4),
                    "loop_wall_steps_per_second_with_evals": _sig(args.steps / wall),
                    "input_cpu_ms_per_batch": round(1e3 * data_cpu, 2),
                    "device": jax.devices()[0].device_kind}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
