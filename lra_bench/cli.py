"""The ``lra-bench`` command line: one subcommand per command, each with only its own flags.

  lra-bench list [attentions|tasks|protocols]
  lra-bench data prepare TASK [--protocol smoke] [--num_train N ...] [--data_dir DIR]
  lra-bench data prepare pathfinder --resolution 32 --contour_length 14 --num_images N --seed S
  lra-bench data download lra-release [--data_dir DIR] [--url URL] [--sha256 HEX]
  lra-bench train --task listops --attention vanilla --protocol smoke --seed 0 --workdir DIR
  lra-bench suite --protocol smoke --tasks all --attentions all --seeds 0,1,2 --results_dir DIR
  lra-bench bench --lengths 1024,2048,4096 --attentions all --batch_size 32 --mode train --results_dir DIR
  lra-bench report --results_dir DIR --out DIR
  lra-bench viz attention NAME [--length 64] [--out FILE.png|.svg]
  lra-bench check NAME [--lengths 256,512] [--out DIR] [--steps N] [--quick]
  lra-bench new attention NAME [--dir DIR] [--style linen|nnx|function]

Parsing is absl's argparse integration (``argparse_flags.ArgumentParser`` handed to ``app.run``), so a
flag another command uses is an error here instead of being silently ignored, every value is checked by
its argparse type before anything runs (one line: flag, value, allowed range), and ``--help`` shows the
defaults. absl's own flags (``--verbosity``, ``--logtostderr``; ``--helpfull`` lists them) work on every
command. Nothing heavy is imported before a command runs: ``--help`` and ``list`` never load TensorFlow.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import shlex
import sys
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags
from absl.flags import argparse_flags

from lra_bench import files
from lra_bench.errors import ConfigError, UsageError
from lra_bench.experiments import grid
from lra_bench.experiments.bench import MODES
from lra_bench.experiments.launcher import FLAGS as LAUNCHER_FLAGS, LAUNCHERS
from tasks.base import MAX_SEED, PREPARE_RANGES

# The next command a newcomer runs (the top-level --help ends with it).
START = ("start with: ./run_all.sh (the whole smoke suite, bench and report), or\n"
         "  lra-bench data prepare listops --protocol smoke && lra-bench train --task listops "
         "--protocol smoke --workdir runs/demo")
LISTINGS = ("attentions", "tasks", "protocols")
# suite flag (its argparse name) -> key of suite.run_suite(launcher_options=...): launcher.FLAGS inverted
LAUNCHER_OPTIONS = {flag.lstrip("-"): key for key, flag in LAUNCHER_FLAGS.items()}
PREPARE_FLAGS = ("name", "num_train", "num_val", "num_test", "min_length", "max_expression_length", "overwrite",
                 "resolution", "contour_length", "num_images", "images_per_batch", "workers", "seed",
                 "vocab_size", "seq_len", "num_kv_pairs", "power_a", "random_non_queries", "train_targets",
                 "noise_vocab_size", "frac_noise")
# Loggers of libraries whose INFO lines are noise for a user (orbax logs through absl's logger).
CHATTY_LOGGERS = ("absl", "orbax", "tensorstore", "tensorflow", "tensorflow_datasets", "jax")
# Config keys a command sets from its own flags: a --set of one of them would contradict the flag (the
# run would train one thing and be filed under another), so it is an error naming the flag. The suite's
# are its grid's (suite.GRID_KEYS, read by ``flag_keys``).
FLAG_KEYS = {
    "train": {"protocol": "--protocol", "task": "--task", "model.attention": "--attention", "seed": "--seed"},
    "bench": {"model.attention": "--attentions", "data.max_length": "--lengths", "batch_size": "--batch_size",
              "bench.mode": "--mode", "bench.repeats": "--repeats", "bench.warmup_steps": "--warmup_steps",
              "bench.compile_only": "--compile_only"},
}


# ----------------------------------------------------------------------------------------------------
# Value types: each returns the parsed value or raises ArgumentTypeError with the allowed range.


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
  """An integer in ``[low, high]``."""
  allowed = f"an integer >= {low}" + (f" and <= {high}" if high is not None else "")

  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected {allowed}") from None
    if value < low or (high is not None and value > high):
      raise argparse.ArgumentTypeError(f"{value} is not allowed; expected {allowed}")
    return value

  return parse


def positive_float(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected a number > 0") from None
  if not math.isfinite(value) or value <= 0:
    raise argparse.ArgumentTypeError(f"{text} is not allowed; expected a finite number > 0")
  return value


def _items(text: str, noun: str, expected: str) -> list[str]:
  """``grid.items`` (the one comma-list splitter) as an argparse type error."""
  try:
    return grid.items(text, noun, expected)
  except ValueError as err:
    raise argparse.ArgumentTypeError(str(err)) from None


def int_list(low: int, high: int | None = None, min_items: int = 1) -> Callable[[str], list[int]]:
  """A comma list of at least ``min_items`` distinct integers in ``[low, high]`` (``1024,2048``)."""
  element = int_at_least(low, high)

  def parse(text: str) -> list[int]:
    items = _items(text, "item", f"a comma list of integers >= {low}, e.g. 1,2")
    try:
      values = [element(item) for item in items]
    except argparse.ArgumentTypeError as err:
      raise argparse.ArgumentTypeError(f"in {text!r}: {err}") from None
    if len(set(values)) < min_items:
      raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected at least {min_items} different "
                                       "values")
    return values

  return parse


def names(text: str) -> str:
  """``all`` or a non-empty comma list of names (checked against the registry when the command runs)."""
  return ",".join(_items(text, "name", "'all' or a comma list of names"))


def text_value(text: str) -> str:
  if not text.strip():
    raise argparse.ArgumentTypeError("an empty value is not allowed")
  return text


def _path(text: str) -> str:
  return files.absolute(text_value(text))


def unwritable(path: str) -> str | None:
  """Why directory ``path`` cannot be created or written, or None when it can."""
  if os.path.exists(path) and not os.path.isdir(path):
    return f"{path} exists and is not a directory"
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return f"{path} cannot be created: {existing} is a file"
  if not os.access(existing, os.W_OK | os.X_OK):
    return f"{path} cannot be created or written: {existing} is not writable"
  return None


def input_dir(text: str) -> str:
  """A directory read from (made absolute; existence is the reader's check, with its own fix)."""
  path = _path(text)
  if os.path.exists(path) and not os.path.isdir(path):
    raise argparse.ArgumentTypeError(f"{path} is not a directory")
  return path


def output_dir(text: str) -> str:
  """A directory written to: checked now, so a run never fails on its output after the work is done."""
  path = _path(text)
  problem = unwritable(path)
  if problem:
    raise argparse.ArgumentTypeError(problem)
  return path


def checked_output_dir(flag: str, path: str) -> str:
  """``output_dir`` for a default path (the flag was not given): a UsageError naming the flag."""
  try:
    return output_dir(path)
  except argparse.ArgumentTypeError as err:
    raise UsageError(f"{flag} (default): {err}; pass {flag} DIR") from None


def image_file(text: str) -> str:
  """A .png or .svg file whose folder can be created and written."""
  path = _path(text)
  if os.path.splitext(path)[1].lower() not in (".png", ".svg"):
    raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected a file name ending in .png or .svg")
  if os.path.isdir(path):
    raise argparse.ArgumentTypeError(f"{path} is a directory; expected a .png or .svg file name")
  problem = unwritable(os.path.dirname(path))
  if problem:
    raise argparse.ArgumentTypeError(problem)
  return path


def sha256_hex(text: str) -> str:
  """A sha256 digest: 64 hexadecimal digits (either case)."""
  if not re.fullmatch(r"[0-9a-fA-F]{64}", text.strip()):
    raise argparse.ArgumentTypeError(f"{text!r} is not a sha256 digest; expected 64 hexadecimal digits "
                                     f"(got {len(text.strip())} characters)")
  return text.strip().lower()


def host_port(text: str) -> str:
  """``host:port`` (``[v6::addr]:port`` too), port in [1, 65535]."""
  match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(\d+)", text.strip())
  if not match or not 1 <= int(match.group(2)) <= 65535:
    raise argparse.ArgumentTypeError(f"{text!r} is not of the form host:port with a port in [1, 65535] "
                                     "(e.g. 10.0.0.1:1234)")
  return text.strip()


def override(text: str) -> str:
  if "=" not in text or not text.split("=", 1)[0].strip():
    raise argparse.ArgumentTypeError(f"{text!r} is not of the form key=value (e.g. model.num_layers=2)")
  return text


# ----------------------------------------------------------------------------------------------------
# The parser


class BoolFlag(argparse.Action):
  """An absl-style boolean: ``--name`` sets it, ``--noname`` clears it."""

  def __init__(self, option_strings, dest, default=None, help=None):  # noqa: A002 - argparse's name
    self.positive = tuple(option_strings)
    super().__init__([*option_strings, *("--no" + s[2:] for s in option_strings)], dest, nargs=0,
                     default=default, help=help)

  def __call__(self, parser, namespace, values, option_string=None):
    setattr(namespace, self.dest, option_string in self.positive)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """Shows a flag's default unless it is None or empty (those helps say what happens instead)."""

  def _get_help_string(self, action):
    if action.default is None or action.default == [] or action.default is argparse.SUPPRESS:
      return action.help
    return super()._get_help_string(action)


class Parser(argparse_flags.ArgumentParser):
  """absl's argparse parser, with every error as one line: the flag, the value, the allowed range."""

  def error(self, message: str):
    message = re.sub(r"^argument ", "", message)
    choice = re.match(r"(COMMAND|SUBCOMMAND): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if choice:
      words = self.prog.split()[1:] + [choice.group(2)]
      message = f"unknown command {' '.join(words)!r}; commands: {choice.group(3)}"
    self.exit(2, f"error: {message} ({self.prog} --help shows the usage)\n")


def _command(commands, name: str, summary: str, handler: Callable[[argparse.Namespace], Any],
             common: argparse.ArgumentParser, **kwargs) -> argparse.ArgumentParser:
  parser = commands.add_parser(name, help=summary, description=summary, parents=[common],
                               formatter_class=HelpFormatter, **kwargs)
  parser.set_defaults(handler=handler, parser=parser)
  return parser


def _group(commands, name: str, summary: str) -> argparse._SubParsersAction:
  parser = commands.add_parser(name, help=summary, description=summary, formatter_class=HelpFormatter)
  return parser.add_subparsers(metavar="SUBCOMMAND", required=True, parser_class=Parser)


def _add_data_dir(parser: argparse.ArgumentParser, kind: Callable[[str], str] = input_dir) -> None:
  parser.add_argument("--data_dir", type=kind, help="data root (default: $LRA_DATA_DIR or ~/lra_data)")
  parser.set_defaults(data_dir_kind=kind)  # the default (the environment's) gets the same check


def _add_overrides(parser: argparse.ArgumentParser, what: str) -> None:
  parser.add_argument("--set", type=override, action="append", default=[], metavar="KEY=VALUE",
                      help=f"config override, repeatable, applied to {what} (e.g. model.num_layers=2)")


def _add_list(commands, common) -> None:
  p = _command(commands, "list", "list the registered attentions, tasks and protocols", _list, common)
  p.add_argument("what", nargs="?", help=f"one listing only: {', '.join(LISTINGS)}")


def _positive_float(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
  if not value > 0 or value == float("inf"):
    raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
  return value


def _fraction(text: str) -> float:
  """A number in [0, 1) (``--frac_noise``)."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
  if not 0 <= value < 1:
    raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
  return value


def _truth(text: str) -> bool:
  words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
  if text.lower() not in words:
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
  return words[text.lower()]


def _prepare_type(option: str) -> Callable[[str], int]:
  """The type of a ``data prepare`` count flag: its range in ``tasks.base.PREPARE_RANGES``."""
  return int_at_least(*PREPARE_RANGES[option])


def _add_data(commands, common) -> None:
  data = _group(commands, "data", "make or check the data of a task (data prepare TASK, data download)")
  p = _command(data, "prepare", "generate (ListOps, Pathfinder, Path-X) or check (Text, Retrieval, Image) "
               "the data of TASK", _prepare, common)
  p.add_argument("task", metavar="TASK", help="task name (lra-bench list tasks)")
  p.add_argument("--protocol", type=text_value, help="take the options from this protocol's data.prepare "
                 "(flags below override them)")
  _add_data_dir(p, output_dir)
  p.add_argument("--seed", type=_prepare_type("seed"), help="generator seed (default: the task's, 0)")
  p.add_argument("--name", type=text_value, help="ListOps: file name prefix (basic_*.tsv); "
                 "Pathfinder: sub-folder")
  for split in ("train", "val", "test"):
    p.add_argument(f"--num_{split}", type=_prepare_type(f"num_{split}"), help=f"ListOps: generated {split} examples")
  p.add_argument("--min_length", type=_prepare_type("min_length"), help="ListOps: keep expressions longer "
                 "than this (tokens)")
  p.add_argument("--max_expression_length", type=_prepare_type("max_expression_length"),
                 help="ListOps: keep expressions shorter than this (tokens; the model's length is data.max_length)")
  p.add_argument("--overwrite", action=BoolFlag, help="regenerate data that already exists")
  p.add_argument("--resolution", type=_prepare_type("resolution"), help="Pathfinder: image side (32, 64, 128, 256)")
  p.add_argument("--contour_length", type=_prepare_type("contour_length"),
                 help="Pathfinder: 6 (easy), 9 (intermediate), 14 (hard)")
  p.add_argument("--num_images", type=_prepare_type("num_images"), help="Pathfinder: images to make "
                 "(release: 200000)")
  p.add_argument("--images_per_batch", type=_prepare_type("images_per_batch"),
                 help="Pathfinder: images per imgs/<batch> folder")
  p.add_argument("--workers", type=_prepare_type("workers"), help="Pathfinder: generator processes (default: "
                 "all cores)")
  p.add_argument("--vocab_size", type=_prepare_type("vocab_size"), help="recall tasks: the original's "
                 "vocabulary (MQAR 8192; the tokens get ids + 1, 0 is padding)")
  p.add_argument("--seq_len", type=_prepare_type("seq_len"), help="recall tasks: sequence length")
  p.add_argument("--num_kv_pairs", type=_prepare_type("num_kv_pairs"), help="MQAR: key-value pairs (queries) "
                 "per example")
  p.add_argument("--power_a", type=_positive_float, help="MQAR: the query gaps' power law exponent a (0.01)")
  p.add_argument("--random_non_queries", type=_truth, metavar="True|False",
                 help="MQAR: fillers drawn uniformly from the vocabulary instead of 0")
  p.add_argument("--noise_vocab_size", type=_prepare_type("noise_vocab_size"), help="noisy_in_context_recall: "
                 "noise tokens at the top of the vocabulary (16)")
  p.add_argument("--frac_noise", type=_fraction, help="noisy_in_context_recall: probability that a slot holds "
                 "two noise tokens instead of a key and its value (0.2)")
  p.add_argument("--train_targets", choices=("all", "last"), help="assoc_recall, induction_head: labels of "
                 "the training split (all next tokens, the original; or the answer only)")
  p = _command(data, "download", "download and unpack the official LRA release tarball", _download, common)
  p.add_argument("what", choices=("lra-release",), help="what to download")
  _add_data_dir(p, output_dir)
  p.add_argument("--url", type=text_value, help="URL of the LRA tarball (default: the official one)")
  p.add_argument("--sha256", type=sha256_hex, help="expected sha256 of the tarball (64 hex digits)")


def _add_train(commands, common) -> None:
  p = _command(commands, "train", "train and evaluate one model (one task, attention, protocol, seed)",
               _train, common)
  p.add_argument("--task", type=text_value, required=True, help="task name (lra-bench list tasks)")
  p.add_argument("--attention", type=text_value, default="vanilla", help="attention core (lra-bench list)")
  p.add_argument("--protocol", type=text_value, default="lra", help="protocol preset in configs/")
  p.add_argument("--seed", type=int_at_least(0, MAX_SEED), default=0, help="run seed: parameters, dropout, "
                 "data order")
  p.add_argument("--workdir", type=output_dir, help="run directory: checkpoints, summaries, result.json "
                 "(default: runs/<protocol>/<task>/<attention>_seed<seed>)")
  _add_data_dir(p)
  p.add_argument("--results_dir", type=output_dir, help="also append the record to "
                 "<results_dir>/results.jsonl")
  _add_overrides(p, "the run")
  p.add_argument("--pretrain", type=text_value, metavar="none|masked|causal", help="self-pretrain the encoder "
                 "on the task's training inputs first (masked denoising, or next-token prediction for a causal "
                 "model), then fine-tune the classifier from it; = --set pretrain.objective=... (default: none)")
  p.add_argument("--pretrain_workdir", type=output_dir, help="the pretraining run's directory (default: "
                 "<workdir>/pretrain); a finished pretraining there is reused")
  p.add_argument("--force", action=BoolFlag, default=False, help="rerun a finished run from scratch")
  # multi-host (lra_bench/training/parallel.py); unset = one process unless the environment says otherwise
  p.add_argument("--coordinator_address", type=host_port, help="multi-host: host:port of process 0")
  p.add_argument("--num_processes", type=int_at_least(1), help="multi-host: number of processes")
  p.add_argument("--process_id", type=int_at_least(0), help="multi-host: index of this process")
  p.add_argument("--distributed", action=BoolFlag, help="multi-host: force (--nodistributed: forbid) "
                 "jax.distributed.initialize() with the cluster auto-detected (TPU pod, Slurm, Open MPI)")


def _add_suite(commands, common) -> None:
  p = _command(commands, "suite", "train every task x attention x seed cell not done yet (resumable)",
               _suite, common, conflict_handler="resolve")  # its --log_dir replaces absl's
  p.add_argument("--protocol", type=text_value, default="smoke", help="protocol preset in configs/")
  p.add_argument("--tasks", type=names, default="all", help="'all' or a comma list of tasks")
  p.add_argument("--attentions", type=names, default="all", help="'all' or a comma list of attentions")
  p.add_argument("--seeds", type=int_list(0, MAX_SEED), default="0", help="comma list of seeds")
  p.add_argument("--results_dir", type=output_dir, required=True, help="records (results.jsonl), runs, locks")
  _add_data_dir(p)
  _add_overrides(p, "every cell")
  p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                 help="repeatable: every cell once per value (all combinations of several --sweep); adds "
                      "to or replaces the protocol's own sweep of that key (the recall protocols sweep "
                      "optimizer.learning_rate); a --set of the key fixes it instead")
  p.add_argument("--pretrain", type=names, help="comma list of none, masked, causal: every cell once per "
                 "value (from scratch, or fine-tuned after self-pretraining; a pretraining is run once per "
                 "task, attention, seed and pretraining config, and shared)")
  p.add_argument("--isolate", action=BoolFlag, default=False, help="run each cell in a fresh subprocess")
  p.add_argument("--retry_failed", action=BoolFlag, default=True, help="rerun cells whose last record is "
                 "'failed' (--noretry_failed leaves them)")
  p.add_argument("--launcher", choices=LAUNCHERS, default="inprocess", help="where cells run: this process, "
                 "local worker processes, or a Slurm array (submitit)")
  p.add_argument("--workers", type=int_at_least(1), help="local/slurm: cells run at once (default: the "
                 "launcher's)")
  p.add_argument("--partition", type=text_value, help="slurm: partition")
  p.add_argument("--gpus_per_task", type=int_at_least(0), help="slurm: GPUs per cell")
  p.add_argument("--time_limit", type=int_at_least(1), metavar="MIN", help="slurm: minutes per cell")
  p.add_argument("--array_size", type=int_at_least(1), help="slurm: array tasks running at once")
  p.add_argument("--cpus_per_task", type=int_at_least(1), help="slurm: CPUs per cell")
  p.add_argument("--log_dir", type=output_dir, help="local/slurm: worker logs (default: the launcher's)")


def _add_bench(commands, common) -> None:
  p = _command(commands, "bench",
               "time the LRA Table 2 model (or one attention core alone): steps/s, memory and FLOPs per length",
               _bench, common)
  p.add_argument("--lengths", type=int_list(1), default="1024,2048,3072,4096,8192,16384",
                 help="comma list of sequence lengths")
  p.add_argument("--attentions", type=names, default="all", help="'all' or a comma list of attentions")
  p.add_argument("--batch_size", type=int_at_least(1), default=32, help="batch size (LRA Table 2: 32)")
  p.add_argument("--mode", choices=MODES, default="train",
                 help="train: the model's train step; inference: its forward pass; "
                      "core: the attention core alone, forward + backward; core_forward: the same core's "
                      "forward only (deterministic=False, as core)")
  p.add_argument("--repeats", type=int_at_least(1), default=10, help="timed steps per point (median, IQR)")
  p.add_argument("--warmup_steps", type=int_at_least(0), default=2, help="untimed steps after compilation")
  p.add_argument("--compile_only", action=BoolFlag, default=False, help="XLA FLOPs and compiled memory "
                 "only, no timing")
  p.add_argument("--compile_only_from", type=int_at_least(1), help="lengths >= this are compiled only")
  p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per point before it is "
                 "recorded as failed")
  p.add_argument("--isolate", action=BoolFlag, default=True, help="each point in a fresh subprocess "
                 "(--noisolate: in this process)")
  p.add_argument("--workers", type=int_at_least(1), default=1, help="processes side by side, the attentions "
                 "dealt to them in turn (each logs to <results_dir>/bench_worker<k>.log; this one shows the "
                 "progress of all)")
  p.add_argument("--kwargs_of", metavar="PROTOCOL", help="time each layer in the form PROTOCOL trains it: "
                 "its attention_kwargs from that protocol's attention_settings (cpu: the modern recurrences' "
                 "token-by-token form)")
  p.add_argument("--results_dir", type=output_dir, required=True, help="records go to results.jsonl here")
  _add_overrides(p, "every point")


def _add_report(commands, common) -> None:
  p = _command(commands, "report", "write tables, plots and index.md from the records", _report, common)
  p.add_argument("--results_dir", type=_path, required=True,  # _report checks it (file, missing, empty)
                 help="folder with results.jsonl")
  p.add_argument("--out", type=output_dir, help="output directory (default: <results_dir>/report)")
  p.add_argument("--reference_dir", type=_path,
                 help="published numbers (default: the package's own, lra_bench/report/published)")
  p.add_argument("--length", type=int_at_least(1), default=64, help="sequence length of the "
                 "effective-attention probe")
  p.add_argument("--patterns", type=names, default="none", help="the attentions whose effective-attention "
                 "patterns are drawn into attention_patterns.png, for a study about them: 'all' (every "
                 "registered one, ~1 s each on a CPU), a comma list, or 'none'")


def _add_viz(commands, common) -> None:
  viz = _group(commands, "viz", "draw things (viz attention NAME)")
  p = _command(viz, "attention", "draw the effective attention matrix of one core", _viz, common)
  p.add_argument("name", metavar="NAME", help="attention core (lra-bench list attentions)")
  p.add_argument("--length", type=int_at_least(1), default=64, help="sequence length of the probe")
  p.add_argument("--out", type=image_file, help="output file, .png or .svg (default: "
                 "./attention_<NAME>_L<length>.png)")


def _add_check(commands, common) -> None:
  p = _command(commands, "check", "conformance, cost and learnability of one attention core (exit 1 when a "
               "property fails)", _check, common)
  p.add_argument("name", metavar="NAME", help="attention core (lra-bench list attentions)")
  p.add_argument("--lengths", type=int_list(1, min_items=2), default="256,512",
                 help="lengths of the cost fit (two or more)")
  p.add_argument("--out", type=output_dir, help="write the table and the heatmap here")
  p.add_argument("--steps", type=int_at_least(1), help="training steps of the learnability run "
                 "(default: the smoke ListOps cell's)")
  _add_data_dir(p)
  p.add_argument("--quick", action=BoolFlag, default=False,
                 help="conformance table only: no timing, heatmap or training")


def _add_new(commands, common) -> None:
  new = _group(commands, "new", "scaffold new code (new attention NAME)")
  p = _command(new, "attention", "write a ready-to-edit attention core and its test", _new_attention, common)
  p.add_argument("name", metavar="NAME", help="registry name of the new core, e.g. my_attention")
  p.add_argument("--dir", type=output_dir, default=".", help="folder to write the two files in")
  p.add_argument("--style", choices=("linen", "nnx", "function"), default="linen",
                 help="how the core is written: a flax.linen module, a flax.nnx module, or a plain "
                 "parameter-free function of (query, key, value, mask)")


def build_parser() -> Parser:
  """The whole command tree: one subparser per command, each with only the flags it uses."""
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument("--plugin", action="append", default=[], metavar="MODULE", type=text_value,
                      help="import this module first, so the attentions it registers exist (repeatable; "
                      "also $LRA_BENCH_PLUGINS and the lra_bench.attentions entry points)")
  top = Parser(prog="lra-bench", description="lra-bench: the Long-Range Arena harness (JAX/Flax/Optax).\n"
               "`lra-bench COMMAND --help` shows a command's flags; --verbosity 1 on any command also\n"
               "shows the libraries' INFO logs (--helpfull lists absl's flags).",
               epilog=START, formatter_class=HelpFormatter)
  top.add_argument("--plugin", action="append", default=[], dest="top_plugins", metavar="MODULE",
                   type=text_value, help="as the commands' --plugin (repeatable)")
  commands = top.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True,
                                parser_class=Parser)
  for add in (_add_list, _add_data, _add_train, _add_suite, _add_bench, _add_report, _add_viz, _add_check,
              _add_new):
    add(commands, common)
  return top


def parse(argv: list[str]) -> argparse.Namespace:
  """``app.run``'s flags_parser: the namespace of ``argv`` (exits 2 with one line on a bad value)."""
  args, extra = build_parser().parse_known_args(argv[1:])
  if extra:  # named by the command's parser, which knows which flags it does take
    args.parser.error(f"{args.parser.prog}: unrecognized arguments: {' '.join(extra)}")
  del args.parser
  args.verbose = not flags.FLAGS["verbosity"].using_default_value  # before app.run bumps it to INFO
  return args


# ----------------------------------------------------------------------------------------------------
# The commands


def _data_dir(args: argparse.Namespace) -> str:
  """``--data_dir``, else ``$LRA_DATA_DIR`` or ``~/lra_data`` checked as the flag would be (``~`` expanded)."""
  from tasks.base import default_data_dir

  if args.data_dir:
    return args.data_dir
  where = "$LRA_DATA_DIR" if os.environ.get("LRA_DATA_DIR") else "the default data dir (~/lra_data)"
  try:
    return args.data_dir_kind(default_data_dir())
  except argparse.ArgumentTypeError as err:
    raise UsageError(f"{where}: {err}; point LRA_DATA_DIR at a directory or pass --data_dir DIR") from None


def flag_keys(command: str) -> dict[str, str]:
  """Config key -> the flag of ``command`` that sets it (``FLAG_KEYS``; the suite's: its grid's)."""
  if command == "suite":
    from lra_bench.experiments import suite

    return dict(suite.GRID_KEYS)
  return FLAG_KEYS[command]


def check_overrides(command: str, overrides: list[str]) -> None:
  """A ConfigError for a ``--set`` of a key that ``command`` sets from its own flag (``flag_keys``)."""
  keys = flag_keys(command)
  for item in overrides:
    key = item.split("=", 1)[0].strip()
    flag = keys.get(key)
    if flag:
      raise ConfigError(f"--set {item}: {key} has its own flag; use {flag} instead of --set")


def _list(args: argparse.Namespace) -> str:
  import attention_zoo
  import tasks
  from lra_bench.training import config

  listing = {"attentions": attention_zoo.list_attentions, "mixers": attention_zoo.list_mixers,
             "tasks": tasks.list_tasks,
             "protocols": config.list_protocols}
  if args.what is None:
    return "\n".join(f"{name + ':':11} {', '.join(known())}" for name, known in listing.items())
  if args.what not in listing:
    raise ValueError(f"unknown listing {args.what!r}; expected one of {', '.join(listing)}")
  return "\n".join(listing[args.what]())


def _prepare(args: argparse.Namespace) -> str:
  """``data prepare``: what ``tasks.plan.preparations`` plans from the data sections of the protocol's runs
  (if one is named) and the flags."""
  import tasks
  from lra_bench.training import config
  from tasks import plan

  task = tasks.get_task(args.task)
  given = [name for name in PREPARE_FLAGS if getattr(args, name) is not None]
  taken = [name for name in PREPARE_FLAGS if name in task.prepare_options()]
  for name in given:
    if name not in taken:
      takes = f"its flags: {', '.join('--' + n for n in taken)}" if taken else "it takes none of these flags"
      raise UsageError(f"data prepare {args.task}: --{name} does not apply to {args.task}; {takes}")
  presets = [{}]
  if args.protocol:  # the data of every run of the protocol (its sweep's points)
    presets = [run.data.prepare.to_dict() for run in config.protocol_runs(args.protocol, args.task)]
  merged = plan.preparations(args.task, presets, {name: getattr(args, name) for name in given}, args.protocol)
  for options in merged:  # before anything is logged or written
    config.validate_prepare(options)  # the merged options: each flag passed alone, not all together
  paths = []
  for options in merged:
    logging.info("preparing %s in %s with %s", args.task, _data_dir(args), options or "defaults")
    try:
      paths.append(task.prepare(_data_dir(args), **options))
    except TypeError as err:  # an option this task does not take
      raise ConfigError(f"data prepare {args.task}: {err}") from None
  return "\n".join(dict.fromkeys(paths))


def _download(args: argparse.Namespace) -> str:
  from tasks import download

  path = download.download_lra_release(_data_dir(args), url=args.url or download.LRA_RELEASE_URL,
                                       sha256=args.sha256)
  return f"LRA release in {path}"


def _train(args: argparse.Namespace) -> int:
  from lra_bench.experiments import cell
  from lra_bench.training import config, parallel

  check_overrides("train", args.set)
  data_dir = _data_dir(args)
  if args.process_id is not None and args.num_processes is None:
    raise UsageError(f"--process_id {args.process_id} needs --num_processes (the number of "
                     "processes of the run)")
  sets = [*([f"pretrain.objective={args.pretrain}"] if args.pretrain else []), *args.set]
  run_config = config.load_config(args.protocol, args.task, sets, attention=args.attention, seed=args.seed)
  workdir = args.workdir or checked_output_dir(
      "--workdir", os.path.join("runs", args.protocol, args.task, f"{args.attention}_seed{args.seed}"))
  parallel.initialize(args.coordinator_address, args.num_processes, args.process_id, args.distributed)
  record = cell.train_cell(run_config, workdir, data_dir, args.results_dir, force=args.force,
                           pretrain_workdir=args.pretrain_workdir)
  if record["status"] != "ok":
    print(f"error: run {record['status']}: {record['error']}", file=sys.stderr)
    return 1
  print(f"test accuracy {record['test_accuracy']:.4f} (best validation {record['best_val_accuracy']:.4f} "
        f"at step {record['best_step']}); result in {os.path.join(record['workdir'], 'result.json')}")
  return 0


def _launcher_kwargs(args: argparse.Namespace) -> dict[str, Any]:
  """``launcher``/``launcher_options`` for run_suite, only when asked for (the default runs as before)."""
  options = {key: getattr(args, flag) for flag, key in LAUNCHER_OPTIONS.items()}
  if args.launcher == "inprocess" and all(value is None for value in options.values()):
    return {}
  return {"launcher": args.launcher, "launcher_options": options}


def _suite(args: argparse.Namespace) -> int:
  from lra_bench.experiments import suite

  check_overrides("suite", args.set)
  summary = suite.run_suite(args.protocol, args.tasks, args.attentions, args.seeds,
                            results_dir=args.results_dir, data_dir=_data_dir(args), overrides=args.set,
                            isolate=args.isolate, retry_failed=args.retry_failed,
                            sweeps=suite.parse_sweeps(args.sweep, pretrain=args.pretrain),
                            **_launcher_kwargs(args))
  print("\n".join(summary.lines()))
  return summary.exit_code()  # 1: a cell failed or was left unfinished (CI sees it)


def _bench(args: argparse.Namespace) -> str:
  from lra_bench.experiments import bench

  check_overrides("bench", args.set)
  if args.compile_only and args.compile_only_from is not None:
    raise UsageError(f"--compile_only compiles every length and --compile_only_from {args.compile_only_from} "
                     "only the lengths from there on; give one of them")
  summary = bench.run_bench(args.lengths, args.attentions, results_dir=args.results_dir,
                            batch_size=args.batch_size, mode=args.mode, warmup_steps=args.warmup_steps,
                            repeats=args.repeats, compile_only=args.compile_only,
                            compile_only_from=args.compile_only_from, timeout_s=args.timeout,
                            isolate=args.isolate, overrides=args.set, workers=args.workers,
                            kwargs_of=args.kwargs_of)
  return "\n".join(summary.lines())


def _report(args: argparse.Namespace) -> str:
  from lra_bench.experiments import results
  from lra_bench.report import index, summary
  from lra_bench.training import steps, xla_stats

  records = os.path.join(args.results_dir, results.RESULTS_FILE)
  if os.path.exists(args.results_dir) and not os.path.isdir(args.results_dir):
    raise UsageError(f"--results_dir: {args.results_dir} is a file, not a directory; pass the folder that "
                     f"holds {results.RESULTS_FILE}")
  if not os.path.isdir(args.results_dir):
    raise UsageError(f"--results_dir: {args.results_dir} does not exist; run lra-bench suite or bench "
                     "with this --results_dir first")
  if not os.path.isfile(records) or not os.path.getsize(records):
    raise UsageError(f"--results_dir: {args.results_dir} has no records ({results.RESULTS_FILE} is "
                     "missing or empty); run lra-bench suite or bench with this --results_dir first")
  problem = index.reference_problem(args.reference_dir)
  if problem:
    raise UsageError(f"--reference_dir: {problem}")
  patterns = []
  if args.patterns != "none":
    import attention_zoo

    try:  # 'all' or the named ones, each checked against the registry
      patterns = grid.parse_names(args.patterns, attention_zoo.list_attentions(), "attention")
    except ValueError as err:
      raise UsageError(f"--patterns: {err}") from None
  out = args.out or checked_output_dir("--out", os.path.join(args.results_dir, "report"))
  # The heatmaps' probe compiled as every other program of the package (and refused where it cannot fit).
  paths = index.write_report(args.results_dir, out, reference_dir=args.reference_dir,
                             attention_length=args.length, attention_names=patterns,
                             command="lra-bench " + " ".join(map(shlex.quote, sys.argv[1:])),
                             attention_compiler=steps.compile_run_once, attention_fits=xla_stats.check_fits,
                             progress=True)
  with open(os.path.join(out, summary.FILE), encoding="utf-8") as f:  # what index.md opens with
    headline = f.read().rstrip("\n")
  return f"{headline}\n\nwrote {len(paths)} files; start at {os.path.join(out, 'index.md')}"


def _viz(args: argparse.Namespace) -> str:
  from lra_bench.report import viz
  from lra_bench.training import steps, xla_stats

  return "\n".join(viz.plot_attention(args.name, args.out or viz.default_out(args.name, args.length),
                                      args.length, compiler=steps.compile_run_once, fits=xla_stats.check_fits))


def _check(args: argparse.Namespace) -> int:
  from lra_bench import check

  return check.run_check(args.name, lengths=list(args.lengths), out=args.out, steps=args.steps,
                         data_dir=_data_dir(args), quick=args.quick)


def _new_attention(args: argparse.Namespace) -> str:
  from lra_bench import scaffold

  style = {} if args.style == "linen" else {"style": args.style}  # the default needs no keyword
  return scaffold.new_attention(args.name, args.dir, **style)


# ----------------------------------------------------------------------------------------------------
# Entry point


def _load_plugins(modules: list[str]) -> None:
  """``attention_zoo.load_plugins``: the flag's modules, $LRA_BENCH_PLUGINS, the entry points."""
  import attention_zoo

  attention_zoo.load_plugins(list(modules))


def quiet_logs(verbose: bool) -> None:
  """Third-party INFO chatter (orbax, TFDS, absl) off unless ``--verbosity`` was given; ours stays."""
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
  if not verbose:
    for name in CHATTY_LOGGERS:
      logging.getLogger(name).setLevel(logging.WARNING)


def exit_code(err: Exception) -> int | None:
  """The exit status of an error whose message is for the user (printed as one line), else None (its
  traceback is shown). Every ``errors.UserError`` is a ``ValueError`` and carries its ``exit_code``; so are
  the zoo's and the tasks' errors for the user (``PluginError``, ``DataError``), and a bad value anywhere."""
  if isinstance(err, (ValueError, TypeError)):
    return getattr(err, "exit_code", 2)
  return None


def main(args: argparse.Namespace) -> int:
  from tasks import MissingDataError

  quiet_logs(args.verbose)
  try:
    _load_plugins([*args.top_plugins, *args.plugin])
    result = args.handler(args)
  except MissingDataError as err:  # one line: what is missing and the command that makes it
    print("error: no data: " + " ".join(line.strip() for line in str(err).splitlines()), file=sys.stderr)
    return 1
  except KeyboardInterrupt as err:  # Ctrl-C: where it stopped (a run says its step), not a traceback
    print(f"error: {err or 'interrupted; rerun the same command to resume'}", file=sys.stderr)
    return 130
  except Exception as err:
    code = exit_code(err)
    if code is None:
      raise
    print(f"error: {err}", file=sys.stderr)
    return code
  if isinstance(result, int):
    return result
  print(result)
  return 0


def run() -> None:
  """Console-script entry point."""
  app.run(main, flags_parser=parse)


if __name__ == "__main__":
  run()
