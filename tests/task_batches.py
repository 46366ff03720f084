"""Batches of one split of a task, for the tests: ``task.examples`` through ``tasks.base.batched``, as
``training.loop`` reads them (one process, one shard)."""

from tasks.base import SPLITS, batched


def dataset(task, data_dir: str, split: str, batch_size: int, *, max_length: int | None = None, seed: int = 0,
            repeat: bool = False, shuffle_buffer: int = 1024, **options):
  """Batched ``tf.data.Dataset`` of one split; deterministic given ``seed``."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
  examples = task.examples(data_dir, split, max_length=max_length or task.max_length, **options)
  return batched(examples, batch_size, seed=seed, repeat=repeat, shuffle_buffer=shuffle_buffer)
