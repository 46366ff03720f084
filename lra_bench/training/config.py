"""Run configs: ``configs/<protocol>.py:get_config(task)``, locked, with typed overrides, validated once.

``load_config(protocol, task, overrides, attention=..., seed=...)`` is the only way a config is made:
the attention and the seed are arguments (never formatted into override strings), and every override
``key=value`` is parsed by the type of the field it replaces (``batch_size=8`` an int, ``precision=bfloat16``
a string, ``optimizer.learning_rate=1e-3`` a float; quotes around strings are optional). ``protocol`` and
``task`` are never overrides (``FIXED_KEYS``: they name the preset, so a smoke run cannot be relabelled
``lra``). Unknown keys are errors, except below the open sections ``OPEN_SECTIONS``: a new key of
``model.attention_kwargs`` is parsed by the type of the attention config's field of that name (and checked by
the registry), a new key of ``data.options`` / ``data.prepare`` as a Python literal, else as text.
``validate`` holds every check a config can have without knowing the devices: each key's type and
range (``NUMERIC_KEYS``; True is not a batch size), the names (precision, pooling, schedule factors ...),
the open sections against what the task and the attention core take, and the cross-key rules; each
failure is one line naming the key, the value and what is allowed, raised before the first step. The
words come from the modules that use them (``optim.SCHEDULE_FACTORS``, ``parallel.PARAM_SHARDINGS``,
``models.POOLINGS``, ``tasks.base.PREPARE_RANGES``); the optional sections the objectives own (``pretrain``)
are parsed, completed and checked by them (``objectives.SECTIONS``, ``complete``, ``validate``), so this module
never learns their keys; a section added by a caller (the benchmark's ``bench``) is checked by the caller's own
``checks``, which ``load_config`` runs after these.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import inspect
import json
import math
import typing
from typing import Any, Callable, Iterable, Sequence

import ml_collections
from absl import flags
from ml_collections.config_flags import config_path

import attention_zoo
import configs as _configs_pkg
import tasks as tasks_lib
from lra_bench.errors import ConfigError
from lra_bench.training.values import FLOAT, INT, check_choice, check_number, fail
from tasks.base import MAX_SEED, PREPARE_RANGES

OPEN_SECTIONS = ("model.attention_kwargs", "data.options", "data.prepare")
# ``precision``: the compute dtype (activations and matmuls; parameters, optimizer state, softmax, norms and the
# loss stay float32). "auto" is resolved when the run starts (``steps.compute_dtype``): bfloat16 on a GPU or TPU,
# float32 on the CPU; the records name what ran (``compute_dtype``). docs/usage.md, "Precision".
PRECISIONS = ("auto", "float32", "bfloat16")
# Keys that say what a run is: they come from load_config's arguments (the --protocol / --task flags),
# never from an override, so a 60-step smoke run cannot be relabelled as an LRA run.
FIXED_KEYS = {"protocol": "--protocol", "task": "--task"}
# Keys that change how often a run logs or checkpoints but not its numbers (resume is exact whatever the
# checkpoint cadence), so a run may be continued with other values and is the same run: an override of one
# is kept, and the preset's value stored beside it under ``PRESET_CADENCE`` (present only then), so that
# ``config_hash`` names the run as the preset's values would (its workdir, its record) while the loop reads
# the override. Every other key must match (``checkpoints.config_differences``).
RESULT_NEUTRAL_KEYS = ("log_every", "checkpoint_every")
PRESET_CADENCE = "preset_cadence"


list_protocols = _configs_pkg.list_protocols


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
  cls = type(attention_zoo.layer_config(config.model.attention))
  return typing.get_type_hints(cls).get(field) if field in {f.name for f in dataclasses.fields(cls)} else None


def apply_overrides(config: ml_collections.ConfigDict, overrides: Iterable[str]) -> None:
  """Applies ``key=value`` strings, each parsed by the type of the field it replaces (module docstring)."""
  sections = optional_sections()
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r} is not of the form key=value")
    key, text = (part.strip() for part in item.split("=", 1))
    if key in FIXED_KEYS:
      raise ConfigError(f"override {item!r}: {key!r} cannot be overridden, it names the preset the config "
                        f"comes from; choose it with {FIXED_KEYS[key]} instead")
    parent_key, _, leaf = key.rpartition(".")
    if parent_key in sections and leaf not in config.get(parent_key, {}):
      if leaf not in sections[parent_key]:
        raise ConfigError(f"unknown config key {key!r}; {parent_key} takes: {', '.join(sections[parent_key])}")
      if parent_key not in config:
        with config.unlocked():  # an optional section (its keys' defaults are filled in by load_config)
          config[parent_key] = ml_collections.ConfigDict()
      with config[parent_key].unlocked():
        config[parent_key][leaf] = parse_typed(text, sections[parent_key][leaf])
      continue
    if key in OPTIONAL_KEYS and leaf not in config_path.get_value(parent_key, config):
      section = config_path.get_value(parent_key, config)
      with section.unlocked():  # an optional key a protocol's config leaves out (its default applies)
        section[leaf] = parse_typed(text, OPTIONAL_KEYS[key])
      continue
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
                seed: int | None = None, extend: Callable[[ml_collections.ConfigDict], None] | None = None,
                checks: Sequence[Callable[[ml_collections.ConfigDict], None]] = ()) -> ml_collections.ConfigDict:
  """The locked, validated config of ``task`` under ``protocol``.

  ``attention`` / ``seed`` replace the protocol's (an override ``model.attention=...`` chooses the
  attention too); the protocol's per-attention settings (``attention_settings(config)`` of its module,
  e.g. what LRA ran for that model on that task) are applied next; ``extend(config)`` may add sections
  (the benchmark's ``bench``), and ``checks`` validate them (each raises ``ConfigError``) after
  ``validate``; ``overrides`` come last, so they win over all of these.
  """
  if protocol not in list_protocols():
    raise ConfigError(f"unknown protocol {protocol!r}; known protocols: {', '.join(list_protocols())}")
  try:
    tasks_lib.get_task(task)
    config = importlib.import_module(f"configs.{protocol}").get_config(task)
  except ValueError as err:
    raise ConfigError(str(err)) from None
  overrides = list(overrides)
  attention = attention if attention is not None else _overridden(overrides, "model.attention")
  if attention is not None:
    config.model.attention = attention
  apply_settings(config, protocol_settings(protocol, config))
  if seed is not None:
    config.seed = int(seed)
  if extend is not None:
    extend(config)
  config.lock()
  preset = {key: config.get(key) for key in RESULT_NEUTRAL_KEYS}
  apply_overrides(config, overrides)
  moved = {key: value for key, value in preset.items() if config.get(key) != value}
  if moved:
    with config.unlocked():
      config[PRESET_CADENCE] = moved
  complete_optional_sections(config)
  validate(config)
  for check in checks:
    check(config)
  return config


def _overridden(overrides: list[str], key: str) -> str | None:
  """The (unquoted) value the last ``key=value`` of ``overrides`` gives ``key``, else None."""
  values = [item.split("=", 1)[1].strip() for item in overrides
            if "=" in item and item.split("=", 1)[0].strip() == key]
  return _unquote(values[-1]) if values else None


def protocol_settings(protocol: str, config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Config key -> value that ``protocol`` sets for ``config``'s attention and task (``{}`` if the
  protocol module has no ``attention_settings``)."""
  settings = getattr(importlib.import_module(f"configs.{protocol}"), "attention_settings", None)
  return dict(settings(config)) if settings is not None else {}


def protocol_sweep(protocol: str, task: str) -> dict[str, list[dict[str, Any]]]:
  """The sweep a protocol declares for ``task``: its module's ``sweep(task)``, axis name -> points, each
  point the config values it sets (several keys move together: a recall task's length, its number of
  keys and the model's length are one axis); ``{}`` without one."""
  declared = getattr(importlib.import_module(f"configs.{protocol}"), "sweep", None)
  return {axis: [dict(point) for point in points] for axis, points in (declared(task) if declared else {}).items()}


def sweep_points(axes: dict[str, list[dict[str, Any]]]) -> list[tuple[tuple[str, ...], str]]:
  """(overrides, label) per point of the product of ``axes`` (axis name -> points, each the config values it
  sets), in axis order; labels read ``axis=value`` (the value of the point's first key). One point ((), "")
  without an axis."""
  import itertools

  if not axes:
    return [((), "")]
  names = list(axes)
  points = []
  for combo in itertools.product(*(axes[name] for name in names)):
    sets = tuple(f"{key}={value}" for point in combo for key, value in point.items())
    label = ",".join(f"{name}={next(iter(point.values()))}" for name, point in zip(names, combo))
    points.append((sets, label))
  return points


def protocol_runs(protocol: str, task: str) -> list[ml_collections.ConfigDict]:
  """The configs of ``protocol``'s runs of ``task``: one per point of its sweep (``sweep_points`` of
  ``protocol_sweep``: the cells a suite runs), the preset's alone without a sweep. What their data need is
  ``tasks.plan``'s."""
  return [load_config(protocol, task, list(sets)) for sets, _ in sweep_points(protocol_sweep(protocol, task))]


def apply_settings(config: ml_collections.ConfigDict, settings: dict[str, Any]) -> None:
  """Sets dotted ``key: value`` pairs on an unlocked config (new keys only below ``OPEN_SECTIONS`` and
  the ``OPTIONAL_KEYS``, so a preset that needs one leaves the other cells' configs unchanged)."""
  for key, value in settings.items():
    parent, _, leaf = key.rpartition(".")
    section = config_path.get_value(parent, config) if parent else config
    if leaf not in section and parent not in OPEN_SECTIONS and key not in OPTIONAL_KEYS:
      raise ConfigError(f"protocol setting {key!r} is not a config key")
    section[leaf] = value


# Ranges of the numeric keys: (key, kind, low, high, what). ``int`` keys take Python ints only (True is
# not a batch size); ``float`` keys take ints or floats, finite. ``closed`` bounds are allowed values.
NUMERIC_KEYS: tuple[tuple[str, str, float, float | None, str], ...] = (
    ("seed", INT, 0, MAX_SEED, "in [0, 2**31 - 1]"),
    ("batch_size", INT, 1, None, ">= 1"),
    ("accumulate_steps", INT, 1, None, ">= 1"),
    ("num_train_steps", INT, 1, None, ">= 1"),
    ("eval_every", INT, 1, None, ">= 1"),
    ("log_every", INT, 1, None, ">= 1"),
    ("checkpoint_every", INT, 1, None, ">= 1"),
    ("model.num_layers", INT, 1, None, ">= 1"),
    ("model.num_heads", INT, 1, None, ">= 1"),
    ("model.emb_dim", INT, 1, None, ">= 1"),
    ("model.qkv_dim", INT, 1, None, ">= 1"),
    ("model.mlp_dim", INT, 1, None, ">= 1"),
    ("model.dropout_rate", FLOAT, 0.0, 1.0, "in [0, 1)"),
    ("model.attention_dropout_rate", FLOAT, 0.0, 1.0, "in [0, 1)"),
    ("model.embed_dropout_rate", FLOAT, 0.0, 1.0, "in [0, 1)"),      # optional (next-token models)
    ("model.embed_init_std", FLOAT, 0.0, None, "> 0"),               # optional (next-token models)
    ("model.dense_init_std", FLOAT, 0.0, None, "> 0"),               # optional (GPT-2 initialisation)
    ("model.mlp_hidden_dropout_rate", FLOAT, 0.0, 1.0, "in [0, 1)"),  # optional (Mega's act_dropout)
    ("model.head_dropout_rate", FLOAT, 0.0, 1.0, "in [0, 1)"),        # optional (Mega's classifier)
    ("model.batch_norm_momentum", FLOAT, 0.0, 1.0, "in [0, 1)"),      # optional (S5, LRU)
    ("model.first_real_id", INT, 1, None, ">= 1"),                    # optional (Xiong's pixel padding)
    ("data.max_length", INT, 1, None, ">= 1"),
    ("data.shuffle_buffer", INT, 1, None, ">= 1"),
    ("optimizer.learning_rate", FLOAT, 0.0, None, "> 0"),
    ("optimizer.warmup_steps", INT, 0, None, ">= 0"),
    ("optimizer.steps_per_cycle", INT, 1, None, ">= 1"),
    ("optimizer.weight_decay", FLOAT, 0.0, None, ">= 0"),
    ("optimizer.b1", FLOAT, 0.0, 1.0, "in [0, 1)"),
    ("optimizer.b2", FLOAT, 0.0, 1.0, "in [0, 1)"),
    ("optimizer.eps", FLOAT, 0.0, None, "> 0"),
    ("optimizer.grad_clip_norm", FLOAT, 0.0, None, ">= 0 (0 = no clipping)"),
    ("optimizer.ssm_learning_rate", FLOAT, 0.0, None, "> 0"),       # optional (SSM recipes)
    ("optimizer.ssm_weight_decay", FLOAT, 0.0, None, ">= 0"),        # optional (SSM recipes)
    ("optimizer.cosine_floor", FLOAT, 0.0, 1.0, "in [0, 1)"),         # optional (timm_cosine)
)
# Bounds that are not allowed themselves: learning_rate > 0, eps > 0, rates and betas < 1.
_OPEN_LOW = {"optimizer.learning_rate", "optimizer.eps", "model.embed_init_std", "model.dense_init_std",
             "optimizer.ssm_learning_rate"}
_OPEN_HIGH = {"model.dropout_rate", "model.attention_dropout_rate", "model.embed_dropout_rate", "optimizer.b1",
              "optimizer.b2", "optimizer.cosine_floor", "model.mlp_hidden_dropout_rate", "model.head_dropout_rate",
              "model.batch_norm_momentum"}
# Optional switches of the model (next-token models, the sequence-mixer recipes; absent from the LRA
# protocols' configs).
BOOL_KEYS = ("model.mlp", "model.tie_embeddings", "model.dropout_broadcast_time", "model.share_attention_core",
             "model.residual_init_rescale", "model.attention_bias", "model.residual_dropout", "model.final_norm",
             "model.identity_state_mixer", "model.remat")
# The input pipelines (``data.pipeline``, default "tf"): tf.data, or in-memory numpy arrays without
# TensorFlow (``tasks.base.ArrayBatches``; the tasks whose data are generated locally).
PIPELINES = ("tf", "numpy")
# Keys a protocol's config may leave out (the model and optimizer then behave as without them, so the
# configs and hashes of the protocols that do not use them are unchanged); ``--set`` adds them. Their
# values are checked by ``validate`` like every other key.
OPTIONAL_KEYS: dict[str, type] = {
    "model.mlp": bool, "model.tie_embeddings": bool, "model.embed_init_std": float,
    "model.embed_dropout_rate": float, "model.norm": str, "model.norm_position": str,
    "model.mlp_activation": str, "model.head": str, "model.dropout_broadcast_time": bool,
    "model.share_attention_core": bool, "model.dense_init_std": float, "model.residual_init_rescale": bool,
    "model.attention_bias": bool,
    # the originals' encoder details (protocols s4, s5, lru, mega, zoology, xiong; docs/protocol_differences.md)
    "model.residual_dropout": bool, "model.mlp_hidden_dropout_rate": float, "model.final_norm": bool,
    "model.token_embedding": str, "model.head_activation": str, "model.head_dropout_rate": float,
    "model.dual_features": str, "model.batch_norm_momentum": float, "model.identity_state_mixer": bool,
    "model.first_real_id": int,
    # rematerialisation: each encoder block's activations are recomputed in the backward pass (models.Encoder)
    "model.remat": bool,
    "data.pipeline": str,
    "optimizer.ssm_learning_rate": float, "optimizer.ssm_weight_decay": float, "optimizer.cosine_floor": float,
    "optimizer.param_groups": str,
}


def optional_sections() -> dict[str, dict[str, type]]:
  """Sections a protocol's config leaves out, with the type of each key, as their owners declare them (the
  objectives' ``SECTIONS``: ``pretrain``, the self-pretraining run): a ``--set`` of one of their keys adds the
  section, and ``complete_optional_sections`` fills in the keys not given (so the configs and hashes of the
  runs without them are unchanged)."""
  from lra_bench.training import objectives  # jax: imported here so that loading this module stays light

  return objectives.SECTIONS


def complete_optional_sections(config: ml_collections.ConfigDict) -> None:
  """Fills in the defaults of the optional sections an override added, by their owners (``objectives.complete``:
  a ``pretrain`` section of objective ``none`` is removed, so ``--pretrain none`` is the preset itself)."""
  from lra_bench.training import objectives

  objectives.complete(config)


# data.options values that are counts: 0 = no limit
OPTION_RANGES = {"limit": (0, None), "contour_length": (1, None), "split_seed": (0, MAX_SEED)}


def _lookup(config: ml_collections.ConfigDict, key: str) -> tuple[bool, Any]:
  node: Any = config
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False, None
    node = node[part]
  return True, node


def _check_keywords(key: str, given: Iterable[str], function: Callable[..., Any], skip: Iterable[str]) -> None:
  """Keys of an open section must be keyword arguments of the function they are passed to."""
  params = inspect.signature(function).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
    return
  known = [name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in skip]
  unknown = sorted(set(given) - set(known))
  if unknown:
    raise ConfigError(f"unknown config key {key}.{unknown[0]}; {key} takes: {', '.join(known) or 'nothing'}")


def validate_prepare(options: dict[str, Any], where: str = "data.prepare") -> None:
  """The ``data prepare`` options (a protocol's ``data.prepare``, updated by flags): counts and lengths
  (``tasks.base.PREPARE_RANGES``)."""
  for name, (low, high) in PREPARE_RANGES.items():
    if options.get(name) is not None:
      allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
      check_number(f"{where}.{name}", options[name], INT, low, high, allowed)
  low, high = options.get("min_length"), options.get("max_expression_length")
  problem = None if low is None or high is None else tasks_lib.base.length_range_error(low, high)
  if problem:
    raise ConfigError(f"{where}: min_length={low} and max_expression_length={high} leave no length: {problem}")


def validate(config: ml_collections.ConfigDict) -> None:
  """Every check that needs no devices, so a bad value fails before start-up, never after an hour."""
  from lra_bench.training import objectives, parallel  # jax: imported here so that loading this module stays light

  for key, kind, low, high, allowed in NUMERIC_KEYS:
    present, value = _lookup(config, key)
    if present:
      check_number(key, value, kind, low, high, allowed, key in _OPEN_LOW, key in _OPEN_HIGH)
  if config.precision not in PRECISIONS:
    raise ConfigError(f"unknown precision {config.precision!r}; expected one of {', '.join(PRECISIONS)}")
  if config.param_sharding not in parallel.PARAM_SHARDINGS:
    raise ConfigError(f"unknown param_sharding {config.param_sharding!r}; expected one of "
                      f"{parallel.PARAM_SHARDINGS}")
  if config.batch_size % config.accumulate_steps:
    raise ConfigError(f"batch_size {config.batch_size} is not a positive multiple of accumulate_steps "
                      f"{config.accumulate_steps}")
  if config.num_eval_batches != -1:
    check_number("num_eval_batches", config.num_eval_batches, INT, 1, None, "-1 (all) or >= 1")
  if config.model.qkv_dim % config.model.num_heads:
    raise ConfigError(f"model.qkv_dim={config.model.qkv_dim} is not allowed with model.num_heads="
                      f"{config.model.num_heads}; expected a multiple of num_heads")
  for key in BOOL_KEYS:
    present, value = _lookup(config, key)
    if present and not isinstance(value, bool):
      fail(key, value, "True or False")
  _validate_names(config)
  _validate_data(config)
  _validate_attention(config)
  objectives.validate(config)  # each objective the run trains checks its own settings and section


def _validate_attention(config: ml_collections.ConfigDict) -> None:
  """``model.attention_kwargs``: each value of its field's type (bool / int / float), then the core's own
  checks (its config's ``__post_init__``)."""
  kwargs = config.model.attention_kwargs.to_dict()
  try:
    hints = typing.get_type_hints(type(attention_zoo.layer_config(config.model.attention)))
  except (ValueError, TypeError) as err:
    raise ConfigError(str(err)) from None
  for field, value in kwargs.items():
    key, kind = f"model.attention_kwargs.{field}", hints.get(field)
    if kind is bool and not isinstance(value, bool):
      fail(key, value, "True or False")
    elif kind is int:
      check_number(key, value, INT, -math.inf, None, "")
    elif kind is float:
      check_number(key, value, FLOAT, -math.inf, None, "")
  if "dropout_rate" in kwargs:
    check_number("model.attention_kwargs.dropout_rate", kwargs["dropout_rate"], FLOAT, 0.0, 1.0, "in [0, 1)",
                 open_high=True)
  try:
    layer = attention_zoo.layer_config(config.model.attention, **kwargs)
  except (ValueError, TypeError) as err:
    raise ConfigError(f"model.attention_kwargs: {err}") from None
  if not type(layer).shareable and config.model.get("share_attention_core", False):
    fail("model.share_attention_core", True, f"False with the {type(layer).noun} {config.model.attention!r}: "
         "one core shared by every layer applies to attention cores (Xiong et al.'s Linformer projection)")
  if layer.one_way and config.model.pooling == "CLS":
    fail("model.pooling", "CLS", f"MEAN, SUM or MAX with the one-directional {type(layer).noun} "
         f"{config.model.attention!r}: the CLS vector is the first position, so a forward scan gives it nothing "
         "of the sequence (or set model.attention_kwargs.bidirectional=True)")


def _validate_names(config: ml_collections.ConfigDict) -> None:
  """The string keys: protocol, task, pooling, positions, schedule factors."""
  from lra_bench.training import models, optim  # flax, optax: imported here so that loading this module stays light

  if not isinstance(config.protocol, str) or not config.protocol:
    fail("protocol", config.protocol, "a protocol name")
  check_choice("task", config.task, tasks_lib.list_tasks())
  check_choice("model.pooling", config.model.pooling, models.POOLINGS)
  check_choice("model.positions", config.model.positions, models.POSITIONS)
  for key, choices in (("norm", models.NORMS), ("norm_position", models.NORM_POSITIONS),
                       ("mlp_activation", tuple(models.MLP_ACTIVATIONS)), ("head", models.HEADS),
                       ("head_activation", tuple(models.HEAD_ACTIVATIONS)), ("dual_features", models.DUAL_FEATURES),
                       ("token_embedding", models.TOKEN_EMBEDDINGS)):
    if key in config.model:  # optional keys (the sequence-mixer recipes)
      check_choice(f"model.{key}", config.model[key], choices)
  if config.model.get("identity_state_mixer", False) and config.model.get("mlp", True):
    fail("model.identity_state_mixer", True, "False with model.mlp=True: the identity state mixer (Zoology's "
         "block) takes the MLP's place, so it needs model.mlp=False")
  if "param_groups" in config.optimizer:
    try:
      rules = optim.parse_param_groups(config.optimizer.param_groups)
    except ValueError as err:
      raise ConfigError(f"optimizer.param_groups={config.optimizer.param_groups!r}: {err}") from None
    if any(rate == "ssm" for _, rate, _ in rules) and config.optimizer.get("ssm_learning_rate") is None:
      fail("optimizer.param_groups", config.optimizer.param_groups, "rules at rate 'main' only, or set "
           "optimizer.ssm_learning_rate (a rule puts parameters at the SSM rate)")
  factors = [factor.strip() for factor in str(config.optimizer.schedule).split("*")]
  unknown = sorted(set(factors) - set(optim.SCHEDULE_FACTORS))
  if unknown:
    raise ConfigError(f"optimizer.schedule={config.optimizer.schedule!r}: unknown schedule factor(s) "
                      f"{unknown}; expected a product ('a * b') of {', '.join(optim.SCHEDULE_FACTORS)}")


def _validate_data(config: ml_collections.ConfigDict) -> None:
  """Input kind, and the open sections data.options / data.prepare against what the task takes."""
  task = tasks_lib.get_task(config.task)
  kind = config.model.input_kind
  if kind not in tasks_lib.base.INPUT_KINDS:
    raise ConfigError(f"model.input_kind must be one of {tasks_lib.base.INPUT_KINDS}, got {kind!r}")
  if kind == "pixels" and not task.pixel_inputs:
    raise ConfigError(f"task {config.task!r} has no float pixel inputs; use model.input_kind='tokens'")
  options = config.data.options.to_dict()
  _check_keywords("data.options", options, task.examples, skip=("max_length", "input_kind"))
  for name, (low, high) in OPTION_RANGES.items():
    if options.get(name) is not None:
      allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
      check_number(f"data.options.{name}", options[name], INT, low, high, allowed)
  prepare = config.data.prepare.to_dict()
  _check_keywords("data.prepare", prepare, task.prepare, skip=("progress",))
  validate_prepare(prepare)
  pipeline = config.data.get("pipeline", "tf")
  check_choice("data.pipeline", pipeline, PIPELINES)
  if pipeline == "numpy" and config.task not in tasks_lib.base.array_tasks():
    fail("data.pipeline", pipeline, f"'tf' for task {config.task!r}, which reads its data through tf.data only "
         f"(numpy: {', '.join(tasks_lib.base.array_tasks())})")


def config_hash(config: ml_collections.ConfigDict) -> str:
  """Stable short hash of the whole config (what makes two runs comparable), with the result-neutral keys
  at the preset's values: a ``--set checkpoint_every=N`` names the same run (the same suite workdir and
  record) as the preset's cadence (``RESULT_NEUTRAL_KEYS``)."""
  return hashlib.sha256(json.dumps(at_preset_cadence(config.to_dict()), sort_keys=True).encode()).hexdigest()[:12]


def at_preset_cadence(tree: dict[str, Any]) -> dict[str, Any]:
  """A config dict with its overridden result-neutral keys back at the preset's values (``PRESET_CADENCE``
  dropped): what ``config_hash`` and ``results.setting_hash`` hash."""
  tree = dict(tree)
  tree.update(tree.pop(PRESET_CADENCE, None) or {})
  return tree


def is_result_neutral(dotted_key: str) -> bool:
  """Whether a (dotted) config key changes no result: a ``RESULT_NEUTRAL_KEYS`` key or the record of the
  preset's values of those (``PRESET_CADENCE``)."""
  return dotted_key in RESULT_NEUTRAL_KEYS or dotted_key.split(".", 1)[0] == PRESET_CADENCE
