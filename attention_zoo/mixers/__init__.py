"""Sequence mixers: the second layer contract beside the attention core (docs/ARCHITECTURE.md, CONTRACT 6).

A *sequence mixer* replaces the whole multi-head attention sub-layer of an encoder block (the
projections included): ``x [B, L, D], mask bool [B, L] -> [B, L, D]`` in ``x``'s dtype. State-space
models (S4D, S5, LRU) and Mega's gated EMA attention are mixers: they own their input and output maps,
their gates and activations, so the attention core's ``query, key, value`` contract does not fit them.

A mixer is a ``flax.linen.Module`` whose single field is ``config``, a frozen dataclass deriving from
:class:`MixerConfig`, registered by name::

    @register_mixer("my_ssm", MySSMConfig)
    class MySSM(nn.Module):
      config: MySSMConfig
      @nn.compact
      def __call__(self, x, mask, deterministic=True): ...

Names share one namespace with the attention cores: ``--attentions``, ``model.attention`` and the
records' ``attention`` field name either kind; :func:`layer_kind` says which (records also store it as
``layer_kind``). ``model.attention_kwargs`` are the mixer's config overrides.

What the encoder does around a mixer (``lra_bench.training.models.EncoderBlock``):

- it zeroes the padded positions of ``x`` before the call (``x * mask``); a mixer must keep the outputs
  at real positions independent of what the padded positions held and of how many there are (a mixer
  that adds a bias before a scan must mask again; a bidirectional scan runs through the zeroed tail);
- ``config.dropout_rate`` is the model's ``dropout_rate`` unless ``attention_kwargs`` sets it (the
  mixer's own dropout, e.g. after S4's activation); dropout draws from the ``dropout`` RNG stream;
- ``config.causal`` is True in next-token models: the output at ``i`` must not depend on ``j > i``
  (a bidirectional option is then off); a mixer with no causal form sets ``no_causal_form``;
- a mixer with ``gated_residual = True`` (Mega: ``x + φ ⊙ (h − x)``) is called with ``residual=``
  (the block's input before its normalisation) and returns the update the block adds unchanged
  (no residual dropout), so the gate sees the un-normalised input as in the original;
- a parameter whose name starts with ``ssm_`` is an SSM parameter (Λ/A, B, Δ): trained at
  ``optimizer.ssm_learning_rate`` with ``optimizer.ssm_weight_decay`` when the config sets them
  (the S4/S5/LRU recipes), else like every other parameter.

Mixers defined outside this package register the same way from a plugin module (``--plugin``,
``$LRA_BENCH_PLUGINS``, the ``lra_bench.attentions`` entry points): the plugin mechanism imports modules,
and a module may register cores, mixers or both.
"""

from __future__ import annotations

import dataclasses
import importlib as _importlib
import os
import pkgutil as _pkgutil
import sys
from typing import Any, Callable, ClassVar, TypeVar

import flax.linen as nn

# The families of ``MixerConfig.family`` (the report's panels, after the attention families).
MIXER_FAMILIES = ("ssm", "gated-ema", "mixer")


@dataclasses.dataclass(frozen=True)
class MixerConfig:
  """Fields every sequence mixer has.

  Attributes:
    causal: the output at position i may depend only on positions j <= i (next-token models). A
      mixer's ``bidirectional`` option (if it has one) is ignored when this is True.
    dropout_rate: the mixer's own dropout (the encoder sets it to ``model.dropout_rate`` unless
      ``attention_kwargs`` gives one).
  """

  causal: bool = False
  dropout_rate: float = 0.0

  # The model name of this mixer's rows in the published tables (reports/reference), if it has any.
  paper_name: ClassVar[str | None] = None
  family: ClassVar[str] = "mixer"
  # True: called with ``residual=`` and returns the update the block adds (module docstring).
  gated_residual: ClassVar[bool] = False
  # Why the mixer has no causal form (``causal=True`` raises ``NotImplementedError``), or None.
  no_causal_form: ClassVar[str | None] = None

  def state_size(self, length: int, d_model: int) -> int | None:
    """Scalars one layer keeps per example to generate causally after ``length`` tokens (as
    ``AttentionConfig.state_size``): a diagonal SSM's hidden state, independent of the length. None when
    the mixer has no causal form; raises ``NotImplementedError`` when the config does not declare it."""
    del length, d_model
    if self.no_causal_form:
      return None
    raise NotImplementedError(f"{type(self).__qualname__} does not declare state_size")


@dataclasses.dataclass(frozen=True)
class _Entry:
  module_cls: type[nn.Module]
  config_cls: type[MixerConfig]
  defined_in: str
  source: str | None = None


_REGISTRY: dict[str, _Entry] = {}

MixerT = TypeVar("MixerT")


def register_mixer(name: str, config_cls: type[MixerConfig]) -> Callable[[MixerT], MixerT]:
  """Decorator: registers a linen mixer module class under ``name`` with default config ``config_cls()``.

  A name an attention core already holds, or another module's mixer, is a ``PluginError`` naming both.
  """
  from attention_zoo import registry

  if not (dataclasses.is_dataclass(config_cls) and issubclass(config_cls, MixerConfig)):
    raise TypeError(f"config_cls for mixer {name!r} must be a dataclass deriving from MixerConfig")
  if not config_cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
    raise TypeError(f"config_cls for mixer {name!r} must be a frozen dataclass")
  caller = sys._getframe(1).f_globals  # noqa: SLF001 - the caller's module is what records name

  def decorator(module_cls: MixerT) -> MixerT:
    if not (isinstance(module_cls, type) and issubclass(module_cls, nn.Module)):
      raise TypeError(f"mixer {name!r}: register_mixer takes a flax.linen Module class, got {module_cls!r}")
    defined_in = caller.get("__name__") or module_cls.__module__
    source = os.path.realpath(caller["__file__"]) if caller.get("__file__") else None
    if name in registry._REGISTRY:  # noqa: SLF001 - one namespace for both kinds
      raise registry.PluginError(
          f"mixer {name!r} clashes with the attention core of that name registered by module "
          f"{registry._REGISTRY[name].defined_in!r}; rename one of them")  # noqa: SLF001
    existing = _REGISTRY.get(name)
    if existing is not None and existing.defined_in != defined_in and existing.source != source:
      raise registry.PluginError(f"mixer {name!r} is registered twice: by module {existing.defined_in!r} "
                                 f"and by module {defined_in!r}; rename one of them")
    if existing is not None:
      defined_in, source = existing.defined_in, existing.source
    _REGISTRY[name] = _Entry(module_cls, config_cls, defined_in, source)
    return module_cls

  return decorator


def _entry(name: str) -> _Entry:
  from attention_zoo import registry

  registry._load_automatic_plugins()  # noqa: SLF001 - plugins may register mixers too
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(f"unknown sequence mixer {name!r}; known mixers: {', '.join(list_mixers())}") from None


def list_mixers() -> list[str]:
  """Sorted names of every registered sequence mixer (built-in and plugins)."""
  from attention_zoo import registry

  registry._load_automatic_plugins()  # noqa: SLF001
  return sorted(_REGISTRY)


def is_mixer(name: str) -> bool:
  """Whether ``name`` is a registered sequence mixer (plugins loaded first)."""
  return name in list_mixers()


def mixer_config(name: str, **overrides: Any) -> MixerConfig:
  """The frozen config of mixer ``name``: its defaults with ``overrides`` applied (unknown fields are a
  ``TypeError`` listing the known ones)."""
  config_cls = _entry(name).config_cls
  fields = {f.name for f in dataclasses.fields(config_cls)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise TypeError(f"mixer {name!r} has no config field(s) {', '.join(map(repr, unknown))}; "
                    f"its fields are: {', '.join(sorted(fields))}")
  return config_cls(**overrides)


def create_mixer(name: str, **overrides: Any) -> nn.Module:
  """Builds the mixer registered as ``name`` (unbound flax module)."""
  return _entry(name).module_cls(config=mixer_config(name, **overrides))


def mixer_defining_module(name: str) -> str:
  return _entry(name).defined_in


def mixer_family(name: str) -> str:
  try:
    family = _entry(name).config_cls.family
  except ValueError:
    return "other"
  return family if isinstance(family, str) and family else "mixer"


_BUILTINS_IMPORTED = False


def _import_builtins() -> None:
  """Imports every mixer module of this package (one file per mixer; ``_helpers`` register nothing)."""
  global _BUILTINS_IMPORTED
  if _BUILTINS_IMPORTED:
    return
  _BUILTINS_IMPORTED = True
  for info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not info.name.startswith("_"):
      _importlib.import_module(f"{__name__}.{info.name}")


_import_builtins()


import contextlib as _contextlib  # noqa: E402 - kept with the one helper that needs it


@_contextlib.contextmanager
def temporary(mixers: dict[str, tuple[type[nn.Module], type[MixerConfig]]]):
  """Registers ``{name: (module class, config class)}`` for the ``with`` block only (tests' toy mixers);
  a name already taken (by a mixer or an attention core) is an error. Yields the names."""
  from attention_zoo import registry

  taken = sorted(n for n in mixers if n in _REGISTRY or n in registry._REGISTRY)  # noqa: SLF001
  if taken:
    raise registry.PluginError(f"temporary: {', '.join(map(repr, taken))} already registered")
  try:
    for name, (module_cls, config_cls) in mixers.items():
      register_mixer(name, config_cls)(module_cls)
      _REGISTRY[name] = dataclasses.replace(_REGISTRY[name], defined_in=module_cls.__module__)
    yield list(mixers)
  finally:
    for name in mixers:
      _REGISTRY.pop(name, None)
