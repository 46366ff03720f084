"""Files written whole or not at all: the package's one atomic writer (and its one path normaliser).

``write_atomic(path, data)`` writes ``data`` to a temporary file beside ``path`` (one checked
``os.write``, fsynced), gives it the mode ``open(path, "w")`` would (``0o666`` less the umask: 0644
under the usual umask 022, so teammates on a shared filesystem can read a record; ``tempfile.mkstemp``
alone makes every file 0600) and renames it over ``path``. On any failure, an interrupt included, the
temporary file is removed and ``path`` is as it was; the ``OSError`` propagates for the caller to name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile


def absolute(path: str) -> str:
  """``path`` made absolute, ``~`` expanded: the package's one path normaliser. orbax refuses relative
  checkpoint paths, and a record must name its directories wherever it is read from."""
  return os.path.abspath(os.path.expanduser(path))


def umask() -> int:
  """This process's umask, read without changing it (Linux ``/proc``), else by setting and restoring it."""
  with contextlib.suppress(OSError, ValueError):
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def write_all(fd: int, data: bytes) -> None:
  """One ``os.write`` of ``data``, fsynced; a short write is an error (``ENOSPC``), never a partial file."""
  written = os.write(fd, data)
  if written != len(data):
    raise OSError(errno.ENOSPC, f"short write: {written} of {len(data)} bytes")
  os.fsync(fd)


def write_atomic(path: str, data: bytes | str, *, prefix: str = ".tmp-", suffix: str = "") -> None:
  """Writes ``data`` to ``path`` via a temporary file and ``os.replace`` (module docstring)."""
  if isinstance(data, str):
    data = data.encode()
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
  try:
    try:
      os.fchmod(fd, 0o666 & ~umask())
      write_all(fd, data)
    finally:
      os.close(fd)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise
