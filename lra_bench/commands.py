"""What each CLI command does. ``cli.py`` only parses flags and calls one of these."""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import attention_zoo
import tasks as tasks_lib
from lra_bench import config as config_lib


def list_all() -> str:
  lines = ["attentions: " + ", ".join(attention_zoo.list_attentions()),
           "tasks:      " + ", ".join(tasks_lib.list_tasks()),
           "protocols:  " + ", ".join(config_lib.list_protocols())]
  return "\n".join(lines)


def list_names(what: str) -> list[str]:
  """Names, one kind at a time (for scripts): attentions, tasks or protocols."""
  listing = {"attentions": attention_zoo.list_attentions, "tasks": tasks_lib.list_tasks,
             "protocols": config_lib.list_protocols}
  if what not in listing:
    raise ValueError(f"unknown listing {what!r}; expected one of {', '.join(listing)}")
  return listing[what]()


def prepare_options(task: str, protocol: str | None, options: dict[str, Any]) -> dict[str, Any]:
  """The protocol's ``data.prepare`` options (if a protocol is named), updated by explicit ``options``."""
  merged: dict[str, Any] = {}
  if protocol:
    merged.update(config_lib.load_config(protocol, task).data.prepare.to_dict())
  merged.update({k: v for k, v in options.items() if v is not None})
  return merged


def prepare_data(task_name: str, data_dir: str, protocol: str | None = None,
                 options: dict[str, Any] | None = None) -> str:
  task = tasks_lib.get_task(task_name)
  opts = prepare_options(task_name, protocol, options or {})
  logging.info("preparing %s in %s with %s", task_name, data_dir, opts or "defaults")
  try:
    path = task.prepare(data_dir, **opts)
  except TypeError as err:  # an option this task does not take
    raise config_lib.ConfigError(f"data prepare {task_name}: {err}") from None
  return path


def download_lra_release(data_dir: str, url: str | None = None, sha256: str | None = None) -> str:
  from lra_bench import download

  path = download.download_lra_release(data_dir, url=url or download.LRA_RELEASE_URL, sha256=sha256)
  return f"LRA release in {path}"


def train(task: str, attention: str, protocol: str, seed: int, workdir: str | None, data_dir: str,
          results_dir: str | None = None, overrides: Sequence[str] = (), force: bool = False) -> dict:
  from lra_bench import train as train_lib

  overrides = [f"model.attention={attention}", f"seed={seed}", *overrides]
  config = config_lib.load_config(protocol, task, overrides)
  workdir = workdir or os.path.join("runs", protocol, task, f"{attention}_seed{seed}")
  return train_lib.run(config, workdir, data_dir, results_dir, force=force)


def suite(protocol: str, task_names: str, attentions: str, seeds: str, results_dir: str, data_dir: str,
          overrides: Sequence[str] = (), isolate: bool = False, retry_failed: bool = True):
  from lra_bench import suite as suite_lib

  return suite_lib.run_suite(protocol, task_names, attentions, seeds, results_dir=results_dir,
                             data_dir=data_dir, overrides=overrides, isolate=isolate,
                             retry_failed=retry_failed)


def bench(lengths: str, attentions: str, results_dir: str, batch_size: int = 32, mode: str = "train",
          warmup_steps: int = 2, repeats: int = 10, compile_only: bool = False,
          compile_only_from: int | None = None, timeout_s: float | None = 600.0, isolate: bool = True,
          overrides: Sequence[str] = ()):
  from lra_bench import bench as bench_lib

  return bench_lib.run_bench(lengths, attentions, results_dir=results_dir, batch_size=batch_size, mode=mode,
                             warmup_steps=warmup_steps, repeats=repeats, compile_only=compile_only,
                             compile_only_from=compile_only_from, timeout_s=timeout_s, isolate=isolate,
                             overrides=overrides)


def report(results_dir: str, out_dir: str, reference_dir: str | None = None, attention_length: int = 64,
           command: str | None = None) -> list[str]:
  from lra_bench import report as report_lib

  return report_lib.write_report(results_dir, out_dir, reference_dir=reference_dir,
                                 attention_length=attention_length, command=command)


def viz_attention(name: str, length: int = 64, out: str | None = None) -> list[str]:
  from lra_bench import viz

  attention_zoo.attention_config(name)  # unknown name -> ValueError listing the known ones
  return viz.plot_attention(name, out or viz.default_out(name, length), length)


def start_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                      process_id: int | None = None, distributed: bool | None = None) -> bool:
  """Joins a multi-host run when flags or the environment say so (before any device is touched)."""
  from lra_bench import parallel

  return parallel.initialize(coordinator_address, num_processes, process_id, distributed)
