"""The console progress of one stage: a bar on a terminal, one line per finished unit elsewhere.

The one progress display of the package (data preparation, the suite, the benchmark, the report), kept here
at the bottom layer so that the data generators use it too. On a terminal it is a tqdm bar whose time left
comes from the caller (``remaining``: the suite counts only the cells that train, the benchmark the points
still to measure at their lengths' measured times); where the stream is not a terminal (CI, ``> log``) it
prints one line per finished unit (or per ``every`` units) instead. Either way a heartbeat keeps the console
alive while a long unit runs: on a terminal the bar is redrawn every second, elsewhere a ``still running``
line is printed after ``HEARTBEAT_S`` seconds without output.

  bar = Progress(53, "suite cpu", "cells", remaining=lambda: estimate)
  bar.set_status("listops/vanilla/seed0")
  bar.advance(note="listops/vanilla/seed0 ok in 95 s")
  bar.close()
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, TextIO

HEARTBEAT_S = 30.0   # elsewhere than a terminal: a line at least this often while work goes on
REDRAW_S = 1.0       # on a terminal: the bar (elapsed, the running unit's time) redrawn this often


def clock(seconds: float | None) -> str:
  """``1:05``, ``1:02:03`` (hours when needed); ``?`` for None."""
  if seconds is None:
    return "?"
  seconds = max(0, int(round(seconds)))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def is_terminal(stream: TextIO) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False


class Progress:
  """A stage's progress (module docstring). ``total``: the units the stage will finish (``set_total``
  changes it); ``remaining()``: seconds left, or None when unknown (default: the mean time of a finished
  unit times the units left); ``every``: elsewhere than a terminal, a line each ``every`` units (and at
  the last); ``enabled=False`` prints nothing."""

  def __init__(self, total: int, desc: str, unit: str = "", *, remaining: Callable[[], float | None] | None = None,
               enabled: bool = True, stream: TextIO | None = None, every: int = 1,
               heartbeat_s: float | None = None, initial: int = 0):
    self.total, self.desc, self.unit = int(total), desc, unit
    self.n, self.initial = int(initial), int(initial)
    self.enabled, self.every = enabled, max(1, int(every))
    self.heartbeat_s = env_heartbeat() if heartbeat_s is None else heartbeat_s
    self.stream = stream if stream is not None else sys.stderr
    self.terminal = enabled and is_terminal(self.stream)
    self.remaining_fn = remaining
    self.status, self.status_since, self.extra = "", time.monotonic(), ""
    self.start = self.last_line = time.monotonic()
    self._lock = threading.RLock()
    self._stop = threading.Event()
    self._bar = None
    if self.terminal:
      from tqdm import tqdm

      self._bar = tqdm(total=self.total, initial=self.n, desc=desc, unit=unit or "it", file=self.stream,
                       dynamic_ncols=True, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                       "{unit} [{elapsed}{postfix}]")
      self._refresh()
    self._thread = None
    if enabled:
      self._thread = threading.Thread(target=self._beat, name=f"progress {desc}", daemon=True)
      self._thread.start()

  # -- what the caller tells
  def set_total(self, total: int) -> None:
    with self._lock:
      self.total = max(int(total), self.n)
      if self._bar is not None:
        self._bar.total = self.total
        self._refresh()

  def set_status(self, text: str, since: float | None = None) -> None:
    """What runs now, shown with how long it has run: since ``since`` (``time.monotonic()``), else since
    the status last changed."""
    with self._lock:
      if text != self.status or since is not None:
        self.status, self.status_since = text, time.monotonic() if since is None else since
      self._refresh()

  def set_extra(self, text: str) -> None:
    """A fixed part shown after the counts (``no data 0/155``)."""
    with self._lock:
      self.extra = text
      self._refresh()

  def advance(self, n: int = 1, note: str = "") -> None:
    """``n`` units finished; ``note`` says which (elsewhere than a terminal it is part of the line)."""
    with self._lock:
      self.n += n
      if self._bar is not None:
        self._bar.update(n)  # tqdm redraws at most every 0.1 s; the heartbeat refreshes the rest
        if note:
          self._refresh()
      elif self.enabled and (self.n % self.every < n or self.n >= self.total or note):
        self._line(note)

  def write(self, line: str, file: TextIO | None = None) -> None:
    """A message of its own, to ``file`` (default: the bar's stream), above the bar on a terminal; written
    also when the bar is disabled (the messages are the command's output, the bar only its progress)."""
    target = file if file is not None else self.stream
    with self._lock:
      if self._bar is not None:
        self._bar.write(line, file=target)
      else:
        target.write(line + "\n")
        target.flush()
        if target is self.stream:
          self.last_line = time.monotonic()

  def close(self) -> None:
    self._stop.set()
    if self._thread is not None and self._thread is not threading.current_thread():
      self._thread.join(timeout=5)
    with self._lock:
      self.status = ""  # nothing runs any more
      if self._bar is not None:
        self._refresh()
        self._bar.close()
        self._bar = None

  def __enter__(self) -> Progress:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- what is shown
  def seconds_left(self) -> float | None:
    if self.remaining_fn is not None:
      return self.remaining_fn()
    done = self.n - self.initial
    if done <= 0:
      return None
    return (time.monotonic() - self.start) / done * max(0, self.total - self.n)

  def _parts(self, running: bool) -> list[str]:
    parts = [self.extra] if self.extra else []
    if running and self.status:
      parts.append(f"running {self.status} ({clock(time.monotonic() - self.status_since)})")
    left = self.seconds_left() if self.n < self.total else None
    if left is not None:
      parts.append(f"~{clock(left)} left")
    return parts

  def _refresh(self) -> None:
    if self._bar is not None:
      self._bar.set_postfix_str("; ".join(self._parts(running=True)), refresh=True)

  def _line(self, note: str = "", running: bool = False) -> None:
    counts = f"{self.desc}: {self.n}/{self.total}" + (f" {self.unit}" if self.unit else "")
    parts = ([note] if note else []) + self._parts(running) + [f"{clock(time.monotonic() - self.start)} elapsed"]
    self._print(f"{counts}: {'; '.join(parts)}")

  def _print(self, line: str) -> None:
    self.stream.write(line + "\n")
    self.stream.flush()
    self.last_line = time.monotonic()

  def _beat(self) -> None:
    tick = REDRAW_S if self.terminal else min(REDRAW_S * 5, self.heartbeat_s)
    while not self._stop.wait(tick):
      with self._lock:
        if self._stop.is_set():
          return
        if self._bar is not None:
          self._refresh()
        elif time.monotonic() - self.last_line >= self.heartbeat_s:
          self._line(running=True)


def env_heartbeat() -> float:
  """``HEARTBEAT_S``, or ``$LRA_BENCH_HEARTBEAT_S`` where set (a test's short heartbeat)."""
  try:
    return float(os.environ.get("LRA_BENCH_HEARTBEAT_S", HEARTBEAT_S))
  except ValueError:
    return HEARTBEAT_S
