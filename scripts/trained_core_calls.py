"""Read what an attention core sees inside a trained run: the shared part of the two diagnostic scripts of
the ``xiong`` ListOps study (``performer_attention_diagnostic.py``, ``reformer_window_diagnostic.py`` beside
this file; reports/cpu_xiong_listops/README.md). Not part of the lra_bench package: a study's code.

``add_run_arguments`` gives a script the run's flags; ``capture_core_calls`` loads the run's last
checkpoint (from a temporary copy unless ``--no_copy``, so a running training's checkpoints are never
touched), runs one validation batch through the model and hands every call of the chosen core class to
``grab`` inside the model (so module methods such as a core's projection are callable there);
``print_table`` prints one row per layer and writes the JSON atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from typing import Any, Callable

from lra_bench import files


def add_run_arguments(parser: argparse.ArgumentParser, attention: str) -> None:
  parser.add_argument("--workdir", required=True, help=f"a `lra-bench train --attention {attention}` run directory")
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--protocol", default="xiong")
  parser.add_argument("--task", default="listops")
  parser.add_argument("--set", action="append", default=[], help="the run's own --set overrides")
  parser.add_argument("--examples", type=int, default=8, help="examples of the batch to average over")
  parser.add_argument("--no_copy", action="store_true", help="read the run directory in place")
  parser.add_argument("--json", help="also write the statistics here")


def capture_core_calls(args: argparse.Namespace, attention: str, core_class: type,
                       grab: Callable[[Any, tuple, dict], Any]):
  """(config, checkpoint step, [grab(module, call_args, call_kwargs) for every core call, in order])."""
  import flax.linen as nn

  from lra_bench.training import config as config_lib
  from lra_bench.training import loop

  cfg = config_lib.load_config(args.protocol, args.task, args.set, attention=attention)
  captured = []
  with tempfile.TemporaryDirectory() as tmp:
    workdir = args.workdir
    if not args.no_copy:
      workdir = os.path.join(tmp, "run")
      shutil.copytree(args.workdir, workdir, ignore=shutil.ignore_patterns(".lock", "tensorboard"))
    run = loop.Run(cfg, workdir, args.data_dir)
    batch = loop.to_numpy(next(iter(run.data.validation)))

    def interceptor(next_fun, call_args, call_kwargs, context):
      if isinstance(context.module, core_class) and context.method_name == "__call__":
        captured.append(grab(context.module, call_args, call_kwargs))
      return next_fun(*call_args, **call_kwargs)

    model = run.objective.create_model(run.data.examples["train"].vocab_size)
    with nn.intercept_methods(interceptor):
      model.apply({"params": run.state.params, **run.state.model_state}, batch, deterministic=True)
  return cfg, run.saved_step, captured


def core_mask(call_args: tuple, call_kwargs: dict):
  """The ``mask`` argument of a core call ``(query, key, value, mask, ...)``."""
  return call_args[3] if len(call_args) > 3 else call_kwargs["mask"]


def print_table(args: argparse.Namespace, step: int, heading: str, stats: dict[str, dict[str, float]],
                **extra) -> None:
  """``heading``, then a Markdown table (one row per layer, columns the statistics); the JSON to
  ``args.json`` when given (workdir, step, examples, ``extra``, layers)."""
  print(f"{args.workdir}: step {step}, {heading}")
  names = list(next(iter(stats.values())))
  print("| layer | " + " | ".join(names) + " |")
  print("|---|" + "---:|" * len(names))
  for layer, row in stats.items():
    print(f"| {layer} | " + " | ".join(f"{row[name]:.3f}" for name in names) + " |")
  if args.json:
    files.write_atomic(args.json, json.dumps({"workdir": args.workdir, "step": step, "examples": args.examples,
                                              **extra, "layers": stats}, indent=1))
