"""Fingerprints of a fixed set of cells, to pin that reshaping the layer seam moves nothing
(``tests/test_seam_neutral.py``; the pinned values, ``tests/data/seam_fingerprints.json``, were made by this file
at the commit before the seam was cut: ``python tests/seam_fingerprint.py > tests/data/seam_fingerprints.json``).

Per cell (protocol, task, layer): the config hash, the parameter tree (every path with its shape), the sum and
the sum of squares of every initial parameter, and the loss and accuracy of three train steps on a fixed random
batch of the task's shapes. No data is read: the batch is drawn from a seeded numpy generator.
"""

from __future__ import annotations

import functools
import json
import sys

import numpy as np

# (protocol, task, layer, overrides): attention cores (one shared across layers, Xiong's Linformer), the mixers
# (one with a gated residual: Mega), the causal next-token models (Zoology's MQAR, seq_icl's LRU).
CELLS = (
    ("smoke", "listops", "vanilla", ()),
    ("smoke", "listops", "performer", ()),
    ("smoke", "listops", "s5", ()),
    ("smoke", "listops", "mega", ()),
    ("xiong", "listops", "linformer", ("data.max_length=64", "model.attention_kwargs.k=16")),
    ("zoology", "mqar", "vanilla", ()),
    ("zoology", "mqar", "s4d", ()),
    ("seq_icl", "assoc_recall", "seq_icl_lru", ()),
)
BATCH = 4
MAX_LENGTH = 64


def _batch(task, length: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
  if task.objective == "next_token":
    inputs = rng.integers(1, task.vocab_size, (BATCH, length), dtype=np.int32)
    positions = np.tile(np.arange(length - 4, length, dtype=np.int32), (BATCH, 1))
    targets = rng.integers(1, task.vocab_size, (BATCH, 4), dtype=np.int32)
    return {"inputs": inputs, "positions": positions, "targets": targets}
  names = ("inputs1", "inputs2") if task.dual_input else ("inputs",)
  batch = {}
  for name in names:
    tokens = rng.integers(1, task.vocab_size, (BATCH, length), dtype=np.int32)
    tokens[0, length // 2:] = 0  # one row padded
    batch[name] = tokens
  batch["targets"] = rng.integers(0, task.num_classes, (BATCH,), dtype=np.int32)
  return batch


def fingerprint(protocol: str, task_name: str, layer: str, overrides=()) -> dict:
  import jax

  import tasks as tasks_lib
  from lra_bench.training import config as config_lib
  from lra_bench.training import optim, steps

  config = config_lib.load_config(protocol, task_name, list(overrides), attention=layer, seed=0)
  task = tasks_lib.get_task(task_name)
  length = min(int(config.data.max_length), MAX_LENGTH)
  batch = _batch(task, length, np.random.default_rng(0))
  model = steps.create_model(config, task)
  tx = optim.make_optimizer(config.optimizer)
  state = steps.init_state(config, model, tx, batch)
  leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
  tree = {jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in leaves}
  values = [np.asarray(leaf, np.float64) for _, leaf in leaves]
  step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx))
  metrics = []
  for _ in range(3):
    state, out = step(state, batch)
    metrics.append({k: round(float(v), 5) for k, v in sorted(out.items()) if np.ndim(v) == 0})
  return {"cell": f"{protocol}/{task_name}/{layer}", "config_hash": config_lib.config_hash(config),
          "params": tree, "param_sum": round(float(sum(v.sum() for v in values)), 4),
          "param_sq": round(float(sum((v * v).sum() for v in values)), 4), "steps": metrics}


def main() -> None:
  out = [fingerprint(*cell) for cell in CELLS]
  json.dump(out, sys.stdout, indent=1, sort_keys=True)
  sys.stdout.write("\n")


if __name__ == "__main__":
  main()
