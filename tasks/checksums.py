"""The checksums of generated data: the ONE implementation the generated tasks (ListOps, Pathfinder / Path-X,
the recall tasks) share.

A prepare records each file's sha256 in the metadata that marks its data complete; a prepare that finds a
file whose digest differs (cut short, overwritten) names it and generates it again, and a read (training)
refuses it with the command that does. Data prepared before the checksums were kept is not refused: a
prepare that finds it whole adds them.

Reading stays fast: a file's digest is cached in the process by (path, size, mtime), so the splits of one
run, or its evaluations, hash a file once; the metadata file names the digests, this module compares them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from typing import Iterable, Mapping

KEY = "sha256"  # the metadata entry that holds {file: hex sha256}


def digest(data: bytes) -> str:
  """The hex sha256 of ``data`` (a file's bytes the caller holds: written or read already)."""
  return hashlib.sha256(data).hexdigest()


def sha256(path: str) -> str:
  """The hex sha256 of the file ``path`` (read in 1 MiB blocks)."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


@functools.lru_cache(maxsize=1024)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
  del size, mtime_ns  # the cache key: a file changed since is hashed again
  return sha256(path)


def cached_sha256(path: str) -> str:
  """``sha256(path)``, hashed once per process while the file's size and mtime stay the same."""
  stat = os.stat(path)
  return _cached_sha256(path, stat.st_size, stat.st_mtime_ns)


def checksum_problem(path: str, sums, key: str | None = None, *, data: bytes | None = None,
                     source: str = "the metadata beside it") -> str | None:
  """Why ``path`` is not the file whose sha256 ``sums[key]`` holds (``key``: the file's base name by
  default), in words for an error message; None when it is, or when ``sums`` is not a mapping (data
  prepared before checksums were kept). ``data``: the file's bytes, when the caller has read them (hashed
  as they are, not read again); ``source``: how the message names the file that holds ``sums``."""
  if not isinstance(sums, Mapping):
    return None
  key = os.path.basename(path) if key is None else key
  expected = sums.get(key)
  if not isinstance(expected, str):
    return f"no checksum for it in {source} ({key} is not listed)"
  if data is None:
    if not os.path.exists(path):
      return "missing"
    actual, size = cached_sha256(path), os.path.getsize(path)
  else:
    actual, size = digest(data), len(data)
  if actual != expected:
    return (f"damaged: its sha256 is {actual[:16]}..., {source} says {expected[:16]}... ({size} bytes; cut "
            "short or overwritten since it was generated)")
  return None


def write_json(path: str, data) -> None:
  """Writes ``data`` as indented JSON to ``path`` all or nothing: a temporary ``<path>.tmp-<pid>`` (the
  form the tasks' clean-ups recognise as a killed process's), fsynced, renamed over ``path``."""
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w") as f:
      f.write(json.dumps(data, indent=1) + "\n")
      f.flush()
      os.fsync(f.fileno())  # on disk before it marks anything complete
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def add_checksums(meta_path: str, meta: dict, paths: Iterable[str]) -> dict:
  """Writes the sha256 of ``paths`` (keyed by base name) into the metadata ``meta`` read from ``meta_path``,
  which was written before checksums were kept and whose files the caller found whole. Returns the new
  metadata. A data dir that cannot be written (read-only) keeps its data usable, unchecked: logged."""
  meta = dict(meta, **{KEY: {os.path.basename(path): sha256(path) for path in paths}})
  try:
    write_json(meta_path, meta)
  except OSError as err:
    logging.warning("%s: could not add the data files' checksums (%s)", meta_path, err)
  return meta
