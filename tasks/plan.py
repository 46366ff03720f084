"""What a protocol's runs need prepared, and the command that prepares it: the one plan that ``lra-bench data
prepare`` carries out and that a run without its data names (``lra_bench.experiments.cell``'s ``no_data`` fix).

A task's data are made by ``Task.prepare(data_dir, **options)`` (CONTRACT 2). A run's config names those
options in two sections: ``data.prepare`` (how the data are generated: counts, lengths, seed, the variant's
``name``) and ``data.options`` (what the run reads: the variant's ``name``, Pathfinder's contour length ...); a
``data.options`` value that ``prepare`` takes too is part of the data the run needs. A protocol declares its
runs: its preset and the points of its sweep. Configs are ``lra_bench``'s, and this package never imports it:
the callers pass each config's two sections as plain dicts.

- ``run_options(task, prepare, options)``: the ``prepare`` options that make the data one run reads;
- ``preparations(task, presets, flags)``: what ``data prepare TASK [--protocol P] [--FLAG VALUE ...]``
  prepares: one option set per distinct ``data.prepare`` of the protocol's runs (``[{}]`` without a protocol),
  each with the flags' values in place of its own;
- ``fix_command(task, protocol, data_dir, run, preset, points)``: the command that prepares exactly one run's
  data (its ``run_options``): ``data prepare --protocol`` with the flags that pin what the protocol's preset
  does not give or what differs between the protocol's runs.
"""

from __future__ import annotations

import inspect
import os
import shlex
from typing import Any, Mapping, Sequence

import tasks as tasks_lib
from tasks.base import check_name

Options = dict[str, Any]


def run_options(task: str, prepare: Mapping[str, Any], options: Mapping[str, Any]) -> Options:
  """The ``data prepare`` options that make the data a run with these ``data.prepare`` / ``data.options``
  sections reads: ``prepare``, with every ``options`` value the task's ``prepare`` also takes (the file name,
  the contour length ...)."""
  takes = inspect.signature(tasks_lib.get_task(task).prepare).parameters
  return {**prepare, **{k: v for k, v in options.items() if k in takes and k != "data_dir"}}


def preparations(task: str, presets: Sequence[Mapping[str, Any]], flags: Mapping[str, Any],
                 protocol: str | None = None) -> list[Options]:
  """The option sets ``data prepare`` passes to the task's ``prepare``, one per distinct setting: each of
  ``presets`` (the ``data.prepare`` sections of ``protocol``'s runs; ``[{}]`` without a protocol) with ``flags``
  (the options given on the command line) replacing its values; presets they make equal are prepared once.

  Raises ``DataError`` before anything is written when ``--name`` would name several settings (one file name
  for different data), or when a name is not a plain file name.
  """
  merged: list[Options] = []
  for preset in presets:
    options = {**preset, **flags}
    if options not in merged:
      merged.append(options)
  if "name" in flags and len(merged) > 1:
    varying = sorted(k for k in set().union(*merged) if len({repr(o.get(k)) for o in merged}) > 1)
    pins = " ".join(f"--{k} {merged[0].get(k)}" for k in varying)
    raise tasks_lib.DataError(f"data prepare {task} --protocol {protocol}: --name {flags['name']} would name "
                              f"{len(merged)} different data settings of the protocol's sweep (they differ in "
                              f"{', '.join(varying)}); pick one with its values (e.g. {pins}) or leave --name out")
  for options in merged:
    if "name" in options:
      check_name(task, options["name"])
  return merged


def pinned_flags(run: Mapping[str, Any], preset: Mapping[str, Any] | None,
                 points: Sequence[Mapping[str, Any]]) -> list[str]:
  """``--key value`` for each of a run's options (``run``, its ``run_options``) that the protocol's preset
  (``preset``, its ``run_options``; None: unknown, every option is spelled out) does not give, and for each
  that differs between the protocol's runs (``points``: ``data prepare --protocol`` makes every run's data;
  these flags pin the run's own)."""
  preset = {} if preset is None else preset
  varying = {k for point in points for k in point if any(other.get(k) != point[k] for other in points)}
  return [f"--{k} {shlex.quote(str(v))}" for k, v in sorted(run.items())
          if k in varying or preset.get(k, object()) != v]


def fix_command(task: str, protocol: str, data_dir: str, run: Mapping[str, Any],
                preset: Mapping[str, Any] | None, points: Sequence[Mapping[str, Any]]) -> str:
  """The command that prepares exactly the data of one run of ``protocol`` (``pinned_flags``)."""
  return " ".join([f"lra-bench data prepare {task} --protocol {protocol} "
                   f"--data_dir {shlex.quote(os.path.abspath(data_dir))}", *pinned_flags(run, preset, points)])
