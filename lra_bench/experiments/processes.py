"""Worker processes that stop with the process that started them: signals, process trees, the kill.

The suite's local launcher and the benchmark's side-by-side workers both wait for child processes; a
SIGTERM or Ctrl-C of the waiting process must stop every one of them (and what they started) within
seconds and wait for them, so that nothing runs on and no lock stays held. Standard library only.

- ``Signals``: SIGTERM and SIGINT while children are started (recorded) and waited for (raised as
  ``Stopped``);
- ``descendants(pid)``, ``running(pid)``: a process tree and whether a process still runs (Linux ``/proc``);
- ``stop(pids, signum)``: the signal, a grace period, then SIGKILL to whatever still runs;
- ``die_with_parent()``: a ``preexec_fn`` that kills a child when its parent dies, however it dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, Iterable, Iterator

GRACE_S = 20.0  # how long stopped processes get to exit before they are killed
PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal a process gets when its parent thread dies


class Stopped(BaseException):
  """A SIGTERM or SIGINT reached a process that waits for its workers (``Signals``)."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum

  def exit(self, what: str) -> BaseException:
    """What to raise once the workers are stopped: ``KeyboardInterrupt`` for Ctrl-C (the CLI exits 130 with
    one line), else ``SystemExit(128 + signum)`` (143 for SIGTERM)."""
    if self.signum == signal.SIGINT:
      return KeyboardInterrupt(f"interrupted; {what}")
    return SystemExit(128 + self.signum)


class Signals:
  """SIGTERM and SIGINT: recorded while the workers are being started (so none is left half started),
  raised as ``Stopped`` once ``check()`` was called (while they are waited for); ``quiet()`` ignores
  further ones while the workers are being stopped. Main thread only (elsewhere it changes nothing)."""

  def __init__(self) -> None:
    self.received: int | None = None
    self.raising = False
    self.previous: dict[int, Any] = {}

  def __enter__(self) -> Signals:
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self.previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for signum, handler in self.previous.items():
      signal.signal(signum, handler)

  def _handle(self, signum, frame) -> None:
    if self.received is None:
      self.received = signum
    if self.raising:
      raise Stopped(signum)

  def check(self) -> None:
    """Raises ``Stopped`` for a signal received so far; from now on raises at once."""
    self.raising = True
    if self.received is not None:
      raise Stopped(self.received)

  def quiet(self) -> None:
    self.raising = False


def descendants(pid: int) -> list[int]:
  """Every process below ``pid`` (Linux ``/proc``; [] elsewhere or once it is gone)."""
  out, todo = [], [pid]
  while todo:
    parent = todo.pop()
    try:
      threads = os.listdir(f"/proc/{parent}/task")
    except OSError:
      continue
    for tid in threads:
      try:
        with open(f"/proc/{parent}/task/{tid}/children") as f:
          children = [int(p) for p in f.read().split()]
      except OSError:
        continue
      out += [child for child in children if child not in out]
      todo += children
  return out


def running(pid: int) -> bool:
  """Whether ``pid`` exists and is not a zombie (a zombie has exited and holds no file, lock included)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return False
    except PermissionError:
      return True
    return sys.platform != "linux"


def stop(pids: Iterable[int], signum: int | None = signal.SIGTERM, grace_s: float = GRACE_S,
         reap: Callable[[], None] | None = None) -> None:
  """Sends ``signum`` to each of ``pids`` (None: none, the caller asked them to stop its own way), waits up
  to ``grace_s`` for all of them to end (``reap()`` each round: the caller collects its children), then
  kills whatever still runs with SIGKILL and waits for that too."""
  pids = list(dict.fromkeys(pids))
  if signum is not None:
    for pid in pids:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)
  deadline = time.monotonic() + grace_s
  while True:
    if reap is not None:
      reap()
    if not any(map(running, pids)):
      return
    if time.monotonic() >= deadline:
      break
    time.sleep(0.1)
  for pid in pids:
    if running(pid):
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
  deadline = time.monotonic() + grace_s
  while any(map(running, pids)) and time.monotonic() < deadline:
    if reap is not None:
      reap()
    time.sleep(0.1)


@contextlib.contextmanager
def forking() -> Iterator[None]:
  """Starting a child with a ``preexec_fn`` (``die_with_parent``) forks; in a process that imported JAX
  Python warns that a fork of a multithreaded process may deadlock. The child only calls ``prctl`` (looked
  up before the fork) and then execs, so the warning is left out."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    yield


def die_with_parent() -> Callable[[], None] | None:
  """A ``preexec_fn`` making the child get SIGKILL when its parent dies, however it dies (Linux; None
  elsewhere). A SIGKILL is safe for the package's children: a cell resumes from its last committed
  checkpoint, a benchmark point without a record is measured again."""
  if not sys.platform.startswith("linux"):
    return None
  import ctypes

  prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it
  parent = os.getpid()

  def preexec() -> None:
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the parent died before the prctl took effect
      os.kill(os.getpid(), signal.SIGKILL)

  return preexec
