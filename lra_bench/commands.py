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


def train(task: str, attention: str, protocol: str, seed: int, workdir: str | None, data_dir: str,
          results_dir: str | None = None, overrides: Sequence[str] = (), force: bool = False) -> dict:
  from lra_bench import train as train_lib

  overrides = [f"model.attention={attention}", f"seed={seed}", *overrides]
  config = config_lib.load_config(protocol, task, overrides)
  workdir = workdir or os.path.join("runs", protocol, task, f"{attention}_seed{seed}")
  return train_lib.run(config, workdir, data_dir, results_dir, force=force)


def start_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                      process_id: int | None = None, distributed: bool | None = None) -> bool:
  """Joins a multi-host run when flags or the environment say so (before any device is touched)."""
  from lra_bench import parallel

  return parallel.initialize(coordinator_address, num_processes, process_id, distributed)
