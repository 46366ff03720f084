"""TFDS offline: ``tfds.testing.mock_data`` plus a prepared-looking builder, and fresh read caches."""

import contextlib
from unittest import mock


@contextlib.contextmanager
def mock_tfds(num_examples):
  import tensorflow_datasets as tfds

  from tasks import image, tfds_data

  tfds_data.read_split.cache_clear()
  image.gray_split.cache_clear()
  with tfds.testing.mock_data(num_examples=num_examples), \
      mock.patch.object(tfds.core.DatasetBuilder, "is_prepared", return_value=True):
    yield
  tfds_data.read_split.cache_clear()
  image.gray_split.cache_clear()
