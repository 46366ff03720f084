"""TFDS offline: ``tfds.testing.mock_data`` plus a prepared-looking builder, and fresh read caches."""

import contextlib
import os
from unittest import mock


class _RealFs:
  """Stands in for ``tfds.testing.test_utils.MockFs`` inside ``as_dataset``: MockFs redirects every epath
  call of the process into a temporary folder while it is active, including orbax's background thread
  that cleans up temporary checkpoint folders, which then fails on a path that does not exist. TFDS only
  uses it to make ``builder.data_dir`` exist; here that folder is under the test's tmp_path."""

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def add_file(self, path, content=None):
    os.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
      f.write(content or "")


@contextlib.contextmanager
def mock_tfds(num_examples):
  import tensorflow_datasets as tfds

  from tasks import image, tfds_data

  tfds_data.read_split.cache_clear()
  image.gray_split.cache_clear()
  with tfds.testing.mock_data(num_examples=num_examples), \
      mock.patch.object(tfds.core.DatasetBuilder, "is_prepared", return_value=True), \
      mock.patch.object(tfds.testing.test_utils, "MockFs", _RealFs):
    yield
  tfds_data.read_split.cache_clear()
  image.gray_split.cache_clear()
