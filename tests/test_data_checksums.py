"""Generated data carries its checksums (issue 59): ListOps and Pathfinder as the recall tasks
(tests/test_recall_tasks.py).

- ``data prepare`` records each generated file's sha256 in the metadata that marks it complete;
- a file cut short or overwritten is named by the next ``data prepare``, which generates it again byte for
  byte (the generators are seeded), instead of calling the data "already prepared";
- a read at train time (tf.data and numpy pipelines) refuses it in one line naming the file and the
  ``lra-bench data prepare ...`` command that regenerates it;
- data prepared before the checksums were kept gets them from a prepare that finds it whole.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import tasks
from tasks import checksums, listops, pathfinder, recall

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTOPS = dict(name="sums", num_train=30, num_val=5, num_test=5, seed=0, min_length=10, max_expression_length=40)
PF = dict(contour_length=6, num_images=10, images_per_batch=4, seed=1, workers=1, name="sums")
PF_COUNTS = {0: 4, 1: 4, 2: 2}  # images per batch; splits 8 / 1 / 1


def test_one_implementation_of_the_checksums():
  assert recall.sha256 is checksums.sha256
  for module in (recall, listops, pathfinder):
    assert not hasattr(module, "_cached_sha256") and not hasattr(module, "_checksum_problem")


# ----------------------------------------------------------------------------------------------------
# ListOps


def _listops(root: str) -> tuple[str, str]:
  """Prepares the small ListOps data; returns (its folder, its metadata file)."""
  out = tasks.get_task("listops").prepare(root, **LISTOPS, progress=False)
  return out, os.path.join(out, "sums_meta.json")


def _listops_files(out: str) -> dict[str, str]:
  return {split: os.path.join(out, f"sums_{short}.tsv") for split, short in listops.SPLIT_FILES.items()}


def _read_listops(root: str, split: str, pipeline: str):
  task = tasks.get_task("listops")
  read = task.examples if pipeline == "tf" else task.array_examples
  return read(root, split, max_length=64, name="sums")


def test_listops_prepare_records_each_files_sha256(tmp_path):
  out, meta_path = _listops(str(tmp_path))
  with open(meta_path) as f:
    meta = json.load(f)
  files = _listops_files(out)
  assert meta[checksums.KEY] == {os.path.basename(p): checksums.sha256(p) for p in files.values()}
  assert {k: v for k, v in meta.items() if k != checksums.KEY} == {**LISTOPS, "generator": "lra-bench listops v1"}


def _damage(path: str, how: str) -> None:
  """``cut``: the file cut to 100 bytes; ``overwritten``: one byte changed, the length kept (for a ListOps
  TSV: the last label, so the file still reads as valid ListOps)."""
  with open(path, "rb") as f:
    data = f.read()
  if how == "cut":
    data = data[:100]
  else:
    at = data.rstrip(b"\r\n").rfind(b"\t") + 1
    data = data[:at] + bytes([ord("0") + (data[at] - ord("0") + 1) % 10]) + data[at + 1:]
  with open(path, "wb") as f:
    f.write(data)


@pytest.mark.parametrize("how", ["cut", "overwritten"])
@pytest.mark.parametrize("pipeline", ["tf", "numpy"])
def test_listops_damaged_file_is_refused_at_train_time_naming_it_and_the_command(tmp_path, how, pipeline):
  root = str(tmp_path)
  out, meta_path = _listops(root)
  test = _listops_files(out)["test"]
  _damage(test, how)
  assert _read_listops(root, "train", pipeline).num_examples == 30  # the other splits are whole
  with pytest.raises(tasks.DataError) as err:
    _read_listops(root, "test", pipeline)
  message = str(err.value)
  assert message.startswith(f"{test}: ") and "\n" not in message
  if how == "cut":
    assert re.search(rf"^{re.escape(test)}: \d examples, but {re.escape(meta_path)} promises 5 \(a cut or edited "
                     r"file\); regenerate it with: ", message), message
  else:
    assert "damaged: its sha256 is" in message and "sums_meta.json says" in message
  command = shlex.split(message.split("regenerate it with: ")[1].split(" (a prepare")[0])
  assert command[:4] == ["lra-bench", "data", "prepare", "listops"]
  assert sorted(command[4:]) == sorted([f"--data_dir={root}", "--name=sums", "--num_train=30", "--num_val=5",
                                        "--num_test=5", "--seed=0", "--min_length=10",
                                        "--max_expression_length=40"])


@pytest.mark.parametrize("how", ["cut", "overwritten"])
def test_listops_prepare_names_a_damaged_file_and_regenerates_it(tmp_path, caplog, how):
  root = str(tmp_path)
  out, meta_path = _listops(root)
  test = _listops_files(out)["test"]
  with open(test, "rb") as f:
    whole = f.read()
  with open(meta_path) as f:
    meta = json.load(f)
  _damage(test, how)
  with caplog.at_level(logging.INFO):
    _listops(root)
  assert test in caplog.text and "generating the files again" in caplog.text
  assert "already prepared" not in caplog.text
  with open(test, "rb") as f:
    assert f.read() == whole                                    # seeded: the same bytes
  with open(meta_path) as f:
    assert json.load(f) == meta
  assert _read_listops(root, "test", "numpy").num_examples == 5


def test_listops_metadata_without_checksums_gets_them_when_the_files_are_whole(tmp_path, caplog):
  root = str(tmp_path)
  out, meta_path = _listops(root)
  with open(meta_path) as f:
    meta = json.load(f)
  sums = meta.pop(checksums.KEY)
  with open(meta_path, "w") as f:
    json.dump(meta, f, indent=1)  # as a prepare before issue 59 wrote it
  files = _listops_files(out)
  mtimes = {path: os.stat(path).st_mtime_ns for path in files.values()}
  assert _read_listops(root, "train", "tf").num_examples == 30  # read as it is, not refused
  with caplog.at_level(logging.INFO):
    _listops(root)
  assert "already prepared" in caplog.text
  assert {path: os.stat(path).st_mtime_ns for path in files.values()} == mtimes  # kept, not regenerated
  with open(meta_path) as f:
    assert json.load(f) == {**meta, checksums.KEY: sums}
  # before the checksums, a file that no longer reads as ListOps is not whole: generated again
  with open(meta_path, "w") as f:
    json.dump(meta, f, indent=1)
  with open(files["validation"], "rb") as f:
    whole = f.read()
  with open(files["validation"], "wb") as f:
    f.write(whole.replace(b"[", b"{", 1))  # the same length and line count: only a read finds it
  caplog.clear()
  with caplog.at_level(logging.INFO):
    _listops(root)
  val = files["validation"]
  assert f"{val}:2: Source token '{{" in caplog.text and "generating the files again" in caplog.text
  with open(files["validation"], "rb") as f:
    assert f.read() == whole
  with open(meta_path) as f:
    assert json.load(f)[checksums.KEY] == sums


def test_train_on_a_damaged_listops_file_is_one_line_naming_it(tmp_path):
  """The user's command: ``train`` used to fail on the file's contents (or train on an edited label)."""
  root = str(tmp_path / "data")
  out, _ = _listops(root)
  train = _listops_files(out)["train"]
  _damage(train, "overwritten")
  sets = ["data.options.name=sums", "data.max_length=40", "batch_size=2", "num_train_steps=2", "eval_every=2",
          "checkpoint_every=2", "log_every=2", "model.num_layers=1", "model.emb_dim=8", "model.qkv_dim=8",
          "model.mlp_dim=8", "data.pipeline=numpy"]
  env = dict(os.environ, PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-m", "lra_bench", "train", "--task=listops", "--protocol=smoke",
                         f"--data_dir={root}", f"--workdir={tmp_path / 'run'}", *[f"--set={s}" for s in sets]],
                        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
  assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: run failed: {train}: damaged: its sha256 is"), last
  assert "regenerate it with: lra-bench data prepare listops" in last and "--name=sums" in last
  assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------------------------------
# Pathfinder


def _pf_dir(root: str) -> str:
  return os.path.join(root, "sums", "pathfinder32", "curv_baseline")


@pytest.fixture(scope="module")
def pf_data(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("pf_sums"))
  tasks.get_task("pathfinder").prepare(root, **PF, progress=False)
  return root


@pytest.fixture
def pf_copy(pf_data, tmp_path):
  """A fresh copy of the small Pathfinder data, without a decode cache (the first read decodes)."""
  root = str(tmp_path / "data")
  shutil.copytree(pf_data, root, ignore=shutil.ignore_patterns(pathfinder.CACHE_DIR))
  return root


def _read_pf(root: str, split: str = "train"):
  return tasks.get_task("pathfinder").examples(root, split, max_length=1024, contour_length=6, name="sums")


def _prepare_pf(root: str) -> None:
  tasks.get_task("pathfinder").prepare(root, **PF, progress=False)


def test_pathfinder_prepare_records_each_files_sha256(pf_data):
  out = _pf_dir(pf_data)
  assert sorted(os.listdir(os.path.join(out, pathfinder.CHECKSUM_DIR))) == ["0.json", "1.json", "2.json"]
  for batch, count in PF_COUNTS.items():
    sums = pathfinder.read_checksums(out, batch)
    assert sorted(sums) == sorted(pathfinder.batch_files(batch, count))
    assert sums == {key: checksums.sha256(os.path.join(out, key)) for key in sums}


DAMAGES = [("imgs/1/sample_0.png", "cut"), ("imgs/1/sample_0.png", "swapped"), ("metadata/1.npy", "cut"),
           ("lra_bench_sha256/1.json", "cut")]


def _damage_pf(out: str, key: str, how: str) -> str:
  """Cuts ``key`` to 100 bytes, or puts another image of the data in its place (a valid PNG)."""
  path = os.path.join(out, key)
  if how == "cut":
    with open(path, "r+b") as f:
      f.truncate(100)
  else:
    shutil.copyfile(os.path.join(out, "imgs", "0", "sample_1.png"), path)
  return path


@pytest.mark.parametrize("key, how", DAMAGES)
def test_pathfinder_damaged_file_is_refused_at_train_time_naming_it_and_the_command(pf_copy, key, how):
  out = _pf_dir(pf_copy)
  path = _damage_pf(out, key, how)
  with pytest.raises(tasks.DataError) as err:
    _read_pf(pf_copy)
  message = str(err.value)
  assert message.startswith(f"{path}: ") and "\n" not in message, message
  if key.endswith(".json"):
    assert "unreadable checksums of batch 1" in message
  else:
    assert "damaged: its sha256 is" in message and "lra_bench_sha256/1.json says" in message
  command = shlex.split(message.split("regenerate it with: ")[1].split(" (a prepare")[0])
  assert command[:4] == ["lra-bench", "data", "prepare", "pathfinder"]
  assert sorted(command[4:]) == sorted([f"--data_dir={pf_copy}", "--name=sums", "--contour_length=6",
                                        "--num_images=10", "--images_per_batch=4", "--seed=1", "--resolution=32"])


@pytest.mark.parametrize("key, how", DAMAGES)
def test_pathfinder_prepare_names_a_damaged_file_and_regenerates_its_batch(pf_copy, pf_data, caplog, key, how):
  out = _pf_dir(pf_copy)
  path = _damage_pf(out, key, how)
  with caplog.at_level(logging.INFO):
    _prepare_pf(pf_copy)
  assert f"{path}: " in caplog.text and f"generating batch 1 of {out} again" in caplog.text
  assert "already prepared" not in caplog.text
  for batch, count in PF_COUNTS.items():  # every file as generated the first time: seeded per batch
    for name in pathfinder.batch_files(batch, count) + [f"{pathfinder.CHECKSUM_DIR}/{batch}.json"]:
      with open(os.path.join(out, name), "rb") as f, open(os.path.join(_pf_dir(pf_data), name), "rb") as g:
        assert f.read() == g.read(), name
  assert sum(_read_pf(pf_copy, split).num_examples for split in tasks.SPLITS) == 10


def test_pathfinder_png_damaged_after_its_decode_is_found_by_prepare(pf_copy, caplog):
  """A read after the first decodes from the cache (the PNGs are checked when decoded, the metadata files
  at every read); a ``data prepare`` checks every file."""
  out = _pf_dir(pf_copy)
  assert _read_pf(pf_copy).num_examples == 8
  path = _damage_pf(out, "imgs/2/sample_0.png", "cut")
  assert _read_pf(pf_copy).num_examples == 8  # the decoded pixels are the generated ones
  with caplog.at_level(logging.WARNING):
    _prepare_pf(pf_copy)
  assert f"{path}: damaged" in caplog.text
  assert pathfinder.read_checksums(out, 2)["imgs/2/sample_0.png"] == checksums.sha256(path)


def test_pathfinder_batches_without_checksums_get_them_when_whole(pf_copy, pf_data, caplog):
  out = _pf_dir(pf_copy)
  shutil.rmtree(os.path.join(out, pathfinder.CHECKSUM_DIR))  # as a prepare before issue 59 left it
  assert sum(_read_pf(pf_copy, split).num_examples for split in tasks.SPLITS) == 10  # read, not refused
  markers = {b: os.stat(os.path.join(out, "metadata", f"{b}.npy")).st_mtime_ns for b in PF_COUNTS}
  cut = _damage_pf(out, "imgs/1/sample_1.png", "cut")  # batch 1 is not whole: generated again
  with caplog.at_level(logging.INFO):
    _prepare_pf(pf_copy)
  assert f"{cut}: unreadable; generating batch 1 of {out} again" in caplog.text
  assert "already prepared" not in caplog.text
  for batch in (0, 2):  # whole: kept
    assert os.stat(os.path.join(out, "metadata", f"{batch}.npy")).st_mtime_ns == markers[batch]
  for batch in PF_COUNTS:
    assert pathfinder.read_checksums(out, batch) == pathfinder.read_checksums(_pf_dir(pf_data), batch)
  with open(cut, "rb") as f, open(os.path.join(_pf_dir(pf_data), "imgs", "1", "sample_1.png"), "rb") as g:
    assert f.read() == g.read()
  caplog.clear()
  with caplog.at_level(logging.INFO):
    _prepare_pf(pf_copy)
  assert "Pathfinder data already prepared" in caplog.text
