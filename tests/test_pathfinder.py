"""Pathfinder: generator semantics (labels by construction and by connectivity), determinism, the release
layout and metadata, the reader (skips broken PNGs, validates metadata), batch shapes, a tiny training."""

import logging
import os
import shutil

import numpy as np
import pytest
from scipy import ndimage

import tasks
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from tasks import pathfinder, pathfinder_gen as gen
from tests.task_batches import dataset


def _bridged(image):
  """Thresholded pixels, dilated by one pixel (8-neighbourhood) to close the gaps between paddles."""
  return ndimage.binary_dilation(image > 0.05, structure=np.ones((3, 3), bool))


def test_labels_by_construction_and_by_connectivity():
  """Without distractors, the two marked ends lie on one connected snake exactly when label = 1."""
  rng = np.random.default_rng(0)
  pools = {}
  checked = labels = 0
  for _ in range(80):
    s = gen.generate_image(32, 6, rng, pools, distractors=False)
    origin, terminal = s.marker_snakes
    assert (origin == terminal) == (s.label == 1)           # by construction
    geo = gen.geometry(32, s.margin)
    end_a, end_b = tuple(s.targets[origin].origin), tuple(s.targets[terminal].terminal)
    assert s.image[end_a] > 100 and s.image[end_b] > 100    # the markers sit on those ends
    # Independent check on the pixels: connected components of the thresholded, gap-bridged snakes.
    layers = []
    for snake in s.targets:
      layer = np.zeros((32, 32), np.float32)
      gen.draw(geo, [snake], 1.0, layer)
      layers.append(layer)
    apart = [ndimage.label(_bridged(layer))[1] == 1 for layer in layers]
    touching = (ndimage.binary_dilation(_bridged(layers[0])) & _bridged(layers[1])).any()
    if all(apart) and not touching:  # each snake is one component and they do not touch
      components, count = ndimage.label(_bridged(np.maximum(*layers)))
      assert count == 2
      assert (components[end_a] == components[end_b]) == (s.label == 1)
      checked += 1
      labels += s.label
  assert checked >= 15 and 0 < labels < checked


def test_images_are_deterministic_per_seed():
  def images(seed):
    rng, pools = np.random.default_rng(seed), {}
    return [gen.generate_image(32, 14, rng, pools).image for _ in range(3)]

  a, b, c = images(5), images(5), images(6)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))
  assert a[0].dtype == np.uint8 and a[0].shape == (32, 32) and a[0].max() == 255


def test_seed_orientation_quirk_of_the_original():
  geo = gen.geometry(32, 1)
  assert 0.05 < geo.seed_viable.mean() < 0.15  # cv2 border semantics: ~8% of orientations can seed


@pytest.fixture(scope="module")
def pf_root(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("pf"))
  tasks.get_task("pathfinder").prepare(root, contour_length=6, num_images=60, images_per_batch=20, seed=1,
                                       workers=1, name="tiny", progress=False)
  return root


def _difficulty(root):
  return os.path.join(root, "tiny", "pathfinder32", "curv_baseline")


def test_layout_metadata_and_idempotence(pf_root):
  out = _difficulty(pf_root)
  assert sorted(os.listdir(os.path.join(out, "metadata"))) == ["0.npy", "1.npy", "2.npy"]
  lines = open(os.path.join(out, "metadata", "1.npy")).read().splitlines()
  assert len(lines) == 20
  fields = lines[3].split()
  assert fields[:3] == ["imgs/1", "sample_3.png", "3"] and fields[3] in ("0", "1")
  assert fields[4:] == ["1.0", "6", "2", "2", "0.5", "1", "1"]  # as the release's curv_baseline lines
  assert os.path.exists(os.path.join(out, "imgs", "1", "sample_3.png"))
  rows = pathfinder.read_metadata(out)
  assert len(rows) == 60 and {label for _, label in rows} == {0, 1}
  mtime = os.path.getmtime(os.path.join(out, "metadata", "0.npy"))
  task = tasks.get_task("pathfinder")
  task.prepare(pf_root, contour_length=6, num_images=60, images_per_batch=20, seed=1, workers=1, name="tiny",
               progress=False)
  assert os.path.getmtime(os.path.join(out, "metadata", "0.npy")) == mtime
  with pytest.raises(tasks.DataError, match="other options"):
    task.prepare(pf_root, contour_length=6, num_images=61, images_per_batch=20, seed=1, name="tiny",
                 progress=False)


def test_images_do_not_depend_on_worker_count(pf_root, tmp_path):
  task = tasks.get_task("pathfinder")
  task.prepare(str(tmp_path), contour_length=6, num_images=60, images_per_batch=20, seed=1, workers=2,
               name="tiny", progress=False)
  a, b = _difficulty(pf_root), _difficulty(str(tmp_path))
  for batch in range(3):
    assert open(os.path.join(a, "metadata", f"{batch}.npy")).read() == \
        open(os.path.join(b, "metadata", f"{batch}.npy")).read()
    for i in (0, 19):
      path = os.path.join("imgs", str(batch), f"sample_{i}.png")
      assert open(os.path.join(a, path), "rb").read() == open(os.path.join(b, path), "rb").read()


def test_reader_skips_empty_and_truncated_pngs(pf_root, tmp_path, caplog):
  out = os.path.join(str(tmp_path), "pathfinder32", "curv_baseline")
  # as the release: no lra-bench metadata or checksums (generated data refuses a damaged PNG instead:
  # tests/test_data_checksums.py)
  shutil.copytree(_difficulty(pf_root), out, ignore=shutil.ignore_patterns(
      pathfinder.CACHE_DIR, pathfinder.CHECKSUM_DIR, pathfinder.META_FILE))
  open(os.path.join(out, "imgs", "0", "sample_4.png"), "wb").close()           # empty, as in the release
  data = open(os.path.join(out, "imgs", "2", "sample_7.png"), "rb").read()
  open(os.path.join(out, "imgs", "2", "sample_7.png"), "wb").write(data[:len(data) // 2])  # truncated
  task = tasks.get_task("pathfinder")
  with caplog.at_level(logging.WARNING):
    sizes = [task.examples(str(tmp_path), s, max_length=1024, contour_length=6).num_examples
             for s in tasks.SPLITS]
  assert sum(sizes) == 58 and sizes == [46, 5, 7]
  assert "skipped 2 of 60 images (1 empty, 1 unreadable, 0 missing)" in caplog.text
  assert os.listdir(os.path.join(out, pathfinder.CACHE_DIR))  # decoded once, cached


@pytest.mark.parametrize("line, message", [
    ("imgs/0 sample_0.png 0\n", r"0.npy:1: expected at least 4 space-separated fields"),
    ("imgs/0 sample_0.png 0 0 1.0 6 2 2 0.5 1 1\nimgs/0 sample_1.png 1 yes 1.0\n", r"0.npy:2: label .* 0 or 1"),
])
def test_malformed_metadata_names_file_and_line(tmp_path, line, message):
  out = os.path.join(str(tmp_path), "pathfinder32", "curv_contour_length_14")
  os.makedirs(os.path.join(out, "metadata"))
  open(os.path.join(out, "metadata", "0.npy"), "w").write(line)
  with pytest.raises(tasks.DataError, match=message):
    tasks.get_task("pathfinder").examples(str(tmp_path), "train", max_length=1024)


def test_missing_folder_names_paths_and_command(tmp_path):
  with pytest.raises(tasks.MissingDataError) as err:
    dataset(tasks.get_task("pathx"), str(tmp_path), "train", 2)
  text = str(err.value)
  assert os.path.join(str(tmp_path), "pathfinder128", "curv_contour_length_14") in text
  assert os.path.join(str(tmp_path), "lra_release", "pathfinder128") in text
  assert "lra-bench data prepare pathx" in text and "--contour_length=14" in text


def test_batch_shapes_pixel_tokens_and_floats(pf_root):
  task = tasks.get_task("pathfinder")
  opts = dict(contour_length=6, name="tiny")
  batch = next(iter(dataset(task, pf_root, "train", 8, seed=0, repeat=True, **opts)))
  assert batch["inputs"].shape == (8, 1024) and batch["inputs"].dtype.name == "int32"
  assert batch["targets"].shape == (8,) and batch["targets"].dtype.name == "int32"
  inputs = batch["inputs"].numpy()
  assert inputs.min() == 1 and inputs.max() == 256  # black pixels are token 1: never padding
  sizes = [b["inputs"].shape[0] for b in dataset(task, pf_root, "test", 4, **opts)]
  assert sizes == [4, 2]  # 60 images: 48 / 6 / 6
  floats = next(iter(dataset(task, pf_root, "validation", 3, input_kind="pixels", **opts)))["inputs"].numpy()
  assert floats.dtype == np.float32 and floats.min() == -1.0 and floats.max() == 1.0


def test_tiny_training(pf_root, tmp_path):
  overrides = {"data.options.name": "'tiny'", "data.options.contour_length": 6, "data.options.limit": 0,
               "data.max_length": 256, "batch_size": 4, "num_train_steps": 2, "eval_every": 2,
               "checkpoint_every": 2, "log_every": 2, "model.emb_dim": 16, "model.qkv_dim": 16,
               "model.mlp_dim": 16, "optimizer.warmup_steps": 1, "model.input_kind": "'pixels'"}
  config = config_lib.load_config("smoke", "pathfinder", [f"{k}={v}" for k, v in overrides.items()])
  record = cell.train_cell(config, str(tmp_path / "run"), pf_root)
  assert record["status"] == "ok", record.get("error")
  assert record["data"]["train"]["num_truncated"] == 48  # 1024 pixels cut to 256, counted
  assert record["test_examples"] == 6 and round(record["test_accuracy"] * 6, 6).is_integer()  # 6 test images


@pytest.mark.parametrize("options, message", [
    (dict(num_images=-3), r"--num_images is -3; it must be >= 1"),
    (dict(num_images=0), r"--num_images is 0; it must be >= 1"),
    (dict(images_per_batch=-1), r"--images_per_batch is -1"),
    (dict(workers=0), r"--workers is 0; it must be >= 1"),
    (dict(contour_length=7), r"--contour_length must be one of \[6, 9, 14\], got 7"),
    (dict(resolution=48), r"--resolution must be one of"),
])
def test_prepare_refuses_bad_options_before_writing(tmp_path, options, message):
  base = dict(contour_length=6, num_images=4, images_per_batch=2, seed=1, workers=1, progress=False)
  with pytest.raises(tasks.DataError, match=message):
    tasks.get_task("pathfinder").prepare(str(tmp_path), **{**base, **options})
  assert os.listdir(tmp_path) == []
