"""The numpy input pipeline (``data.pipeline = "numpy"``): batches of in-memory arrays without
TensorFlow, for the tasks whose data are generated locally (ListOps, the recall tasks).

Its batches: every training epoch a seeded permutation, the remainder dropped; evaluation every example
once, in file order; processes' shards disjoint. Its examples: the same token ids as the tf.data
pipeline's. Its iterator state: saved beside each checkpoint, so a run stopped and rerun ends with the
numbers of an uninterrupted one. (Without TensorFlow at all: tests/test_no_tensorflow.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

import tasks
from lra_bench.errors import ConfigError
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from lra_bench.training import checkpoints, loop
from tasks import base
from tests.conftest import tiny_overrides


def _batches(n=10, batch=3, **kwargs):
  return base.ArrayBatches({"x": np.arange(n, dtype=np.int32), "y": np.arange(n, dtype=np.int32) * 10},
                           batch, **kwargs)


def test_training_epochs_are_seeded_permutations_with_the_remainder_dropped():
  it = iter(_batches(repeat=True, seed=3))
  epochs = [np.concatenate([next(it)["x"] for _ in range(3)]) for _ in range(4)]   # 10 // 3 = 3 batches
  for order in epochs:
    assert len(set(order.tolist())) == 9 and set(order.tolist()) <= set(range(10))
  assert len({tuple(order) for order in epochs}) == 4          # each epoch its own order
  again = iter(_batches(repeat=True, seed=3))
  assert np.array_equal(np.concatenate([next(again)["x"] for _ in range(12)]), np.concatenate(epochs))
  other = iter(_batches(repeat=True, seed=4))
  assert not np.array_equal(np.concatenate([next(other)["x"] for _ in range(12)]), np.concatenate(epochs))
  batch = next(iter(_batches(repeat=True, seed=3)))
  assert np.array_equal(batch["y"], batch["x"] * 10)           # the arrays stay aligned


def test_evaluation_sees_every_example_once_in_order_and_each_pass_starts_over():
  batches = _batches(n=10, batch=4)
  for _ in range(2):
    sizes_and_rows = [(len(b["x"]), b["x"].tolist()) for b in batches]
    assert [size for size, _ in sizes_and_rows] == [4, 4, 2]
    assert sum((rows for _, rows in sizes_and_rows), []) == list(range(10))


def test_shards_are_disjoint_and_cover_the_split():
  rows = [np.concatenate([b["x"] for b in _batches(n=11, batch=2, num_shards=3, shard_index=i)]) for i in range(3)]
  assert sorted(np.concatenate(rows).tolist()) == list(range(11))
  assert rows[1].tolist() == [1, 4, 7, 10]


def test_the_iterator_state_restores_the_exact_position(tmp_path):
  it = iter(_batches(n=10, batch=3, repeat=True, seed=1))
  for _ in range(7):                                            # into the third epoch
    next(it)
  prefix = checkpoints.ArrayIteratorCheckpoint(it).write(str(tmp_path / "iter-7"))
  expected = [next(it)["x"].tolist() for _ in range(5)]
  fresh = iter(_batches(n=10, batch=3, repeat=True, seed=1))
  checkpoints.ArrayIteratorCheckpoint(fresh).read(prefix).expect_partial()
  assert [next(fresh)["x"].tolist() for _ in range(5)] == expected


def test_fewer_training_examples_than_a_batch_is_one_clear_error():
  with pytest.raises(base.DataError, match="fewer than one batch of 8"):
    _batches(n=5, batch=8, repeat=True)


def test_listops_arrays_are_the_tf_pipelines_token_ids(listops_dir):
  listops = tasks.get_task("listops")
  for split in tasks.SPLITS:
    arrays = listops.array_examples(listops_dir, split, max_length=32, name="tiny")
    via_tf = list(listops.examples(listops_dir, split, max_length=32, name="tiny").dataset.as_numpy_iterator())
    assert arrays.num_examples == len(via_tf) and arrays.num_truncated > 0   # 32 truncates some of them
    assert np.array_equal(arrays.arrays["inputs"], np.stack([ex["inputs"] for ex in via_tf]))
    assert np.array_equal(arrays.arrays["targets"], np.array([ex["targets"] for ex in via_tf]))
    assert arrays.arrays["inputs"].dtype == np.int32


def test_recall_arrays_are_the_tf_pipelines_padded_examples(tmp_path):
  mqar = tasks.get_task("mqar")
  data_dir = str(tmp_path)
  mqar.prepare(data_dir, name="tiny", num_train=20, num_val=6, num_test=6, seq_len=16, num_kv_pairs=2,
               vocab_size=64)
  arrays = mqar.array_examples(data_dir, "test", max_length=20, name="tiny")
  via_tf = list(mqar.examples(data_dir, "test", max_length=20, name="tiny").dataset.as_numpy_iterator())
  for key in ("inputs", "positions", "targets"):
    assert np.array_equal(arrays.arrays[key], np.stack([ex[key] for ex in via_tf])), key
  assert arrays.arrays["inputs"].shape == (6, 20) and arrays.vocab_size == 65   # + the padding id 0


def test_the_pipeline_key_is_checked():
  with pytest.raises(ConfigError, match="data.pipeline='arrow' is not allowed; expected one of tf, numpy"):
    config_lib.load_config("smoke", "listops", ["data.pipeline=arrow"])
  with pytest.raises(ConfigError, match="data.pipeline='numpy' is not allowed; expected 'tf' for task 'text'"):
    config_lib.load_config("smoke", "text", ["data.pipeline=numpy"])
  assert "pipeline" not in config_lib.load_config("smoke", "listops").data   # the default adds no key


@pytest.mark.timeout(600)
def test_a_numpy_pipeline_run_stopped_and_rerun_ends_as_an_uninterrupted_one(listops_dir, tmp_path, monkeypatch):
  overrides = tiny_overrides(**{"data.pipeline": "numpy", "num_train_steps": 24, "checkpoint_every": 8})
  config = config_lib.load_config("smoke", "listops", overrides)
  whole = cell.train_cell(config, str(tmp_path / "whole"), listops_dir)
  assert whole["status"] == "ok", whole.get("error")

  log = loop.Run._check_and_log

  def stop_at_12(self, step, metrics, log_now):  # a Ctrl-C at step 12: the last checkpoint is step 8
    log(self, step, metrics, log_now)
    if step == 12:
      self.stop.requested = True
  monkeypatch.setattr(loop.Run, "_check_and_log", stop_at_12)
  with pytest.raises(loop.Interrupted, match="interrupted at step 12; .*step 8 or later"):
    loop.train_and_evaluate(config, str(tmp_path / "resumed"), listops_dir)
  monkeypatch.setattr(loop.Run, "_check_and_log", log)
  resumed = cell.train_cell(config, str(tmp_path / "resumed"), listops_dir)
  assert resumed["status"] == "ok", resumed.get("error")
  for key in ("test_accuracy", "test_loss", "best_val_accuracy", "best_step", "train_steps"):
    assert resumed[key] == whole[key], key
  assert resumed["val_curve"] == whole["val_curve"] and len(whole["val_curve"]) == 3   # steps 8, 16, 24
