"""Loading protocol configs: ``configs/<protocol>.py:get_config(task)``, locked, with overrides.

Overrides are ``key=value`` strings with dotted keys (``model.num_layers=2``, ``optimizer.learning_rate=1e-3``);
values are parsed as Python literals when possible. Unknown keys are errors, except below
``model.attention_kwargs`` (checked against the attention's config by the registry).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import pkgutil
from typing import Iterable

import ml_collections

import attention_zoo
import configs as _configs_pkg

OPEN_SECTIONS = ("model.attention_kwargs", "data.options", "data.prepare")


class ConfigError(ValueError):
  """A protocol, config key or value that does not exist or does not fit."""


def list_protocols() -> list[str]:
  return sorted(m.name for m in pkgutil.iter_modules(_configs_pkg.__path__) if not m.name.startswith("_"))


def _parse_value(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def apply_overrides(config: ml_collections.ConfigDict, overrides: Iterable[str]) -> None:
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r} is not of the form key=value")
    key, text = item.split("=", 1)
    key = key.strip()
    value = _parse_value(text.strip())
    parent_key, _, leaf = key.rpartition(".")
    try:
      parent = config
      for part in filter(None, parent_key.split(".")):
        parent = parent[part]
      if parent_key in OPEN_SECTIONS:
        with parent.unlocked():
          parent[leaf] = value
      else:
        if leaf not in parent:
          raise KeyError(leaf)
        current = parent[leaf]
        if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
          value = float(value)
        parent[leaf] = value
    except (KeyError, AttributeError):
      raise ConfigError(f"unknown config key {key!r}") from None
    except TypeError as err:
      raise ConfigError(f"bad value for {key!r}: {err}") from None


def load_config(protocol: str, task: str, overrides: Iterable[str] = ()) -> ml_collections.ConfigDict:
  """The locked config of ``task`` under ``protocol`` with ``overrides`` applied and checked."""
  if protocol not in list_protocols():
    raise ConfigError(f"unknown protocol {protocol!r}; known protocols: {', '.join(list_protocols())}")
  import tasks

  try:
    tasks.get_task(task)
  except ValueError as err:
    raise ConfigError(str(err)) from None
  module = importlib.import_module(f"configs.{protocol}")
  try:
    config = module.get_config(task)
  except ValueError as err:
    raise ConfigError(str(err)) from None
  config.lock()
  apply_overrides(config, overrides)
  validate(config)
  return config


def validate(config: ml_collections.ConfigDict) -> None:
  import tasks
  from lra_bench import parallel  # imports this module

  parallel.check_config(config)
  kind = config.model.get("input_kind", "tokens")
  if kind not in ("tokens", "pixels"):
    raise ConfigError(f"model.input_kind must be 'tokens' or 'pixels', got {kind!r}")
  if kind == "pixels" and not tasks.get_task(config.task).pixel_inputs:
    raise ConfigError(f"task {config.task!r} has no float pixel inputs; use model.input_kind='tokens'")
  try:
    attention_zoo.attention_config(config.model.attention, **dict(config.model.attention_kwargs))
  except (ValueError, TypeError) as err:
    raise ConfigError(str(err)) from None


def config_hash(config: ml_collections.ConfigDict) -> str:
  """Stable short hash of the whole config (what makes two runs comparable)."""
  return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
