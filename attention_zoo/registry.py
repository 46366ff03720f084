"""The registry of sequence layers (docs/ARCHITECTURE.md, CONTRACT 1): attention cores and sequence mixers,
two kinds of one thing.

Every layer is a ``flax.linen.Module`` whose single field ``config`` is a frozen dataclass deriving from
:class:`LayerConfig`; the traits the harness asks of a layer (its family, whether one instance may serve every
block, whether it is one-way under CLS pooling, whether it gates its own residual, which probe inputs it takes)
are declared on that config, so no module outside this one and the two places that build or check a layer
(``lra_bench.training.models.sequence_layer`` and the kit's dispatch in ``lra_bench.testing``) asks which kind
a name is. The two kinds:

- an attention *core* (config deriving from :class:`AttentionConfig`, registered by
  :func:`register_attention`), described below;
- a sequence *mixer* (config deriving from :class:`MixerConfig`, registered by :func:`register_mixer`):
  ``x [B, L, D], mask [B, L] -> [B, L, D]``, owning its projections (S4D, S5, LRU, Mega, the modern
  recurrences; ``attention_zoo/mixers``, whose ``__init__`` only imports its files).

Both kinds share one namespace, one lookup (:func:`layer_config`, :func:`create_layer`), one list
(:func:`list_layers`), one family (:func:`layer_family`), one temporary registration (:func:`temporary`) and one
plugin loader that rolls back whatever a failed plugin registered, of either kind.

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

The same decorator also takes a core written in the two other styles; each is wrapped into a linen
module with the one ``config`` field, so the model, the conformance kit and ``lra-bench check`` treat
every core alike:

- an NNX module (``flax.nnx.Module`` subclass): constructed as ``cls(config, rngs=rngs)`` and called as
  ``core(query, key, value, mask=None, deterministic=True)``. It runs inside the linen model through
  ``flax.nnx.bridge.ToLinen``: its parameters are linen ``params``, and its ``nnx.Rngs`` carry the
  model's ``dropout`` and ``attention`` streams (``nnx.Dropout(rate, rngs=rngs)`` draws from the
  ``dropout`` stream, fresh per call).
- a plain parameter-free function ``fn(query, key, value, mask, *, config, deterministic,
  dropout_rng)``; it declares only the keyword arguments it uses: without ``config`` it cannot be
  causal, without ``dropout_rng`` it cannot apply attention dropout (both then raise
  ``NotImplementedError`` saying so). ``dropout_rng`` is a key of the ``dropout`` stream, None when
  ``deterministic`` or ``config.dropout_rate == 0``. ``mask`` is always a bool ``[B, L]`` array.

Two modules registering one name clash (:class:`PluginError` naming both) unless they are one source
file imported again (a reload).

Cores defined outside this package (plugins) enter the same registry by being imported: a module named
by ``--plugin`` / :func:`load_plugins`, by the ``LRA_BENCH_PLUGINS`` variable (comma-separated), or by
an installed distribution's ``lra_bench.attentions`` entry point. The variable and the entry points are
read lazily, on the first lookup, so every process that asks the registry for a name sees the plugins,
including the subprocesses of ``suite --isolate`` and ``bench``, which inherit the variable.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import os
import site
import sys
import sysconfig
from typing import Any, Callable, ClassVar, Iterable, TypeVar

import flax.linen as nn
import numpy as np


@dataclasses.dataclass(frozen=True)
class LayerConfig:
  """Fields and traits every sequence layer has, attention core or mixer.

  Attributes:
    causal: the output at position i may depend only on positions j <= i. ``False`` is the LRA (encoder)
      setting. A layer that has no causal form raises ``NotImplementedError`` when this is ``True``.
    dropout_rate: the layer's own dropout (attention probabilities for a core; a mixer's internal dropout),
      flax RNG stream ``"dropout"``.
  """

  causal: bool = False
  dropout_rate: float = 0.0

  # The model name of this layer's rows in the published tables (lra_bench/report/published), if it has one.
  paper_name: ClassVar[str | None] = None
  # The family the reports group this layer under (one panel of the scaling figures; ``FAMILIES`` gives
  # their order). A layer that declares none, e.g. a plugin's core, is "other".
  family: ClassVar[str] = "other"
  # Why the layer has no causal form (its ``causal=True`` raises ``NotImplementedError``), or None when it
  # has one; a config whose causal form depends on its fields makes it a property.
  no_causal_form: ClassVar[str | None] = None
  # One instance may serve every block of the encoder (``model.share_attention_core``: Xiong et al.'s one
  # Linformer projection for all layers).
  shareable: ClassVar[bool] = False
  # The layer gates its own residual (Mega: ``x + φ ⊙ (h − x)``): the block calls it with ``residual=`` (its
  # input before the normalisation) and adds what it returns unchanged, without residual dropout.
  gated_residual: ClassVar[bool] = False
  # What the layer is called with, and so what the conformance kit and the benchmark's ``core`` mode feed it:
  # ``("query", "key", "value")`` (a core inside the harness's multi-head block) or ``("x",)`` (a layer that
  # owns its projections).
  probe_inputs: ClassVar[tuple[str, ...]] = ("x",)
  # The words for this layer in messages ("attention core", "sequence mixer").
  noun: ClassVar[str] = "sequence layer"

  @property
  def one_way(self) -> bool:
    """Whether the first position's output sees nothing of the rest of the sequence (a forward-only scan):
    under CLS pooling (the CLS vector is the first position) such a layer gives the classifier nothing."""
    return False

  def declared(self) -> str:
    """What the config declares about the layer, in one line (``lra-bench check``'s header)."""
    causal = f"none ({self.no_causal_form})" if self.no_causal_form else "yes"
    return f"family = {self.family}, gated residual = {self.gated_residual}, causal form: {causal}"

  def layer_state_size(self, length: int, *, num_heads: int, head_dim: int, d_model: int) -> int | None:
    """Scalars one layer keeps per example to generate causally after ``length`` tokens, at a model of
    ``num_heads`` heads of ``head_dim`` and width ``d_model``: each kind reads the sizes that concern it
    (a core its heads, a mixer the width) and calls its own ``state_size``."""
    del length, num_heads, head_dim, d_model
    if self.no_causal_form:
      return None
    raise StateSizeUnknown(f"{type(self).__qualname__} does not declare state_size (state size not declared)")


@dataclasses.dataclass(frozen=True)
class AttentionConfig(LayerConfig):
  """Fields every attention core has (``causal``, ``dropout_rate``: :class:`LayerConfig`); ``dropout_rate``
  is the dropout on the attention probabilities."""

  # What the core promises about its effective attention matrix P (the ``value = eye(L)`` probe) on
  # the rows of real (unpadded) queries. Class-level declarations, not config fields: the registry-wide
  # tests check exactly what is declared, so a core that is not softmax-normalised (Linformer's
  # projections, Nystrom's pseudo-inverse, FNet's Fourier mixing) says so here instead of being skipped.
  # Every core, whatever it declares, gives exactly zero weight to padded keys.
  nonnegative: ClassVar[bool] = True       # P >= 0
  rows_sum_to_one: ClassVar[bool] = True   # every real row of P sums to 1
  # The inputs the output does not depend on, by design: () for attention (the weights come from the
  # query and the key), ("query", "key") for a content-independent mixer (FNet, the random
  # synthesizers). The conformance kit checks that redrawing any other of the two moves the output.
  ignores: ClassVar[tuple[str, ...]] = ()
  shareable: ClassVar[bool] = True
  probe_inputs: ClassVar[tuple[str, ...]] = ("query", "key", "value")
  noun: ClassVar[str] = "attention core"

  def support(self, length: int) -> np.ndarray | None:
    """bool [L, L] (query, key): the only pairs that may get non-zero weight at this length (without
    padding), or None when the core promises no fixed pattern (e.g. data-dependent or random support).
    Tests check the probe against it; the attention-pattern plots may draw it."""
    del length
    return None

  def declared(self) -> str:
    support = "fixed pattern" if self.support(64) is not None else "none declared"
    return (f"nonnegative = {self.nonnegative}, rows_sum_to_one = {self.rows_sum_to_one}, support = {support}, "
            f"ignores = {self.ignores}, family = {self.family}")

  def layer_state_size(self, length: int, *, num_heads: int, head_dim: int, d_model: int) -> int | None:
    del d_model
    return self.state_size(length, num_heads, head_dim)

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int | None:
    """Scalars one layer of this core keeps per example to generate causally (Zoology's ``state_size``).

    The recall plots of Zoology (Arora et al. 2024) and Based put this on their x axis: the floats a
    causal model must hold, after ``length`` tokens, to produce the next token's output — multi-head
    attention's keys and values (2·H·D·L), a window's (2·H·D·w), a linear attention's running sums
    (H·(F·D + F)). Counted with ``H = num_heads``, query/key head dim ``D = head_dim`` and value dim
    ``V = D``; sizes the core derives from the length (blocks of ⌈√L⌉, a grid width) are taken at
    ``length`` and the pattern is continued past it (the future queries of a generator that goes on).
    Only what the causal form needs counts: a key or value no later query can reach is dropped, a
    summary that can be formed incrementally is kept instead of its inputs; parameters and the step
    counter are not state. Where the need rises and falls with the position (blocks that empty at their
    boundary) it is the most over the prefixes of up to ``length`` tokens: the buffer a generator must
    allocate (:func:`peak_over_prefixes`). The config's own ``causal`` flag does not matter.

    Returns the count, or None when the core has no causal form (``no_causal_form`` says why).

    Raises :class:`StateSizeUnknown` (a ``NotImplementedError``) when the config does not declare it:
    this default, so a core that does not override it (e.g. a plugin's) is shown as "unknown", never as
    "no causal form". A core without a causal form needs no override: setting ``no_causal_form`` makes
    this default return None. :func:`state_size` (the registry helper) returns the count with its reason.
    """
    return LayerConfig.layer_state_size(self, length, num_heads=num_heads, head_dim=head_dim, d_model=0)


@dataclasses.dataclass(frozen=True)
class MixerConfig(LayerConfig):
  """Fields every sequence mixer has (``causal``, ``dropout_rate``: :class:`LayerConfig`). A mixer's
  ``bidirectional`` option (if it has one) is ignored when ``causal`` is True; ``dropout_rate`` is set by the
  encoder to ``model.dropout_rate`` unless ``attention_kwargs`` gives one."""

  family: ClassVar[str] = "mixer"
  noun: ClassVar[str] = "sequence mixer"

  @property
  def one_way(self) -> bool:
    return bool(self.causal or getattr(self, "bidirectional", True) is False)

  def layer_state_size(self, length: int, *, num_heads: int, head_dim: int, d_model: int) -> int | None:
    del num_heads, head_dim
    return self.state_size(length, d_model)

  def state_size(self, length: int, d_model: int) -> int | None:
    """Scalars one layer keeps per example to generate causally after ``length`` tokens (as
    ``AttentionConfig.state_size``): a diagonal SSM's hidden state, independent of the length. None when
    the mixer has no causal form; raises ``StateSizeUnknown`` when the config does not declare it."""
    return LayerConfig.layer_state_size(self, length, num_heads=0, head_dim=0, d_model=d_model)


class StateSizeUnknown(NotImplementedError):
  """Raised by :meth:`AttentionConfig.state_size` for a config that does not declare its state size."""


def peak_over_prefixes(length: int, period: int, state_at: Callable[[int], int]) -> int:
  """``max(state_at(t) for t in 0..length)`` for a ``state_at`` that, at a fixed ``t mod period``,
  never decreases as t grows (a buffer that empties at every block boundary, plus anything that only
  grows): only the last ``period`` values of t can hold the maximum, so only they are evaluated."""
  return max(state_at(t) for t in range(max(0, length - max(period, 1) + 1), length + 1))


# The families of ``LayerConfig.family``, in the order the report draws them: exact softmax; fixed sparse
# patterns; low-rank / latent projections of the length axis; kernel feature maps; patterns learned or
# computed from the content (hashing, clustering, sorting); the Combiner family; mixers without query-key
# dot products; then the sequence mixers: state-space models, Mega's gated EMA, the gated / delta linear
# recurrences, other mixers. A family not listed here (a plugin's own) comes after these, before "other".
FAMILIES = ("exact", "sparse", "low-rank", "kernel", "learned-pattern", "combiner", "mixing", "ssm", "gated-ema",
            "linear-recurrent", "mixer", "other")
KINDS = ("attention", "mixer")  # the two kinds of sequence layer, in the order ``list_layers`` lists them


def layer_family(name: str) -> str:
  """The family ``name``'s config declares (``LayerConfig.family``); "other" for a name that is not
  registered in this process (e.g. a plugin's records read without its ``--plugin``)."""
  try:
    family = _entry(name).config_cls.family
  except ValueError:
    return "other"
  return family if isinstance(family, str) and family else "other"


attention_family = layer_family  # the name the efficiency report and plugins know


@dataclasses.dataclass(frozen=True)
class _Entry:
  kind: str  # "attention" or "mixer" (``KINDS``)
  module_cls: type[nn.Module]
  config_cls: type[LayerConfig]
  defined_in: str  # the module whose code registered it (what records name)
  source: str | None = None  # that module's file (one file imported under two names is one module)


_REGISTRY: dict[str, _Entry] = {}


class PluginError(ValueError):
  """A plugin module failed to import, or registered a name another module already holds."""


CoreT = TypeVar("CoreT")


def register_attention(name: str, config_cls: type[AttentionConfig]) -> Callable[[CoreT], CoreT]:
  """Decorator: registers an attention core under ``name`` with default config ``config_cls()``.

  The core is a ``flax.linen`` module class, a ``flax.nnx`` module class or a plain function (the
  module docstring gives each style's contract); the decorated object is returned unchanged.
  """
  return _register(name, config_cls, "attention", sys._getframe(1).f_globals)  # noqa: SLF001 - the caller


def register_mixer(name: str, config_cls: type[MixerConfig]) -> Callable[[CoreT], CoreT]:
  """Decorator: registers a sequence mixer (a ``flax.linen`` module class) under ``name`` with default config
  ``config_cls()``; the class is returned unchanged."""
  return _register(name, config_cls, "mixer", sys._getframe(1).f_globals)  # noqa: SLF001 - the caller


_CONFIG_BASES = {"attention": AttentionConfig, "mixer": MixerConfig}


def _register(name: str, config_cls: type[LayerConfig], kind: str, caller: dict[str, Any]):
  """The one add path of both decorators. ``caller``: the registering module's globals (not the class's: a
  plugin may register a built-in class under a new name)."""
  base = _CONFIG_BASES[kind]
  if not (dataclasses.is_dataclass(config_cls) and isinstance(config_cls, type) and issubclass(config_cls, base)):
    raise TypeError(f"config_cls for {kind} {name!r} must be a dataclass deriving from {base.__name__}")
  if not config_cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
    raise TypeError(f"config_cls for {kind} {name!r} must be a frozen dataclass")

  def decorator(layer: CoreT) -> CoreT:
    module_cls = _as_linen(name, layer, kind)
    _add(name, kind, module_cls, config_cls, caller.get("__name__") or module_cls.__module__,
         caller.get("__file__"))
    return layer

  return decorator


def _add(name: str, kind: str, module_cls: type[nn.Module], config_cls: type[LayerConfig], defined_in: str,
         source: str | None = None) -> None:
  """Registers ``name``; the same module (or its source file) registering it again replaces it (a
  reload), any other module registering it, of either kind, is a :class:`PluginError` naming both."""
  source = os.path.realpath(source) if source else None
  existing = _REGISTRY.get(name)
  if existing is not None and not _same_module(existing, defined_in, source):
    kinds = "" if existing.kind == kind else f" (as {_ARTICLE[existing.kind]} and as {_ARTICLE[kind]})"
    raise PluginError(f"{kind} {name!r} is registered twice: by {_describe(existing.defined_in)} and by "
                      f"{_describe(defined_in)}{kinds}; rename one of them")
  if existing is not None:  # records keep naming the module that registered it first
    defined_in, source = existing.defined_in, existing.source
  _REGISTRY[name] = _Entry(kind, module_cls, config_cls, defined_in, source)


_ARTICLE = {"attention": "an attention core", "mixer": "a sequence mixer"}


def _same_module(entry: _Entry, defined_in: str, source: str | None) -> bool:
  if entry.defined_in == defined_in:
    return True
  return entry.source is not None and entry.source == source


# ----------------------------------------------------------------------------------------------------
# The NNX and function styles, wrapped into linen modules with the one ``config`` field

FUNCTION_KEYWORDS = ("config", "deterministic", "dropout_rng")  # what a function core may declare


def _as_linen(name: str, core: Any, kind: str = "attention") -> type[nn.Module]:
  """The linen module class that runs ``core`` (itself when it is one; a mixer must be one)."""
  if isinstance(core, type) and issubclass(core, nn.Module):
    return core
  if kind == "mixer":
    raise TypeError(f"mixer {name!r}: register_mixer takes a flax.linen Module class, got {core!r}")
  if isinstance(core, type) and _is_nnx_module(core):
    return _nnx_core(core)
  if isinstance(core, type) or not callable(core):
    raise TypeError(f"attention {name!r}: register_attention takes a flax.linen Module class, a flax.nnx "
                    f"Module class or a function, got {core!r}")
  return _function_core(name, core)


def _is_nnx_module(cls: type) -> bool:
  from flax import nnx  # only plugins written in NNX need it

  return issubclass(cls, nnx.Module)


def _named(wrapper: type[nn.Module], core: Any, style: str) -> type[nn.Module]:
  """Names the wrapper class after the core (errors, logs and the conformance memo show it)."""
  wrapper.__name__ = core.__name__
  wrapper.__qualname__ = f"{core.__qualname__}<{style}>"
  wrapper.__module__ = core.__module__
  wrapper.__doc__ = core.__doc__
  wrapper.core = core
  return wrapper


def _nnx_core(cls: type) -> type[nn.Module]:
  """``cls(config, rngs=rngs)`` run through ``flax.nnx.bridge.ToLinen``: its state becomes linen
  variables (``params``, ...). Its ``nnx.Rngs`` hold a fresh key of every RNG stream the model was given
  (``dropout``, ``attention``, and ``params`` at init); a stream not given falls back to a fixed key,
  which only deterministic code may use (dropout without a ``dropout`` key raises, as in linen)."""

  class NNXCore(nn.Module):
    config: AttentionConfig

    @nn.compact
    def __call__(self, query, key, value, mask=None, deterministic=True):
      import functools

      import jax
      from flax import nnx

      streams = {name: self.make_rng(name) for name in self.scope.rngs}
      if not deterministic and self.config.dropout_rate > 0 and "dropout" not in streams:
        raise ValueError(f"{cls.__qualname__}: dropout (dropout_rate={self.config.dropout_rate}, "
                         "deterministic=False) needs the 'dropout' RNG stream; pass rngs={'dropout': key}")
      rngs = nnx.Rngs(**streams, default=streams.get("params", jax.random.key(0)))
      inner = nnx.bridge.ToLinen(functools.partial(cls, rngs=rngs), args=(self.config,), skip_rng=True,
                                 name="nnx")
      return inner(query, key, value, mask=mask, deterministic=deterministic)

  return _named(NNXCore, cls, "nnx")


def _function_core(name: str, fn: Callable[..., Any]) -> type[nn.Module]:
  """``fn(query, key, value, mask, **keywords)`` with the keywords of ``FUNCTION_KEYWORDS`` it declares."""
  signature = inspect.signature(fn)
  open_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
  takes = frozenset(k for k in FUNCTION_KEYWORDS if open_keywords or k in signature.parameters)
  try:
    signature.bind(*"qkvm", **{k: None for k in takes})
  except TypeError as err:
    raise TypeError(f"attention {name!r}: a function core is called as fn(query, key, value, mask) plus "
                    f"the keywords it declares of {', '.join(FUNCTION_KEYWORDS)}; {fn.__qualname__}"
                    f"{signature} cannot be ({err})") from None

  class FunctionCore(nn.Module):
    config: AttentionConfig

    @nn.compact
    def __call__(self, query, key, value, mask=None, deterministic=True):
      import jax.numpy as jnp

      c = self.config
      if c.causal and "config" not in takes:
        raise NotImplementedError(f"attention {name!r}: {fn.__qualname__} takes no `config`, so it cannot "
                                  "be causal; declare `config` and read config.causal")
      if c.dropout_rate > 0 and "dropout_rng" not in takes:
        raise NotImplementedError(
            f"attention {name!r}: {fn.__qualname__} takes no `dropout_rng`, so it cannot apply attention "
            f"dropout (dropout_rate={c.dropout_rate}); declare it, or run with "
            "--set model.attention_dropout_rate=0")
      mask = jnp.ones(query.shape[:2], bool) if mask is None else jnp.asarray(mask, bool)
      given = {"config": c, "deterministic": deterministic}
      if "dropout_rng" in takes:
        given["dropout_rng"] = None if deterministic or not c.dropout_rate else self.make_rng("dropout")
      return fn(query, key, value, mask, **{k: v for k, v in given.items() if k in takes})

  return _named(FunctionCore, fn, "function")


def _describe(module: str) -> str:
  builtin = module.split(".")[0] == __name__.split(".")[0]
  return f"module {module!r}" + (" (built-in)" if builtin else "")


def defining_module(name: str) -> str:
  """The module that registered ``name`` (``attention_zoo.vanilla``, ``attention_zoo.mixers.s5``, or a
  plugin's module)."""
  return _entry(name).defined_in


layer_defining_module = defining_module


def list_layers(kind: str | None = None) -> list[str]:
  """Every registered sequence layer (built-in and plugins): the attention cores, then the mixers, each
  sorted (what ``--attentions all`` selects); ``kind`` (``KINDS``) lists one kind only."""
  _load_automatic_plugins()
  if kind is not None and kind not in KINDS:
    raise ValueError(f"unknown layer kind {kind!r}; expected one of {', '.join(KINDS)}")
  return [name for k in KINDS if kind in (None, k) for name in sorted(n for n, e in _REGISTRY.items()
                                                                       if e.kind == k)]


def list_attentions() -> list[str]:
  """Sorted names of every registered attention core (``list_layers("attention")``)."""
  return list_layers("attention")


def list_mixers() -> list[str]:
  """Sorted names of every registered sequence mixer (``list_layers("mixer")``)."""
  return list_layers("mixer")


def layer_kind(name: str) -> str:
  """``"attention"`` or ``"mixer"``: what records store as ``layer_kind``. Code that builds or checks a
  layer reads its config's traits instead (module docstring)."""
  return _entry(name).kind


def _entry(name: str) -> _Entry:
  _load_automatic_plugins()
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(
        f"unknown attention {name!r}; known attentions: {', '.join(list_attentions())}; known sequence mixers: "
        f"{', '.join(list_mixers())} (a layer defined outside lra-bench is loaded by --plugin MODULE, "
        f"${PLUGINS_ENV} or an installed {ENTRY_POINT_GROUP!r} entry point)") from None


def layer_config(name: str, **overrides: Any) -> LayerConfig:
  """The frozen config of ``name``, attention core or mixer: its defaults, with ``overrides`` applied (an
  unknown field is a ``TypeError`` listing the known ones)."""
  entry = _entry(name)
  fields = {f.name for f in dataclasses.fields(entry.config_cls)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise TypeError(
        f"{entry.kind} {name!r} has no config field(s) {', '.join(map(repr, unknown))}; "
        f"its fields are: {', '.join(sorted(fields))}")
  return entry.config_cls(**overrides)


def create_layer(name: str, **overrides: Any) -> nn.Module:
  """Builds the layer registered as ``name`` (an unbound flax module: a core or a mixer)."""
  return _entry(name).module_cls(config=layer_config(name, **overrides))


def _of_kind(name: str, kind: str) -> str:
  entry = _entry(name)
  if entry.kind != kind:
    raise ValueError(f"{name!r} is {_ARTICLE[entry.kind]}, not {_ARTICLE[kind]}; layer_config / create_layer "
                     "take either")
  return name


def attention_config(name: str, **overrides: Any) -> AttentionConfig:
  """The frozen config of attention core ``name``: its defaults, with ``overrides`` applied."""
  return layer_config(_of_kind(name, "attention"), **overrides)


def create_attention(name: str, **overrides: Any) -> nn.Module:
  """Builds the attention core registered as ``name`` (unbound flax module)."""
  return create_layer(_of_kind(name, "attention"), **overrides)


def mixer_config(name: str, **overrides: Any) -> MixerConfig:
  """The frozen config of sequence mixer ``name``: its defaults, with ``overrides`` applied."""
  return layer_config(_of_kind(name, "mixer"), **overrides)


def create_mixer(name: str, **overrides: Any) -> nn.Module:
  """Builds the sequence mixer registered as ``name`` (unbound flax module)."""
  return create_layer(_of_kind(name, "mixer"), **overrides)


def state_size(name: str, length: int, num_heads: int, head_dim: int, *, d_model: int | None = None,
               **overrides: Any) -> tuple[int | None, str]:
  """(scalars, reason): the causal state of one layer of ``name`` (config ``overrides`` applied) per
  example after ``length`` tokens, in a model of ``num_heads`` heads of ``head_dim`` (value dim the same)
  and width ``d_model`` (default ``num_heads · head_dim``); see :meth:`AttentionConfig.state_size` and
  :meth:`MixerConfig.state_size`.

  - ``(n, formula)``: the count and the first paragraph of the config's ``state_size`` docstring (its
    formula and why);
  - ``(None, "no causal form: ...")``: the layer has none (``LayerConfig.no_causal_form``);
  - ``(None, "unknown: ...")``: the config does not declare its state size (e.g. a plugin's core).
  """
  if length < 0 or num_heads < 1 or head_dim < 1:
    raise ValueError(f"state_size needs length >= 0, num_heads >= 1 and head_dim >= 1, got "
                     f"{length}, {num_heads}, {head_dim}")
  config = layer_config(name, **overrides)
  try:
    size = config.layer_state_size(length, num_heads=num_heads, head_dim=head_dim,
                                   d_model=num_heads * head_dim if d_model is None else d_model)
  except StateSizeUnknown:
    return None, (f"unknown: {type(config).__qualname__} ({defining_module(name)}) does not declare "
                  "state_size")
  if size is None:
    return None, f"no causal form: {config.no_causal_form or 'causal=True raises NotImplementedError'}"
  method = type(config).state_size
  declared = method not in (AttentionConfig.state_size, MixerConfig.state_size)
  doc = inspect.cleandoc(method.__doc__ or "") if declared else ""
  return int(size), " ".join(doc.split("\n\n")[0].split()) or f"declared by {method.__qualname__}"


def no_causal_form(name: str) -> str | None:
  """Why ``name`` (its default config) has no causal form, or None when it has one."""
  reason = layer_config(name).no_causal_form
  return f"no causal form: {reason}" if reason else None


import contextlib as _contextlib  # noqa: E402 - kept with the one helper that needs it
from typing import Iterator as _Iterator  # noqa: E402


@_contextlib.contextmanager
def temporary(layers: dict[str, tuple[Any, type[LayerConfig]]]) -> _Iterator[list[str]]:
  """Registers ``{name: (module class, config class)}`` for the ``with`` block only (tests' fake cores and
  toy mixers): the kind follows the config class (``MixerConfig`` → mixer, else attention core).

  A name already registered (of either kind) is an error; on exit those names are unregistered, whatever
  the block raised. Yields the names. A core may be of any style ``register_attention`` takes.
  """
  taken = sorted(set(layers) & set(_REGISTRY))
  if taken:
    raise PluginError(f"temporary: {', '.join(map(repr, taken))} already registered by "
                      f"{', '.join(_describe(_REGISTRY[name].defined_in) for name in taken)}")
  try:
    for name, (layer, config_cls) in layers.items():
      kind = "mixer" if isinstance(config_cls, type) and issubclass(config_cls, MixerConfig) else "attention"
      _register(name, config_cls, kind, {"__name__": getattr(layer, "__module__", None)})(layer)
    yield list(layers)
  finally:
    for name in layers:
      _REGISTRY.pop(name, None)


# ----------------------------------------------------------------------------------------------------
# Plugins: attention cores defined outside this package

PLUGINS_ENV = "LRA_BENCH_PLUGINS"
ENTRY_POINT_GROUP = "lra_bench.attentions"

_LOADED: set[str] = set()          # plugin specs imported successfully (module or module:attr)
_state = {"builtins_done": False, "entry_points_done": False, "loading": False}


def mark_builtins_registered() -> None:
  """Called by ``attention_zoo/__init__.py`` once every built-in core is registered: from then on the
  first lookup loads the automatic plugins (before, a clash could not be told apart from a built-in)."""
  _state["builtins_done"] = True


def _env_plugins() -> list[str]:
  return [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]


def _entry_point_specs() -> list[str]:
  """``module`` or ``module:attr`` of every ``lra_bench.attentions`` entry point, deduplicated (one
  distribution found twice on ``sys.path`` lists its entry points twice)."""
  specs = [ep.value.replace(" ", "") for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
  return list(dict.fromkeys(specs))


def _import_plugin(spec: str) -> None:
  """Imports ``module`` or ``module:attr`` once; on failure the names it registered are removed again
  and the error is one line naming the module."""
  if spec in _LOADED:
    return
  module, _, attr = spec.partition(":")
  if not module or not all(part.isidentifier() for part in module.split(".")):
    raise PluginError(f"plugin {spec!r} is not a module path (expected e.g. my_pkg.attention or "
                      f"my_pkg.attention:register)")
  before = dict(_REGISTRY)
  try:
    loaded = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
      loaded = getattr(loaded, part)
  except PluginError as err:
    undone = _restore(before)
    raise PluginError(f"plugin {module!r}: {err}{undone}") from None
  except Exception as err:  # noqa: BLE001 - any failure of user code is reported alike
    undone = _restore(before)
    detail = " ".join(str(err).split())
    if isinstance(err, ModuleNotFoundError) and err.name and f"{module}.".startswith(f"{err.name}."):
      detail += " (install it, or put the directory that holds it on PYTHONPATH)"  # the plugin itself
    raise PluginError(f"plugin {module!r} failed to import: {type(err).__name__}: {detail}{undone}") from None
  _LOADED.add(spec)


def _restore(snapshot: dict[str, _Entry]) -> str:
  """Puts the registry back as it was before a failed plugin (its layers of both kinds removed); returns
  the clause naming what was removed ("" when nothing was)."""
  added = {name: entry.kind for name, entry in _REGISTRY.items() if name not in snapshot}
  _REGISTRY.clear()
  _REGISTRY.update(snapshot)
  if not added:
    return ""
  return "; unregistered again: " + ", ".join(f"{_ARTICLE[kind]} {name!r}" for name, kind in sorted(added.items()))


def _load(specs: Iterable[str]) -> None:
  """Imports ``specs`` in order; re-entrant calls (a plugin that lists the registry while it is being
  imported) see the registry as it stands."""
  if _state["loading"]:
    return
  _state["loading"] = True
  try:
    for spec in specs:
      _import_plugin(spec)
  finally:
    _state["loading"] = False


def _load_automatic_plugins() -> None:
  """The variable's modules (read on every lookup: cheap, and a later change is seen) and, once, the
  entry points. A no-op while the built-ins are still being registered."""
  if not _state["builtins_done"] or _state["loading"]:
    return
  _load(_env_plugins())
  if not _state["entry_points_done"]:
    _load(_entry_point_specs())
    _state["entry_points_done"] = True


def load_plugins(modules: Iterable[str] | None = None) -> list[str]:
  """Imports the plugin modules (which may register attention cores, mixers or both) named here, in
  ``$LRA_BENCH_PLUGINS`` and by the ``lra_bench.attentions``
  entry points; each once, so calling it again is cheap. Returns the names the plugins registered.

  ``modules`` (the CLI's ``--plugin``) are also appended to ``$LRA_BENCH_PLUGINS``, and the directory
  each was imported from to ``$PYTHONPATH`` unless Python finds it anyway, so subprocesses (suite
  ``--isolate`` cells, ``bench`` points) load them too. The current directory is searched last, so
  ``--plugin my_attention`` finds ``./my_attention.py`` also from the ``lra-bench`` script.
  Raises :class:`PluginError` (one line naming the module) on an import failure or a name clash.
  """
  import attention_zoo  # noqa: F401 - built-ins first

  modules = [m.strip() for m in (modules or []) if m.strip()]
  if modules and os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.append(os.getcwd())
  before = set(_REGISTRY)
  _load(modules)
  for module in modules:
    _export(module)
  _load_automatic_plugins()
  return sorted(set(_REGISTRY) - before)


def _export(spec: str) -> None:
  """Makes ``spec`` importable by child processes: listed in the variable, its directory on the path."""
  listed = _env_plugins()
  if spec not in listed:
    os.environ[PLUGINS_ENV] = ",".join(listed + [spec])
  root = _import_root(spec.partition(":")[0])
  paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  if root and root not in paths and root not in _default_path():
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [root])


def _default_path() -> set[str]:
  """Directories every Python process of this interpreter searches (standard library, site-packages)."""
  paths = {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
  return paths | set(site.getsitepackages()) | {site.getusersitepackages()}


def _import_root(module: str) -> str | None:
  """The ``sys.path`` entry ``module`` was imported from (None for a module without a file)."""
  top = sys.modules.get(module.split(".")[0])
  locations = list(getattr(top, "__path__", None) or [])  # a package (or namespace package)
  if locations:
    return os.path.dirname(os.path.abspath(locations[0]))
  file = getattr(top, "__file__", None)
  return os.path.dirname(os.path.abspath(file)) if file else None
