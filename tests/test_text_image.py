"""Text (IMDB bytes) and Image (CIFAR-10 gray) on mocked TFDS: encoders, grayscale values, batch shapes,
validation choice, missing data, pixel inputs in the model, and a tiny training of each."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import tasks
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from lra_bench.training import models
from tasks import image, text
from tasks.base import import_tf, pixel_inputs_fn
from tests.task_batches import dataset
from tests.tfds_mock import mock_tfds


@pytest.mark.parametrize("value", ["", "abc", "héllo wörld ✓", "x" * 20])
def test_byte_encoding_round_trip(value):
  tf = import_tf()
  ids = text.encode_bytes(value, 16)
  assert ids.shape == (16,) and ids.dtype == np.int32
  assert text.decode_bytes(ids) == value.encode("utf-8")[:16]
  np.testing.assert_array_equal(text.byte_tokens_fn(16)(tf.constant(value.encode("utf-8"))).numpy(), ids)
  assert ids.max(initial=0) <= 256 and (not value or ids.min() >= (0 if len(value.encode()) < 16 else 1))


def test_grayscale_is_lra_rgb_to_grayscale():
  pixels = np.array([[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255], [12, 200, 77],
                     [1, 1, 1]], np.uint8)
  gray = image.to_grayscale(pixels.reshape(1, 1, -1, 3))[0]
  w = np.array([0.2989, 0.5870, 0.1140], np.float32)
  expected = np.floor((pixels.astype(np.float32) / np.float32(255) @ w) * np.float32(255.5)).astype(np.uint8)
  np.testing.assert_array_equal(gray, expected)
  assert gray[:5].tolist() == [0, 255, 76, 149, 29]


def test_black_pixels_are_not_padding():
  tf = import_tf()
  tokens = pixel_inputs_fn("tokens", 0.0, 1.0)(tf.constant([0, 7, 255], tf.uint8)).numpy()
  assert tokens.tolist() == [1, 8, 256]
  c = ml_collections.ConfigDict(dict(emb_dim=8, pooling="MEAN", positions="none", num_layers=0,
                                     dropout_rate=0.0, input_kind="tokens"))
  enc = models.Encoder(c, vocab_size=257)
  ids = jnp.asarray([[1, 256, 0]])  # a black pixel, a white pixel, padding
  _, mask = enc.apply(enc.init(jax.random.PRNGKey(0), ids, True), ids, True)
  assert mask.tolist() == [[True, True, False]]


def test_float_pixels_go_through_a_dense_projection():
  c = ml_collections.ConfigDict(dict(emb_dim=8, pooling="MEAN", positions="learned", num_layers=0,
                                     dropout_rate=0.0, input_kind="pixels"))
  enc = models.Encoder(c, vocab_size=257)
  x = jnp.asarray([[-1.0, 0.0, 1.0]])
  variables = enc.init(jax.random.PRNGKey(0), x, True)
  features, mask = enc.apply(variables, x, True)
  assert "pixel_projection" in variables["params"] and "embed" not in variables["params"]
  assert features.shape == (1, 3, 8) and bool(mask.all())
  tokens_encoder = models.Encoder(ml_collections.ConfigDict({**c.to_dict(), "input_kind": "tokens"}), 257)
  with pytest.raises(TypeError, match="input_kind='tokens' needs integer inputs"):
    tokens_encoder.init(jax.random.PRNGKey(0), x, True)


def test_text_batches_and_validation_choice(tmp_path):
  task = tasks.get_task("text")
  with mock_tfds(num_examples=10):
    batch = next(iter(dataset(task, str(tmp_path), "train", 4, max_length=32, seed=0, repeat=True)))
    assert batch["inputs"].shape == (4, 32) and batch["inputs"].dtype.name == "int32"
    assert batch["targets"].shape == (4,) and batch["targets"].dtype.name == "int32"
    sizes = [b["inputs"].shape[0] for b in dataset(task, str(tmp_path), "test", 4, max_length=32)]
    assert sizes == [4, 4, 2]
    holdout = task.examples(str(tmp_path), "validation", max_length=32)
    parity = task.examples(str(tmp_path), "validation", max_length=32, validation="test")
  assert "imdb_reviews/train[90%:]" in holdout.source and "imdb_reviews/test" in parity.source
  assert text.tfds_split("train", "holdout") == "train[:90%]"


def test_image_batches(tmp_path):
  task = tasks.get_task("image")
  with mock_tfds(num_examples=6):
    batch = next(iter(dataset(task, str(tmp_path), "validation", 4)))
    floats = next(iter(dataset(task, str(tmp_path), "test", 6, input_kind="pixels")))
  assert batch["inputs"].shape == (4, 1024) and batch["inputs"].dtype.name == "int32"
  assert batch["inputs"].numpy().min() >= 1 and batch["targets"].shape == (4,)
  assert floats["inputs"].dtype.name == "float32" and floats["inputs"].shape == (6, 1024)


@pytest.mark.parametrize("name, dataset", [("text", "imdb_reviews"), ("image", "cifar10")])
def test_missing_tfds_data_names_paths_and_fix(tmp_path, name, dataset):
  with pytest.raises(tasks.MissingDataError) as err:
    tasks.get_task(name).examples(str(tmp_path), "train", max_length=8)
  assert str(tmp_path / "tfds") in str(err.value) and f"tfds build {dataset}" in str(err.value)


def test_incomplete_tfds_copy_is_said_once_in_the_error(tmp_path, monkeypatch, caplog):
  """A half-copied TFDS folder: TFDS warns "Variant folder ... has no dataset_info.json" for each
  candidate dir and each split; the log stays quiet and the one error names the folder."""
  variant = tmp_path / "tfds" / "imdb_reviews" / "plain_text" / "1.0.0"
  variant.mkdir(parents=True)
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "elsewhere"))
  for split in ("train", "validation"):
    with pytest.raises(tasks.MissingDataError) as err:
      tasks.get_task("text").examples(str(tmp_path), split, max_length=8)
    assert str(err.value).count("has no dataset_info.json") == 1 and str(variant) in str(err.value)
  assert not [r for r in caplog.records if "Variant folder" in r.getMessage()]


def test_pixels_only_for_pixel_tasks():
  with pytest.raises(config_lib.ConfigError, match="no float pixel inputs"):
    config_lib.load_config("smoke", "text", ["model.input_kind='pixels'"])


@pytest.mark.parametrize("task", ["text", "image"])
def test_tiny_training(tmp_path, task):
  overrides = {"data.max_length": 32, "data.options.limit": 0, "batch_size": 4, "num_train_steps": 2,
               "eval_every": 2, "checkpoint_every": 2, "log_every": 2, "model.num_layers": 1,
               "model.emb_dim": 16, "model.qkv_dim": 16, "model.mlp_dim": 16, "optimizer.warmup_steps": 1}
  config = config_lib.load_config("smoke", task, [f"{k}={v}" for k, v in overrides.items()])
  with mock_tfds(num_examples=8):
    record = cell.train_cell(config, str(tmp_path / "run"), str(tmp_path))
  assert record["status"] == "ok", record.get("error")
  assert record["data"]["test"]["num_examples"] == 8


def test_reading_data_prints_no_tensorflow_banner():
  """A process that imports TensorFlow to read data says nothing on stderr (TensorFlow's C++ layer
  printed its oneDNN banner twice, through absl's pre-init logging, in every such process)."""
  import os
  import subprocess
  import sys

  from lra_bench import REPO_ROOT

  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
  proc = subprocess.run([sys.executable, "-c", "from tasks.base import import_tf; "
                         "tf = import_tf(); print(tf.constant([1, 2]).numpy().sum())"],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and proc.stdout.strip() == "3", proc.stderr
  assert proc.stderr == "", proc.stderr
