"""Image: CIFAR-10 (TFDS ``cifar10``) in 8-bit grayscale, one token per pixel (1024), 10 classes.

Grayscale is LRA's ``tf.image.rgb_to_grayscale`` on the uint8 image, bit for bit:
``gray = floor(255.5 * (0.2989 R + 0.5870 G + 0.1140 B) / 255)`` in float32 (TF scales uint8 to [0, 1],
takes the weighted sum, and converts back by multiplying with 255.5 and truncating).

Inputs: ``tokens`` (default) are gray + 1 (vocab 257) so that black pixels are never padding (the
original LRA masked every black pixel: ``inputs > 0`` on raw intensities); ``pixels`` are floats
``(gray - 122.6) / 61`` (the S4 normalisation) for a dense input projection (``model.input_kind=pixels``).
Splits as LRA: train = ``train[:90%]`` (45k), validation = ``train[90%:]`` (5k), test = ``test`` (10k).
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from tasks import register_task, tfds_data
from tasks.base import PIXEL_VOCAB, DataError, Examples, Task, fit_length_fn, import_tf, pixel_inputs_fn

SPLITS = {"train": "train[:90%]", "validation": "train[90%:]", "test": "test"}
CIFAR_GRAY_MEAN, CIFAR_GRAY_STD = 122.6, 61.0  # on the 0..255 scale (S4's 122.6/255, 61/255)


def to_grayscale(images: np.ndarray) -> np.ndarray:
  """uint8 [N, H, W, 3] -> uint8 [N, H*W] with tf.image.rgb_to_grayscale (LRA's conversion)."""
  tf = import_tf()
  gray = tf.image.rgb_to_grayscale(tf.constant(images, tf.uint8)).numpy()
  return gray.reshape(len(images), -1)


@functools.lru_cache(maxsize=4)
def gray_split(split: str, tfds_dir: str) -> tuple[np.ndarray, np.ndarray]:
  data = tfds_data.read_split("cifar10", split, tfds_dir)
  return to_grayscale(data["image"]), data["label"].astype(np.int32)


@register_task
class Image(Task):
  name = "image"
  num_classes = 10
  vocab_size = PIXEL_VOCAB
  max_length = 1024
  pixel_inputs = True
  pixel_std = CIFAR_GRAY_STD
  chance_accuracy = 0.1
  dataset_name = "cifar10"

  def data_missing(self, data_dir: str, *, tfds_data_dir: str | None = None, **_) -> str | None:
    return tfds_data.missing(self.dataset_name, data_dir, tfds_data_dir)

  def prepare(self, data_dir: str, *, tfds_data_dir: str | None = None, **_) -> str:
    """Checks that CIFAR-10 is prepared for TFDS (nothing to generate) and says where."""
    found = tfds_data.find(self.dataset_name, self.name, data_dir, tfds_data_dir)
    return tfds_data.info(self.dataset_name, found)

  def examples(self, data_dir: str, split: str, *, max_length: int, input_kind: str = "tokens",
               tfds_data_dir: str | None = None, limit: int = 0) -> Examples:
    found = tfds_data.find(self.dataset_name, self.name, data_dir, tfds_data_dir)
    pixels, labels = gray_split(SPLITS[split], found)
    if limit:
      pixels, labels = pixels[:limit], labels[:limit]
    if not len(labels):
      raise DataError(f"cifar10 {SPLITS[split]} in {found} has no examples")
    num_truncated = len(labels) if max_length < pixels.shape[1] else 0
    if num_truncated:
      logging.warning("cifar10: images of %d pixels are truncated to max_length=%d", pixels.shape[1],
                      max_length)
    tf = import_tf()
    to_inputs = pixel_inputs_fn(input_kind, CIFAR_GRAY_MEAN, CIFAR_GRAY_STD)
    fit = fit_length_fn(max_length)
    ds = tf.data.Dataset.from_tensor_slices((pixels, labels)).map(
        lambda p, y: {"inputs": fit(to_inputs(p)), "targets": y}, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    return Examples(ds, len(labels), num_truncated, f"tfds:cifar10/{SPLITS[split]} ({found})")
