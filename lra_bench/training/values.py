"""The checks of one config value, shared by every owner of a config section: each failure is one
``ConfigError`` line naming the key, the value and what is allowed.

``training.config.validate`` checks the keys every run has with them, the objectives check their own sections
(``training.objectives``: the ``pretrain`` section) and the benchmark its ``bench`` section. They live here, below
all of these, so that an objective can check its section without importing ``training.config``, which calls it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from lra_bench.errors import ConfigError

INT, FLOAT = "an integer", "a number"  # the kinds of ``check_number``: ints only (True is no batch size); int/float


def fail(key: str, value: Any, allowed: str) -> None:
  raise ConfigError(f"{key}={value!r} is not allowed; expected {allowed}")


def check_number(key: str, value: Any, kind: str, low: float, high: float | None, allowed: str,
                 open_low: bool = False, open_high: bool = False) -> None:
  """Raises ConfigError unless ``value`` is ``kind`` (an int; or an int/float) within the bounds."""
  expected = f"{kind} {allowed}".strip()
  numeric = (int,) if kind == INT else (int, float)
  if isinstance(value, bool) or not isinstance(value, numeric):
    fail(key, value, expected)
  if kind == FLOAT and not math.isfinite(value):
    fail(key, value, expected)
  if value < low or (open_low and value == low):
    fail(key, value, expected)
  if high is not None and (value > high or (open_high and value == high)):
    fail(key, value, expected)


def check_choice(key: str, value: Any, choices: Iterable[str]) -> None:
  choices = tuple(choices)
  if value not in choices:
    fail(key, value, f"one of {', '.join(choices)}")
