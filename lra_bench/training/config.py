"""Run configs: ``configs/<protocol>.py:get_config(task)``, locked, with typed overrides, validated once.

``load_config(protocol, task, overrides, attention=..., seed=...)`` is the only way a config is made:
the attention and the seed are arguments (never formatted into override strings), and every override
``key=value`` is parsed by the type of the field it replaces (``batch_size=8`` an int,
``precision=bfloat16`` a string, ``optimizer.learning_rate=1e-3`` a float; quotes around strings are
optional). Unknown keys are errors, except below the open sections ``OPEN_SECTIONS``: a new key of
``model.attention_kwargs`` is parsed by the type of the attention config's field of that name (and
checked by the registry), a new key of ``data.options`` / ``data.prepare`` as a Python literal, else as
text. ``validate`` holds every check a config can have without knowing the devices.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import json
import pkgutil
import typing
from typing import Any, Callable, Iterable

import ml_collections
from absl import flags
from ml_collections.config_flags import config_path

import attention_zoo
import configs as _configs_pkg
import tasks as tasks_lib

OPEN_SECTIONS = ("model.attention_kwargs", "data.options", "data.prepare")
PARAM_SHARDINGS = ("replicated", "fsdp")
PRECISIONS = ("float32", "bfloat16")  # compute dtype; parameters, softmax, norms and the loss stay float32


class ConfigError(ValueError):
  """A protocol, config key or value that does not exist or does not fit."""


def list_protocols() -> list[str]:
  return sorted(m.name for m in pkgutil.iter_modules(_configs_pkg.__path__) if not m.name.startswith("_"))


def _literal(text: str) -> Any:
  """A Python literal (``true``/``false`` too), else the text itself."""
  try:
    return ast.literal_eval({"true": "True", "false": "False"}.get(text, text))
  except (ValueError, SyntaxError):
    return text


def _unquote(text: str) -> str:
  if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
    return text[1:-1]
  return text


_PARSERS: dict[type, Callable[[str], Any]] = {
    bool: flags.BooleanParser().parse, int: flags.IntegerParser().parse,
    float: flags.FloatParser().parse, str: _unquote,
    tuple: lambda text: tuple(_literal(text)), list: lambda text: list(_literal(text)),
}


def parse_typed(text: str, kind: type | None) -> Any:
  """``text`` as a value of type ``kind`` (None or an unknown type: a literal, else the text)."""
  origin = typing.get_origin(kind) or kind
  if origin is typing.Union:  # Optional[X] and X | None: parse as X unless the text says None
    if text == "None":
      return None
    origin = next((typing.get_origin(a) or a for a in typing.get_args(kind) if a is not type(None)), None)
  parser = _PARSERS.get(origin) if isinstance(origin, type) else None
  return parser(text) if parser else _literal(text)


def _attention_field_type(config: ml_collections.ConfigDict, field: str) -> type | None:
  cls = type(attention_zoo.attention_config(config.model.attention))
  return typing.get_type_hints(cls).get(field) if field in {f.name for f in dataclasses.fields(cls)} else None


def apply_overrides(config: ml_collections.ConfigDict, overrides: Iterable[str]) -> None:
  """Applies ``key=value`` strings, each parsed by the type of the field it replaces (module docstring)."""
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r} is not of the form key=value")
    key, text = (part.strip() for part in item.split("=", 1))
    parent_key, _, leaf = key.rpartition(".")
    try:
      section = config_path.get_value(parent_key, config) if parent_key in OPEN_SECTIONS else None
      if section is not None and leaf not in section:
        kind = _attention_field_type(config, leaf) if parent_key == OPEN_SECTIONS[0] else None
        with section.unlocked():
          section[leaf] = parse_typed(text, kind)
        continue
      kind = config_path.get_type(key, config)
      config_path.set_value(key, config, parse_typed(text, None if kind is type(None) else kind))
    except (KeyError, AttributeError):
      raise ConfigError(f"unknown config key {key!r}") from None
    except (TypeError, ValueError, flags.Error) as err:
      raise ConfigError(f"bad value for {key!r}: {err}") from None


def load_config(protocol: str, task: str, overrides: Iterable[str] = (), *, attention: str | None = None,
                seed: int | None = None,
                extend: Callable[[ml_collections.ConfigDict], None] | None = None) -> ml_collections.ConfigDict:
  """The locked, validated config of ``task`` under ``protocol``.

  ``attention`` / ``seed`` replace the protocol's; ``extend(config)`` may add sections (the benchmark's
  ``bench``) before ``overrides`` are applied, so those sections can be overridden too.
  """
  if protocol not in list_protocols():
    raise ConfigError(f"unknown protocol {protocol!r}; known protocols: {', '.join(list_protocols())}")
  try:
    tasks_lib.get_task(task)
    config = importlib.import_module(f"configs.{protocol}").get_config(task)
  except ValueError as err:
    raise ConfigError(str(err)) from None
  if attention is not None:
    config.model.attention = attention
  if seed is not None:
    config.seed = int(seed)
  if extend is not None:
    extend(config)
  config.lock()
  apply_overrides(config, overrides)
  validate(config)
  return config


def validate(config: ml_collections.ConfigDict) -> None:
  """Every check that needs no devices: scale-out fields, input kind, the attention and its kwargs."""
  if config.precision not in PRECISIONS:
    raise ConfigError(f"unknown precision {config.precision!r}; expected one of {PRECISIONS}")
  if config.param_sharding not in PARAM_SHARDINGS:
    raise ConfigError(f"unknown param_sharding {config.param_sharding!r}; expected one of {PARAM_SHARDINGS}")
  if config.accumulate_steps < 1 or config.batch_size % config.accumulate_steps:
    raise ConfigError(f"batch_size {config.batch_size} is not a positive multiple of accumulate_steps "
                      f"{config.accumulate_steps}")
  kind = config.model.input_kind
  if kind not in tasks_lib.base.INPUT_KINDS:
    raise ConfigError(f"model.input_kind must be one of {tasks_lib.base.INPUT_KINDS}, got {kind!r}")
  if kind == "pixels" and not tasks_lib.get_task(config.task).pixel_inputs:
    raise ConfigError(f"task {config.task!r} has no float pixel inputs; use model.input_kind='tokens'")
  try:
    attention_zoo.attention_config(config.model.attention, **dict(config.model.attention_kwargs))
  except (ValueError, TypeError) as err:
    raise ConfigError(str(err)) from None


def config_hash(config: ml_collections.ConfigDict) -> str:
  """Stable short hash of the whole config (what makes two runs comparable)."""
  return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
