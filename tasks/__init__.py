"""tasks: the LRA tasks (docs/ARCHITECTURE.md, CONTRACT 2).

Each module in this package defines one task and registers it with ``@register_task``; every module is
imported here, so a new task is one new file.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from tasks.base import SPLITS, DataError, Examples, MissingDataError, MissingDependencyError, Task, default_data_dir

_TASKS: dict[str, Task] = {}


def register_task(cls):
  """Class decorator: registers one instance of a Task subclass under ``cls.name``."""
  _TASKS[cls.name] = cls()
  return cls


def get_task(name: str) -> Task:
  try:
    return _TASKS[name]
  except KeyError:
    raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(list_tasks())}") from None


def list_tasks() -> list[str]:
  return sorted(_TASKS)


def is_next_token(name: str) -> bool:
  """Whether ``name`` is a registered next-token (recall) task; False for any other or unknown name."""
  return name in _TASKS and _TASKS[name].objective == "next_token"


for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
  if _info.name != "base":
    _importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["SPLITS", "DataError", "Examples", "MissingDataError", "MissingDependencyError", "Task", "default_data_dir",
           "get_task", "is_next_token", "list_tasks", "register_task"]
