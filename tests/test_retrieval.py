"""Retrieval (AAN): the real TSV format in tiny fixtures, dual-input batch shapes, validation naming
file:line, missing data, and a tiny training through the dual encoder."""

import os

import pytest

import tasks
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from tasks import text
from tests.task_batches import dataset

ROWS = [("1.0", "A1", "B1", "graph parsing " * 3, "dependency graphs"),
        ("0", "A2", "B2", "neural machine translation", "speech"),
        ("1", "A3", "B3", "x" * 40, "résumé ✓"),
        ("0.0", "A4", "B4", "short", "")]


def write_aan(root, subdir=os.path.join("lra_release", "tsv_data"), rows=ROWS, splits=("train", "eval", "test")):
  folder = os.path.join(root, subdir)
  os.makedirs(folder, exist_ok=True)
  for split in splits:
    with open(os.path.join(folder, f"new_aan_pairs.{split}.tsv"), "w", encoding="utf-8") as f:
      f.writelines("\t".join(row) + "\n" for row in rows)
  return folder


def test_dual_batches_and_bytes(tmp_path):
  write_aan(str(tmp_path))
  task = tasks.get_task("retrieval")
  ex = task.examples(str(tmp_path), "validation", max_length=24)
  assert (ex.num_examples, ex.num_truncated) == (4, 3)   # rows 1-3 have a text over 24 bytes
  batches = list(dataset(task, str(tmp_path), "test", 3, max_length=24))
  assert [b["targets"].shape[0] for b in batches] == [3, 1]
  first = batches[0]
  assert set(first) == {"inputs1", "inputs2", "targets"}
  assert first["inputs1"].shape == (3, 24) and first["inputs2"].shape == (3, 24)
  assert first["inputs1"].dtype.name == "int32" and first["targets"].numpy().tolist() == [1, 0, 1]
  assert text.decode_bytes(first["inputs2"].numpy()[2]) == "résumé ✓".encode()
  train_batch = next(iter(dataset(task, str(tmp_path), "train", 2, max_length=24, seed=0, repeat=True)))
  assert train_batch["inputs1"].shape == (2, 24)


def test_reads_tsv_data_directly(tmp_path):
  write_aan(str(tmp_path), subdir="tsv_data")
  assert tasks.get_task("retrieval").examples(str(tmp_path), "train", max_length=8).num_examples == 4


@pytest.mark.parametrize("line, message", [
    ("1\tA\tB\tonly four", r"new_aan_pairs.train.tsv:3: expected 5 tab-separated columns"),
    ("yes\tA\tB\tx\ty", r"new_aan_pairs.train.tsv:3: label b'yes' is not 0 or 1"),
    ("2\tA\tB\tx\ty", r"new_aan_pairs.train.tsv:3: label b'2' is not 0 or 1"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
  folder = write_aan(str(tmp_path), rows=ROWS[:2])
  with open(os.path.join(folder, "new_aan_pairs.train.tsv"), "a") as f:
    f.write(line + "\n")
  with pytest.raises(tasks.DataError, match=message):
    tasks.get_task("retrieval").examples(str(tmp_path), "train", max_length=8)


def test_missing_data_names_paths_and_download(tmp_path):
  with pytest.raises(tasks.MissingDataError) as err:
    tasks.get_task("retrieval").prepare(str(tmp_path))
  text_ = str(err.value)
  assert os.path.join(str(tmp_path), "lra_release", "tsv_data", "new_aan_pairs.train.tsv") in text_
  assert "lra-bench data download lra-release" in text_


def test_tiny_training_through_the_dual_encoder(tmp_path):
  write_aan(str(tmp_path), rows=ROWS * 3)
  overrides = {"data.max_length": 16, "data.options.limit": 0, "batch_size": 4, "num_train_steps": 2,
               "eval_every": 2, "checkpoint_every": 2, "log_every": 2, "model.num_layers": 1,
               "model.emb_dim": 16, "model.qkv_dim": 16, "model.mlp_dim": 16, "optimizer.warmup_steps": 1}
  config = config_lib.load_config("smoke", "retrieval", [f"{k}={v}" for k, v in overrides.items()])
  record = cell.train_cell(config, str(tmp_path / "run"), str(tmp_path))
  assert record["status"] == "ok", record.get("error")
  assert record["data"]["test"]["num_examples"] == 12 and record["test_examples"] == 12
  assert round(record["test_accuracy"] * 12, 6).is_integer(), record["test_accuracy"]  # a count of 12 pairs
