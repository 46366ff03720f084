"""The ``lra-bench`` command line: flags + one call per command (logic lives in ``commands.py``).

  lra-bench list [attentions|tasks|protocols]
  lra-bench data prepare listops [--protocol smoke] [--num_train N ...] [--data_dir DIR]
  lra-bench train --task listops --attention vanilla --protocol smoke --seed 0 --workdir DIR
"""

from __future__ import annotations

import logging
import os
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
# multi-host (lra_bench/parallel.py); unset = one process unless the environment says otherwise
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0 (jax.distributed).")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: index of this process.")
flags.DEFINE_bool("distributed", None, "Multi-host: force (or forbid) jax.distributed.initialize() with "
                  "the cluster auto-detected (Cloud TPU pod slices, Slurm, Open MPI).")
# data prepare options (None = the task's / protocol's default)
flags.DEFINE_string("name", None, "ListOps: file name prefix (basic_*.tsv).")
flags.DEFINE_integer("num_train", None, "Generated training examples.")
flags.DEFINE_integer("num_val", None, "Generated validation examples.")
flags.DEFINE_integer("num_test", None, "Generated test examples.")
flags.DEFINE_integer("min_length", None, "ListOps: keep expressions longer than this.")
flags.DEFINE_integer("max_length", None, "ListOps: keep expressions shorter than this.")
flags.DEFINE_bool("overwrite", None, "Regenerate data that already exists.")

PREPARE_FLAGS = ("name", "num_train", "num_val", "num_test", "min_length", "max_length", "overwrite")

USAGE = __doc__


def _data_dir() -> str:
  return FLAGS.data_dir or default_data_dir()


def main(argv: list[str]) -> int:
  from lra_bench import commands
  from lra_bench.config import ConfigError
  from tasks import DataError

  words = argv[1:]
  try:
    if words == ["list"]:
      print(commands.list_all())
    elif words[:1] == ["list"] and len(words) == 2:
      print("\n".join(commands.list_names(words[1])))
    elif words[:2] == ["data", "prepare"] and len(words) == 3:
      options = {name: FLAGS[name].value for name in PREPARE_FLAGS}
      if FLAGS["seed"].present:
        options["seed"] = FLAGS.seed
      print(commands.prepare_data(words[2], _data_dir(), FLAGS.protocol, options))
    elif words == ["train"]:
      if not FLAGS.task:
        raise ConfigError("train needs --task (lra-bench list shows the tasks)")
      commands.start_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                                 FLAGS.distributed)
      record = commands.train(FLAGS.task, FLAGS.attention, FLAGS.protocol or "lra", FLAGS.seed,
                              FLAGS.workdir, _data_dir(), FLAGS.results_dir, FLAGS.set, FLAGS.force)
      if record["status"] != "ok":
        print(f"error: run {record['status']}: {record['error']}", file=sys.stderr)
        return 1
      print(f"test accuracy {record['test_accuracy']:.4f} (best validation {record['best_val_accuracy']:.4f} "
            f"at step {record['best_step']}); result in {os.path.join(record['workdir'], 'result.json')}")
    else:
      print(f"error: unknown command {' '.join(words)!r}\n{USAGE}", file=sys.stderr)
      return 2
  except (ConfigError, DataError, ValueError, TypeError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  return 0


def run() -> None:
  """Console-script entry point."""
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
  app.run(main)


if __name__ == "__main__":
  run()
