"""Prepared data that is incomplete, cut, corrupt or misnamed is refused or repaired, never trained on
silently (issue 30 items 4, 14 and the data parts of 15).

- a killed ``data prepare pathfinder`` (some batches missing, ``.tmp-*`` leftovers) is refused at train
  time with the command that resumes it; that command finishes the data and removes the leftovers;
- an empty ``lra_bench_meta.json`` or batch metadata file is an error naming it, not skipped;
- a cut prepared ListOps TSV is not "already prepared", and is refused at train time;
- a corrupt Pathfinder decode cache is decoded again; a ListOps TSV that is not UTF-8 is file:line;
- ``--name`` must be a plain file name; a flag another task takes is one line naming the task's flags.
"""

from __future__ import annotations

import glob
import logging
import os
import shlex
import shutil
import subprocess
import sys

import pytest

import tasks
from tasks import listops, pathfinder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PF_OPTIONS = dict(contour_length=6, num_images=20, images_per_batch=7, seed=1, workers=1, name="tiny")
DEAD_PID = 2**22 + 12345  # above the default pid_max: no such process


def _pf_dir(root: str) -> str:
  return os.path.join(root, "tiny", "pathfinder32", "curv_baseline")


@pytest.fixture(scope="module")
def pf_complete(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("pf_complete"))
  tasks.get_task("pathfinder").prepare(root, **PF_OPTIONS, progress=False)
  return root


@pytest.fixture
def pf_killed(pf_complete, tmp_path):
  """What a SIGKILL during batch 2 leaves: batches 0-1 committed, batch 2's temporary folder and
  metadata file half written by the dead process, lra_bench_meta.json promising 6 images."""
  root = str(tmp_path / "data")
  shutil.copytree(pf_complete, root)
  out = _pf_dir(root)
  shutil.rmtree(os.path.join(out, pathfinder.CACHE_DIR), ignore_errors=True)
  os.rename(os.path.join(out, "imgs", "2"), os.path.join(out, "imgs", f".tmp-2-{DEAD_PID}"))
  os.rename(os.path.join(out, "metadata", "2.npy"), os.path.join(out, "metadata", f"2.npy.tmp-{DEAD_PID}"))
  return root


def _examples(root: str, split: str = "train"):
  return tasks.get_task("pathfinder").examples(root, split, max_length=1024, contour_length=6, name="tiny")


def test_killed_pathfinder_prepare_is_refused_with_the_resume_command(pf_killed):
  with pytest.raises(tasks.DataError) as err:
    _examples(pf_killed)
  message = str(err.value)
  assert message.startswith(f"{_pf_dir(pf_killed)}: incomplete Pathfinder data: 2 of 3 batches of 20 images "
                            "(an interrupted data prepare); finish it with: lra-bench data prepare pathfinder")
  command = message.split("finish it with: ")[1]
  argv = shlex.split(command)
  assert f"--data_dir={pf_killed}" in argv and "--name=tiny" in argv and "--num_images=20" in argv
  assert "\n" not in message


def test_the_resume_command_finishes_the_data_and_removes_the_leftovers(pf_killed, pf_complete):
  with pytest.raises(tasks.DataError) as err:
    _examples(pf_killed)
  argv = shlex.split(str(err.value).split("finish it with: ")[1])
  env = dict(os.environ, PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-m", "lra_bench", *argv[1:], "--workers=1"], capture_output=True,
                        text=True, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr
  out = _pf_dir(pf_killed)
  assert not glob.glob(os.path.join(out, "*", ".tmp-*")) and not glob.glob(os.path.join(out, "*", "*.tmp-*"))
  assert sorted(os.listdir(os.path.join(out, "metadata"))) == ["0.npy", "1.npy", "2.npy"]
  assert open(os.path.join(out, "metadata", "2.npy")).read() == \
      open(os.path.join(_pf_dir(pf_complete), "metadata", "2.npy")).read()
  assert sum(_examples(pf_killed, s).num_examples for s in tasks.SPLITS) == 20


def test_temporaries_of_a_live_process_are_kept(pf_killed):
  out = _pf_dir(pf_killed)
  live = os.path.join(out, "imgs", f".tmp-7-{os.getpid()}")
  os.makedirs(live)
  removed = pathfinder.remove_stale_temporaries(out)
  assert sorted(map(os.path.basename, removed)) == [f".tmp-2-{DEAD_PID}", f"2.npy.tmp-{DEAD_PID}"]
  assert os.path.isdir(live)


@pytest.mark.parametrize("text", ["", "{", "[1, 2]"])
def test_unreadable_prepare_metadata_is_an_error_naming_it(pf_complete, tmp_path, text):
  root = str(tmp_path / "data")
  shutil.copytree(pf_complete, root)
  meta = os.path.join(_pf_dir(root), pathfinder.META_FILE)
  open(meta, "w").write(text)
  with pytest.raises(tasks.DataError, match=f"^{meta}: .*prepare metadata"):
    _examples(root)
  with pytest.raises(tasks.DataError, match=f"^{meta}: .*prepare metadata"):
    tasks.get_task("pathfinder").prepare(root, **PF_OPTIONS, progress=False)


@pytest.mark.parametrize("with_checksums", [True, False])
def test_empty_batch_metadata_file_is_an_error_naming_it(pf_complete, tmp_path, with_checksums):
  """``with_checksums=False``: batches generated before their checksums were kept (issue 59)."""
  root = str(tmp_path / "data")
  ignore = (pathfinder.CACHE_DIR,) if with_checksums else (pathfinder.CACHE_DIR, pathfinder.CHECKSUM_DIR)
  shutil.copytree(pf_complete, root, ignore=shutil.ignore_patterns(*ignore))
  empty = os.path.join(_pf_dir(root), "metadata", "1.npy")
  open(empty, "w").close()
  message = (f"^{empty}: damaged: its sha256 .*; regenerate it with: lra-bench data prepare pathfinder "
             if with_checksums else f"^{empty}: empty metadata file")
  with pytest.raises(tasks.DataError, match=message):
    _examples(root)


@pytest.mark.parametrize("damage", ["garbage", "cut", "wrong_shape"])
def test_corrupt_decode_cache_is_decoded_again(pf_complete, tmp_path, caplog, damage):
  import numpy as np

  root = str(tmp_path / "data")
  shutil.copytree(pf_complete, root)
  want = [_examples(root, s).num_examples for s in tasks.SPLITS]  # decodes and caches
  (pixels,) = glob.glob(os.path.join(_pf_dir(root), pathfinder.CACHE_DIR, "pixels-*.npy"))
  if damage == "garbage":
    open(pixels, "wb").write(b"\x93NUMPY\x01\x00garbage")
  elif damage == "cut":
    data = open(pixels, "rb").read()
    open(pixels, "wb").write(data[:len(data) // 2])
  else:
    np.save(pixels, np.zeros((20, 10), np.uint8))
  with caplog.at_level(logging.WARNING):
    assert [_examples(root, s).num_examples for s in tasks.SPLITS] == want
  assert f"decode cache {pixels} is unreadable" in caplog.text and "decoding the images again" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    _examples(root)
  assert "unreadable" not in caplog.text  # the cache was written again


# ----------------------------------------------------------------------------------------------------
# ListOps


def _listops(root: str) -> str:
  tasks.get_task("listops").prepare(root, name="cut", num_train=30, num_val=5, num_test=5, seed=0,
                                    min_length=10, max_expression_length=40, progress=False)
  return os.path.join(root, listops.SUBDIR, "cut_train.tsv")


def _cut(path: str, keep_lines: int) -> None:
  lines = open(path, "rb").read().splitlines(keepends=True)
  open(path, "wb").write(b"".join(lines[:keep_lines]))


def test_cut_listops_tsv_is_not_already_prepared(tmp_path, caplog):
  root = str(tmp_path)
  train = _listops(root)
  full = open(train, "rb").read()
  _cut(train, 11)  # header + 10 of 30 examples
  with caplog.at_level(logging.WARNING):
    _listops(root)
  assert f"{train} holds 10 examples, its metadata 30; generating the files again" in caplog.text
  assert open(train, "rb").read() == full


def test_cut_listops_tsv_is_refused_at_train_time(tmp_path):
  root = str(tmp_path)
  train = _listops(root)
  _cut(train, 11)
  with pytest.raises(tasks.DataError) as err:
    tasks.get_task("listops").examples(root, "train", max_length=64, name="cut")
  message = str(err.value)
  assert message.startswith(f"{train}: 10 examples, but {os.path.join(root, listops.SUBDIR, 'cut_meta.json')} "
                            "promises 30 (a cut or edited file); regenerate it with: lra-bench data prepare "
                            "listops")
  assert "--num_train=30" in message and "--name=cut" in message


def test_invalid_utf8_in_listops_tsv_names_file_and_line(tmp_path):
  path = tmp_path / "bad.tsv"
  path.write_bytes(b"Source\tTarget\r\n( [MAX 2 3 ] )\t3\r\n( [MIN 4 \xff\xfe ] )\t4\r\n")
  with pytest.raises(tasks.DataError) as err:
    listops.read_tsv(str(path))
  assert str(err.value).startswith(f"{path}:3: not valid UTF-8 (byte 0xff at column 10); a ListOps TSV is "
                                   "UTF-8 text")


# ----------------------------------------------------------------------------------------------------
# data prepare: names and flags


@pytest.mark.parametrize("task, options", [
    ("listops", dict(num_train=2, num_val=1, num_test=1, min_length=1, max_expression_length=20)),
    ("pathfinder", dict(contour_length=6, num_images=2, images_per_batch=2, workers=1)),
])
@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "/abs"])
def test_name_must_be_a_plain_file_name(tmp_path, task, options, name):
  root = tmp_path / "data"
  root.mkdir()
  with pytest.raises(tasks.DataError, match=f"--name {name!r} is not a plain file name"):
    tasks.get_task(task).prepare(str(root), name=name, progress=False, **options)
  assert list(tmp_path.rglob("*")) == [root]  # nothing written, inside or outside the data dir


def _cli(*argv: str, cwd: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=REPO)
  return subprocess.run([sys.executable, "-m", "lra_bench", *argv], capture_output=True, text=True, cwd=cwd,
                        env=env, timeout=300)


def test_cli_name_outside_the_data_dir_is_one_line(tmp_path):
  (tmp_path / "data").mkdir()
  proc = _cli("data", "prepare", "listops", "--data_dir", str(tmp_path / "data"), "--name", "../../x",
              "--num_train", "2", "--num_val", "1", "--num_test", "1", cwd=str(tmp_path))
  assert proc.returncode == 2
  assert proc.stderr.splitlines() == ["error: data prepare listops: --name '../../x' is not a plain file name "
                                      "(no '/', '..' or path); use a name such as 'smoke'"]
  assert list(tmp_path.rglob("*")) == [tmp_path / "data"]


@pytest.mark.parametrize("task, flag, message", [
    ("listops", "--resolution=32", "--resolution does not apply to listops; its flags: --name, --num_train, "
     "--num_val, --num_test, --min_length, --max_expression_length, --overwrite, --seed"),
    ("pathfinder", "--num_train=5", "--num_train does not apply to pathfinder; its flags: --name, --overwrite, "
     "--resolution, --contour_length, --num_images, --images_per_batch, --workers, --seed"),
    ("text", "--num_images=5", "--num_images does not apply to text; it takes none of these flags"),
])
def test_flag_of_another_task_is_one_line_naming_the_tasks_flags(tmp_path, task, flag, message):
  proc = _cli("data", "prepare", task, "--data_dir", str(tmp_path), flag, cwd=str(tmp_path))
  assert proc.returncode == 2
  assert proc.stderr.splitlines() == [f"error: data prepare {task}: {message}"]
  assert os.listdir(tmp_path) == []


def test_train_on_a_killed_prepare_fails_naming_the_resume_command(pf_killed, tmp_path):
  """The user's command: ``train`` on what the killed prepare left used to train to ``ok`` on 2/3 of it."""
  sets = ["data.options.name=tiny", "data.options.contour_length=6", "data.max_length=64", "batch_size=2",
          "num_train_steps=2", "eval_every=2", "checkpoint_every=2", "log_every=2", "model.num_layers=1",
          "model.emb_dim=8", "model.qkv_dim=8", "model.mlp_dim=8"]
  proc = _cli("train", "--task=pathfinder", "--protocol=smoke", f"--data_dir={pf_killed}",
              f"--workdir={tmp_path / 'run'}", *[f"--set={s}" for s in sets], cwd=str(tmp_path))
  assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: run failed: {_pf_dir(pf_killed)}: incomplete Pathfinder data: 2 of 3 "
                         "batches of 20 images (an interrupted data prepare); finish it with: lra-bench data "
                         "prepare pathfinder"), last
  assert "Traceback" not in proc.stderr


def test_listops_prepare_removes_the_leftovers_of_a_killed_prepare(tmp_path):
  out = tmp_path / listops.SUBDIR
  dead, live = out / f".tmp-listops-{DEAD_PID}-abc", out / f".tmp-listops-{os.getpid()}-def"
  dead.mkdir(parents=True)
  live.mkdir()
  (dead / "cut_train.tsv").write_text("Source\tTarget\r\n")
  _listops(str(tmp_path))
  assert not dead.exists() and live.is_dir()
