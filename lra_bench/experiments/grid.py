"""The words of a grid: comma lists of names and numbers, and the console lines of failed points.

The one owner of comma-list parsing: the suite and the benchmark read their ``tasks`` / ``attentions`` /
``seeds`` / ``lengths`` arguments with ``parse_names`` / ``parse_ints``, and the CLI's flag types
(``cli.names``, ``cli.int_list``) split with ``items``. Standard library only, so the CLI's parser can
import it before any command runs.
"""

from __future__ import annotations

from typing import Sequence


def items(text: str, noun: str = "item", expected: str = "a comma list") -> list[str]:
  """The stripped items of the comma list ``text``; a ValueError (``'a,,b' has an empty item; expected
  ...``) if it is empty or has an empty item."""
  parts = [item.strip() for item in text.split(",")]
  if not text.strip() or any(not item for item in parts):
    raise ValueError(f"{text!r} has an empty {noun}; expected {expected}")
  return parts


def parse_names(text: str | Sequence[str] | None, known: Sequence[str], what: str) -> list[str]:
  """``all`` (or empty) -> ``known``; else a comma list (empty items dropped), each checked against
  ``known``."""
  if text is None or text == "" or text == "all" or list(text) == ["all"]:
    return list(known)
  names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ValueError(f"unknown {what} {', '.join(map(repr, unknown))}; known {what}s: {', '.join(known)}")
  return names


def parse_ints(text: str | Sequence[int]) -> list[int]:
  """A comma (or space) separated list of integers, or a sequence of them."""
  if isinstance(text, str):
    try:
      return [int(x) for x in text.replace(" ", ",").split(",") if x]
    except ValueError:
      raise ValueError(f"expected a comma-separated list of integers, got {text!r}") from None
  return [int(x) for x in text]


def failure_line(name: str, record: dict) -> str:
  """``name: status: first line of the error`` for the console."""
  error = (record.get("error") or "").strip()
  return f"{name}: {record['status']}: {error.splitlines()[0][:200] if error else 'no reason recorded'}"


NAMES_SHOWN = 10  # a console list of names stops here: "..., and N more"


def name_list(names: Sequence[str], limit: int = NAMES_SHOWN) -> str:
  """``a, b, c`` for the console: the first ``limit`` names, then ``... and N more``."""
  shown = ", ".join(names[:limit])
  return shown + (f", ... and {len(names) - limit} more" if len(names) > limit else "")


def one_line(error: str | None) -> str:
  """A recorded error as one console line: its lines (a reason, then the command that fixes it) joined,
  nothing cut, so the command can be copied."""
  return " ".join(line.strip() for line in (error or "").splitlines() if line.strip()) or "no reason recorded"


def group_line(status: str, group: str, count: int, error: str | None) -> str:
  """``status: group (N cells): the whole error on one line``: the one console line of many points that
  failed for one reason (the cells of a task without data)."""
  return f"{status}: {group} ({count} cell{'' if count == 1 else 's'}): {one_line(error)}"
