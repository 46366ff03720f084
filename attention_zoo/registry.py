"""The attention registry (docs/ARCHITECTURE.md, CONTRACT 1).

An attention *core* is a ``flax.linen.Module`` whose single field is ``config`` (a frozen dataclass
deriving from :class:`AttentionConfig`). It maps ``query, key [B, L, H, D]`` and ``value [B, L, H, V]``
to ``[B, L, H, V]``; it owns no projections (``lra_bench.training.models`` does).

Register one with a decorator; variants of one method register the same class under several names with
different config classes::

    @register_attention("my_attention", MyConfig)
    class MyAttention(nn.Module):
      config: MyConfig
      def __call__(self, query, key, value, mask=None, deterministic=True): ...

Every registered name then enters the registry-wide tests, the suite, the benchmark and the reports.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, TypeVar

import flax.linen as nn
import numpy as np


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """Fields every attention core has.

  Attributes:
    causal: position i may attend only to j <= i. ``False`` is the LRA (encoder) setting. A core that
      cannot do causal attention raises ``NotImplementedError`` when this is ``True``.
    dropout_rate: dropout on the attention probabilities (flax RNG stream ``"dropout"``).
  """

  causal: bool = False
  dropout_rate: float = 0.0

  # What the core promises about its effective attention matrix P (the ``value = eye(L)`` probe) on
  # the rows of real (unpadded) queries. Class-level declarations, not config fields: the registry-wide
  # tests check exactly what is declared, so a core that is not softmax-normalised (Linformer's
  # projections, Nystrom's pseudo-inverse, FNet's Fourier mixing) says so here instead of being skipped.
  # Every core, whatever it declares, gives exactly zero weight to padded keys.
  nonnegative: ClassVar[bool] = True       # P >= 0
  rows_sum_to_one: ClassVar[bool] = True   # every real row of P sums to 1
  # The model name of this core's row in the published tables (reports/reference), if it has one.
  paper_name: ClassVar[str | None] = None

  def support(self, length: int) -> np.ndarray | None:
    """bool [L, L] (query, key): the only pairs that may get non-zero weight at this length (without
    padding), or None when the core promises no fixed pattern (e.g. data-dependent or random support).
    Tests check the probe against it; the attention-pattern plots may draw it."""
    del length
    return None


@dataclasses.dataclass(frozen=True)
class _Entry:
  module_cls: type[nn.Module]
  config_cls: type[AttentionConfig]


_REGISTRY: dict[str, _Entry] = {}

ModuleT = TypeVar("ModuleT", bound=type[nn.Module])


def register_attention(name: str, config_cls: type[AttentionConfig]) -> Callable[[ModuleT], ModuleT]:
  """Class decorator: registers ``module_cls`` under ``name`` with default config ``config_cls()``."""
  if not (dataclasses.is_dataclass(config_cls) and issubclass(config_cls, AttentionConfig)):
    raise TypeError(f"config_cls for {name!r} must be a dataclass deriving from AttentionConfig")
  if not config_cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
    raise TypeError(f"config_cls for {name!r} must be a frozen dataclass")

  def decorator(module_cls: ModuleT) -> ModuleT:
    existing = _REGISTRY.get(name)
    if existing is not None and (existing.module_cls.__qualname__, existing.config_cls.__qualname__) != (
        module_cls.__qualname__, config_cls.__qualname__):
      raise ValueError(f"attention {name!r} is already registered by {existing.module_cls.__module__}")
    _REGISTRY[name] = _Entry(module_cls, config_cls)
    return module_cls

  return decorator


def list_attentions() -> list[str]:
  """Sorted names of every registered attention core."""
  return sorted(_REGISTRY)


def _entry(name: str) -> _Entry:
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(
        f"unknown attention {name!r}; known attentions: {', '.join(list_attentions())}") from None


def attention_config(name: str, **overrides: Any) -> AttentionConfig:
  """The frozen config of ``name``: its defaults, with ``overrides`` applied."""
  config_cls = _entry(name).config_cls
  fields = {f.name for f in dataclasses.fields(config_cls)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise TypeError(
        f"attention {name!r} has no config field(s) {', '.join(map(repr, unknown))}; "
        f"its fields are: {', '.join(sorted(fields))}")
  return config_cls(**overrides)


def create_attention(name: str, **overrides: Any) -> nn.Module:
  """Builds the attention core registered as ``name`` (unbound flax module)."""
  return _entry(name).module_cls(config=attention_config(name, **overrides))


import contextlib as _contextlib  # noqa: E402 - kept with the one helper that needs it
from typing import Iterator as _Iterator  # noqa: E402


@_contextlib.contextmanager
def temporary(cores: dict[str, tuple[type[nn.Module], type[AttentionConfig]]]) -> _Iterator[list[str]]:
  """Registers ``{name: (module class, config class)}`` for the ``with`` block only (tests' fake cores).

  A name registered to another class is an error (as for ``register_attention``); on exit those names
  are unregistered, whatever the block raised. Yields the names.
  """
  for name, (module_cls, config_cls) in cores.items():
    register_attention(name, config_cls)(module_cls)
  try:
    yield list(cores)
  finally:
    for name in cores:
      _REGISTRY.pop(name, None)
