"""The ``lra-bench`` command line: flags, and one call into a wing per command.

  lra-bench list [attentions|tasks|protocols]
  lra-bench data prepare <task> [--protocol smoke] [--num_train N ...] [--data_dir DIR]
  lra-bench data prepare pathfinder --resolution 32 --contour_length 14 --num_images N --seed S
  lra-bench data download lra-release [--data_dir DIR] [--url URL] [--sha256 HEX]
  lra-bench train --task listops --attention vanilla --protocol smoke --seed 0 --workdir DIR
  lra-bench suite --protocol smoke --tasks all --attentions all --seeds 0,1,2 --results_dir DIR
  lra-bench bench --lengths 1024,2048,4096 --attentions all --batch_size 32 --mode train --results_dir DIR
  lra-bench report --results_dir DIR --out DIR
  lra-bench viz attention NAME [--length 64] [--out FILE.png|.svg]
"""

from __future__ import annotations

import logging
import os
import shlex
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

from tasks.base import default_data_dir  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("task", None, "Task name (lra-bench list).")
flags.DEFINE_string("attention", "vanilla", "Attention core name (lra-bench list).")
flags.DEFINE_string("protocol", None, "Protocol preset in configs/ (train default: lra).")
flags.DEFINE_integer("seed", 0, "Run seed: parameters, dropout, data order.")
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, summaries, result.json).")
flags.DEFINE_string("data_dir", None, "Data root (default $LRA_DATA_DIR or ~/lra_data).")
flags.DEFINE_string("results_dir", None, "Also append the record to <results_dir>/results.jsonl.")
flags.DEFINE_multi_string("set", [], "Config override key=value (repeatable), e.g. model.num_layers=2.")
flags.DEFINE_bool("force", False, "Rerun a finished run from scratch.")
# multi-host (lra_bench/training/parallel.py); unset = one process unless the environment says otherwise
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0 (jax.distributed).")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: index of this process.")
flags.DEFINE_bool("distributed", None, "Multi-host: force (or forbid) jax.distributed.initialize() with "
                  "the cluster auto-detected (Cloud TPU pod slices, Slurm, Open MPI).")
# data prepare options (None = the task's / protocol's default)
flags.DEFINE_string("name", None, "ListOps: file name prefix (basic_*.tsv); Pathfinder: sub-folder.")
flags.DEFINE_integer("num_train", None, "Generated training examples.")
flags.DEFINE_integer("num_val", None, "Generated validation examples.")
flags.DEFINE_integer("num_test", None, "Generated test examples.")
flags.DEFINE_integer("min_length", None, "ListOps: keep expressions longer than this.")
flags.DEFINE_integer("max_length", None, "ListOps: keep expressions shorter than this.")
flags.DEFINE_bool("overwrite", None, "Regenerate data that already exists.")
flags.DEFINE_integer("resolution", None, "Pathfinder: image side (32, 64, 128, 256).")
flags.DEFINE_integer("contour_length", None, "Pathfinder: 6 (easy), 9 (intermediate), 14 (hard).")
flags.DEFINE_integer("num_images", None, "Pathfinder: images to generate (release: 200000).")
flags.DEFINE_integer("images_per_batch", None, "Pathfinder: images per imgs/<batch> folder.")
flags.DEFINE_integer("workers", None, "Pathfinder: generator processes (default: all cores).")
flags.DEFINE_string("url", None, "data download: URL of the LRA tarball (default: the official one).")
flags.DEFINE_string("sha256", None, "data download: expected sha256 of the tarball.")

# suite
flags.DEFINE_string("tasks", "all", "suite: 'all' or a comma list of tasks.")
flags.DEFINE_string("attentions", "all", "suite/bench: 'all' or a comma list of attentions.")
flags.DEFINE_string("seeds", "0", "suite: comma list of seeds.")
flags.DEFINE_bool("isolate", None, "suite: each cell in a fresh subprocess (default: in-process); "
                  "bench: each point in a fresh subprocess (default: yes).")
flags.DEFINE_bool("retry_failed", True, "suite: rerun cells whose last record is 'failed'.")
# bench
flags.DEFINE_string("lengths", "1024,2048,3072,4096,8192,16384", "bench: comma list of sequence lengths.")
flags.DEFINE_integer("batch_size", 32, "bench: batch size (LRA Table 2: 32).")
flags.DEFINE_enum("mode", "train", ["train", "inference"], "bench: train step or forward only.")
flags.DEFINE_integer("repeats", 10, "bench: timed steps per point (median and IQR reported).")
flags.DEFINE_integer("warmup_steps", 2, "bench: untimed steps after compilation.")
flags.DEFINE_bool("compile_only", False, "bench: XLA FLOPs and compiled memory only, no timing.")
flags.DEFINE_integer("compile_only_from", None, "bench: lengths >= this are compiled only.")
flags.DEFINE_float("timeout", 600.0, "bench: seconds per point before it is recorded as failed.")
# report / viz
flags.DEFINE_string("out", None, "report: output directory (default <results_dir>/report); "
                    "viz: output file (.png or .svg).")
flags.DEFINE_string("reference_dir", None, "report: published numbers (default reports/reference).")
flags.DEFINE_integer("length", 64, "viz / report: sequence length of the effective-attention probe.")

PREPARE_FLAGS = ("name", "num_train", "num_val", "num_test", "min_length", "max_length", "overwrite",
                 "resolution", "contour_length", "num_images", "images_per_batch", "workers")

USAGE = __doc__


def _data_dir() -> str:
  return FLAGS.data_dir or default_data_dir()


def _list(what: str | None) -> str:
  import attention_zoo
  import tasks
  from lra_bench.training import config

  listing = {"attentions": attention_zoo.list_attentions, "tasks": tasks.list_tasks,
             "protocols": config.list_protocols}
  if what is None:
    return "\n".join(f"{name + ':':11} {', '.join(names())}" for name, names in listing.items())
  if what not in listing:
    raise ValueError(f"unknown listing {what!r}; expected one of {', '.join(listing)}")
  return "\n".join(listing[what]())


def _prepare(task_name: str) -> str:
  """``data prepare``: the protocol's ``data.prepare`` options (if one is named), updated by the flags."""
  import tasks
  from lra_bench.training import config

  task = tasks.get_task(task_name)
  options = config.load_config(FLAGS.protocol, task_name).data.prepare.to_dict() if FLAGS.protocol else {}
  options.update({name: FLAGS[name].value for name in PREPARE_FLAGS if FLAGS[name].value is not None})
  if FLAGS["seed"].present:
    options["seed"] = FLAGS.seed
  logging.info("preparing %s in %s with %s", task_name, _data_dir(), options or "defaults")
  try:
    return task.prepare(_data_dir(), **options)
  except TypeError as err:  # an option this task does not take
    raise config.ConfigError(f"data prepare {task_name}: {err}") from None


def _download() -> str:
  from tasks import download

  path = download.download_lra_release(_data_dir(), url=FLAGS.url or download.LRA_RELEASE_URL,
                                       sha256=FLAGS.sha256)
  return f"LRA release in {path}"


def _train() -> int:
  from lra_bench.experiments import cell
  from lra_bench.training import config, parallel

  if not FLAGS.task:
    raise config.ConfigError("train needs --task (lra-bench list shows the tasks)")
  parallel.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id, FLAGS.distributed)
  protocol = FLAGS.protocol or "lra"
  run_config = config.load_config(protocol, FLAGS.task, FLAGS.set, attention=FLAGS.attention, seed=FLAGS.seed)
  workdir = FLAGS.workdir or os.path.join("runs", protocol, FLAGS.task, f"{FLAGS.attention}_seed{FLAGS.seed}")
  record = cell.train_cell(run_config, workdir, _data_dir(), FLAGS.results_dir, force=FLAGS.force)
  if record["status"] != "ok":
    print(f"error: run {record['status']}: {record['error']}", file=sys.stderr)
    return 1
  print(f"test accuracy {record['test_accuracy']:.4f} (best validation {record['best_val_accuracy']:.4f} "
        f"at step {record['best_step']}); result in {os.path.join(record['workdir'], 'result.json')}")
  return 0


def _suite() -> str:
  from lra_bench.experiments import suite

  summary = suite.run_suite(FLAGS.protocol or "smoke", FLAGS.tasks, FLAGS.attentions, FLAGS.seeds,
                            results_dir=_required("results_dir", "suite"), data_dir=_data_dir(),
                            overrides=FLAGS.set, isolate=bool(FLAGS.isolate), retry_failed=FLAGS.retry_failed)
  return "\n".join(summary.lines())


def _bench() -> str:
  from lra_bench.experiments import bench

  summary = bench.run_bench(FLAGS.lengths, FLAGS.attentions, results_dir=_required("results_dir", "bench"),
                            batch_size=FLAGS.batch_size, mode=FLAGS.mode, warmup_steps=FLAGS.warmup_steps,
                            repeats=FLAGS.repeats, compile_only=FLAGS.compile_only,
                            compile_only_from=FLAGS.compile_only_from, timeout_s=FLAGS.timeout,
                            isolate=FLAGS.isolate is not False, overrides=FLAGS.set)
  return "\n".join(summary.lines())


def _report() -> str:
  from lra_bench.report import index

  results_dir = _required("results_dir", "report")
  out = FLAGS.out or os.path.join(results_dir, "report")
  paths = index.write_report(results_dir, out, reference_dir=FLAGS.reference_dir,
                             attention_length=FLAGS.length,
                             command="lra-bench " + " ".join(map(shlex.quote, sys.argv[1:])))
  return f"wrote {len(paths)} files; start at {os.path.join(out, 'index.md')}"


def _viz(name: str) -> str:
  from lra_bench.report import viz

  return "\n".join(viz.plot_attention(name, FLAGS.out or viz.default_out(name, FLAGS.length), FLAGS.length))


def _required(flag: str, command: str) -> str:
  from lra_bench.training.config import ConfigError

  if not FLAGS[flag].value:
    raise ConfigError(f"{command} needs --{flag}")
  return FLAGS[flag].value


def _dispatch(words: list[str]) -> int:
  """Runs the command ``words`` names; its exit status (2: no such command)."""
  if words[:1] == ["list"] and len(words) <= 2:
    print(_list(words[1] if len(words) == 2 else None))
  elif words[:2] == ["data", "prepare"] and len(words) == 3:
    print(_prepare(words[2]))
  elif words == ["data", "download", "lra-release"]:
    print(_download())
  elif words == ["train"]:
    return _train()
  elif words[:1] in (["suite"], ["bench"], ["report"]) and len(words) == 1:
    print({"suite": _suite, "bench": _bench, "report": _report}[words[0]]())
  elif words[:2] == ["viz", "attention"] and len(words) == 3:
    print(_viz(words[2]))
  else:
    print(f"error: unknown command {' '.join(words)!r}\n{USAGE}", file=sys.stderr)
    return 2
  return 0


def main(argv: list[str]) -> int:
  from lra_bench.training.config import ConfigError
  from tasks import DataError, MissingDataError
  from tasks.download import DownloadError

  try:
    return _dispatch(argv[1:])
  except MissingDataError as err:  # one line: what is missing and the command that makes it
    print("error: no data: " + " ".join(line.strip() for line in str(err).splitlines()), file=sys.stderr)
    return 1
  except (ConfigError, DataError, DownloadError, ValueError, TypeError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2


def run() -> None:
  """Console-script entry point."""
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
  app.run(main)


if __name__ == "__main__":
  run()
