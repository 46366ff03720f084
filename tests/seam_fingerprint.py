"""Fingerprints of a fixed set of cells, to pin that reshaping the layer and objective seams moves nothing
(``tests/test_seam_neutral.py``; the pinned values, ``tests/data/seam_fingerprints.json``, were made by this file
at the commit before each seam was cut: ``python tests/seam_fingerprint.py > tests/data/seam_fingerprints.json``;
``CELLS`` at da761ad, before the layer seam, ``PRETRAIN_CELLS`` at 301feb5, before the objectives became
modules, with the same computation written against that commit's API).

Per cell (protocol, task, layer): the config hash, the parameter tree (every path with its shape), the sum and
the sum of squares of every initial parameter, and the loss and accuracy of three train steps on a fixed random
batch of the task's shapes. A self-pretraining cell's fingerprint is its pretraining run's (the pretraining
objective's model, batch transform and loss: three train steps and one evaluation), with both config hashes and
what the classifier takes from it (``pretrain.transfer``). No data is read: the batch is drawn from a seeded
numpy generator.
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
# (protocol, task, layer, overrides) of self-pretraining: masked on tokens (mask ids, masks keyed by the
# example's index), causal on float pixels (the next pixel's L1 regression, "correct" within half a level).
PRETRAIN_CELLS = (
    ("smoke", "listops", "vanilla", ("pretrain.objective=masked",)),
    ("smoke", "image", "vanilla", ("pretrain.objective=causal", "model.attention_kwargs.causal=True",
                                   "model.pooling=MEAN", "model.input_kind=pixels")),
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


def _pretrain_batch(task, length: int, pixels: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """A classification batch (float pixels or tokens, one row padded) with each example's ``index``."""
  names = ("inputs1", "inputs2") if task.dual_input else ("inputs",)
  batch = {}
  for name in names:
    if pixels:
      batch[name] = rng.normal(size=(BATCH, length)).astype(np.float32)
    else:
      tokens = rng.integers(1, task.vocab_size, (BATCH, length), dtype=np.int32)
      tokens[0, length // 2:] = 0
      batch[name] = tokens
  batch["targets"] = rng.integers(0, task.num_classes, (BATCH,), dtype=np.int32)
  batch["index"] = np.arange(BATCH, dtype=np.int32)
  return batch


def _rounded(sums) -> dict[str, float]:
  return {k: round(float(v), 5) for k, v in sorted(sums.items()) if np.ndim(v) == 0}


def _params(state) -> dict:
  import jax

  leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
  values = [np.asarray(leaf, np.float64) for _, leaf in leaves]
  return {"params": {jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in leaves},
          "param_sum": round(float(sum(v.sum() for v in values)), 4),
          "param_sq": round(float(sum((v * v).sum() for v in values)), 4)}


def fingerprint(protocol: str, task_name: str, layer: str, overrides=()) -> dict:
  import jax

  from lra_bench.training import config as config_lib
  from lra_bench.training import objectives, optim, steps

  config = config_lib.load_config(protocol, task_name, list(overrides), attention=layer, seed=0)
  objective = objectives.select(config, objectives.TRAIN)
  length = min(int(config.data.max_length), MAX_LENGTH)
  batch = _batch(objective.task, length, np.random.default_rng(0))
  model = objective.create_model()
  tx = optim.make_optimizer(config.optimizer)
  state = steps.init_state(config, model, tx, batch)
  params = _params(state)
  step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, terms=objective.terms))
  metrics = []
  for _ in range(3):
    state, out = step(state, batch)
    metrics.append(_rounded(out))
  return {"cell": f"{protocol}/{task_name}/{layer}", "config_hash": config_lib.config_hash(config), **params,
          "steps": metrics}


def pretrain_fingerprint(protocol: str, task_name: str, layer: str, overrides=()) -> dict:
  import jax

  from lra_bench.training import config as config_lib
  from lra_bench.training import objectives, optim, pretrain, steps

  config = config_lib.load_config(protocol, task_name, list(overrides), attention=layer, seed=0)
  pre = pretrain.pretrain_config(config)
  objective = objectives.select(pre, objectives.PRETRAIN)
  length = min(int(config.data.max_length), MAX_LENGTH)
  batch = _pretrain_batch(objective.task, length, config.model.input_kind == "pixels", np.random.default_rng(0))
  model = objective.create_model()
  prepare, key = objective.batch_transform(), objective.eval_key()
  example = jax.tree.map(np.asarray, jax.jit(prepare)(batch, key))  # as loop.place: the batches it will see
  tx = optim.make_optimizer(pre.optimizer)
  state = steps.init_state(pre, model, tx, example)
  params = _params(state)
  step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, terms=objective.terms, prepare=prepare))
  metrics = []
  for _ in range(3):
    state, out = step(state, batch)
    metrics.append(_rounded(out))
  evaluate = jax.jit(functools.partial(steps.eval_step, model=model, terms=objective.terms, prepare=prepare,
                                       prepare_key=key))
  sums = evaluate(state.params, state.model_state, dict(batch, weights=np.ones(BATCH, np.float32)))
  classifier = objectives.select(config, objectives.TRAIN).create_model()
  fresh = classifier.init(jax.random.PRNGKey(0), batch, deterministic=True)["params"]
  _, taken, kept = pretrain.transfer(jax.device_get(state.params), fresh)
  return {"cell": "/".join((protocol, task_name, layer, overrides[0])), "config_hash": config_lib.config_hash(config),
          "pretrain_config_hash": config_lib.config_hash(pre), **params, "steps": metrics, "eval": _rounded(sums),
          "taken": len(taken), "kept": sorted(kept)}


def main() -> None:
  out = [fingerprint(*cell) for cell in CELLS] + [pretrain_fingerprint(*cell) for cell in PRETRAIN_CELLS]
  json.dump(out, sys.stdout, indent=1, sort_keys=True)
  sys.stdout.write("\n")


if __name__ == "__main__":
  main()
