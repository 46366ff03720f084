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
  # The inputs the output does not depend on, by design: () for attention (the weights come from the
  # query and the key), ("query", "key") for a content-independent mixer (FNet, the random
  # synthesizers). The conformance kit checks that redrawing any other of the two moves the output.
  ignores: ClassVar[tuple[str, ...]] = ()
  # The family the benchmark report groups this core under (one panel of its scaling figures; ``FAMILIES``
  # gives their order). A core that declares none, e.g. a plugin's, is "other".
  family: ClassVar[str] = "other"

  # Why the core has no causal form (its ``causal=True`` raises ``NotImplementedError``), or None when it
  # has one. :meth:`state_size` is None exactly when this is set; a config whose causal form depends on
  # its fields (Longformer's global tokens, ...) makes it a property.
  no_causal_form: ClassVar[str | None] = None

  def support(self, length: int) -> np.ndarray | None:
    """bool [L, L] (query, key): the only pairs that may get non-zero weight at this length (without
    padding), or None when the core promises no fixed pattern (e.g. data-dependent or random support).
    Tests check the probe against it; the attention-pattern plots may draw it."""
    del length
    return None

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
    del length, num_heads, head_dim
    if self.no_causal_form:
      return None
    raise StateSizeUnknown(f"{type(self).__qualname__} does not declare state_size (state size not declared)")


class StateSizeUnknown(NotImplementedError):
  """Raised by :meth:`AttentionConfig.state_size` for a config that does not declare its state size."""


def peak_over_prefixes(length: int, period: int, state_at: Callable[[int], int]) -> int:
  """``max(state_at(t) for t in 0..length)`` for a ``state_at`` that, at a fixed ``t mod period``,
  never decreases as t grows (a buffer that empties at every block boundary, plus anything that only
  grows): only the last ``period`` values of t can hold the maximum, so only they are evaluated."""
  return max(state_at(t) for t in range(max(0, length - max(period, 1) + 1), length + 1))


# The families of ``AttentionConfig.family``, in the order the report draws them: exact softmax; fixed sparse
# patterns; low-rank / latent projections of the length axis; kernel feature maps; patterns learned or
# computed from the content (hashing, clustering, sorting); the Combiner family; mixers without query-key
# dot products. A family not listed here (a plugin's own) comes after these, before "other".
FAMILIES = ("exact", "sparse", "low-rank", "kernel", "learned-pattern", "combiner", "mixing", "other")


def attention_family(name: str) -> str:
  """The family ``name``'s config declares (``AttentionConfig.family``); "other" for a name that is not
  registered in this process (e.g. a plugin's records read without its ``--plugin``)."""
  try:
    family = _entry(name).config_cls.family
  except ValueError:
    return "other"
  return family if isinstance(family, str) and family else "other"


@dataclasses.dataclass(frozen=True)
class _Entry:
  module_cls: type[nn.Module]
  config_cls: type[AttentionConfig]
  defined_in: str  # the module whose code called register_attention (what records name)
  source: str | None = None  # that module's file (one file imported under two names is one module)


_REGISTRY: dict[str, _Entry] = {}


class PluginError(ValueError):
  """A plugin module failed to import, or registered a name another module already holds."""


CoreT = TypeVar("CoreT")


def register_attention(name: str, config_cls: type[AttentionConfig]) -> Callable[[CoreT], CoreT]:
  """Decorator: registers a core under ``name`` with default config ``config_cls()``.

  The core is a ``flax.linen`` module class, a ``flax.nnx`` module class or a plain function (the
  module docstring gives each style's contract); the decorated object is returned unchanged.
  """
  if not (dataclasses.is_dataclass(config_cls) and issubclass(config_cls, AttentionConfig)):
    raise TypeError(f"config_cls for {name!r} must be a dataclass deriving from AttentionConfig")
  if not config_cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
    raise TypeError(f"config_cls for {name!r} must be a frozen dataclass")
  # The caller's module, not the class's: a plugin may register a built-in class under a new name.
  caller = sys._getframe(1).f_globals  # noqa: SLF001 - the documented way to read the caller's frame

  def decorator(core: CoreT) -> CoreT:
    module_cls = _as_linen(name, core)
    _add(name, module_cls, config_cls, caller.get("__name__") or module_cls.__module__,
         caller.get("__file__"))
    return core

  return decorator


def _add(name: str, module_cls: type[nn.Module], config_cls: type[AttentionConfig], defined_in: str,
         source: str | None = None) -> None:
  """Registers ``name``; the same module (or its source file) registering it again replaces it (a
  reload), any other module registering it is a :class:`PluginError` naming both."""
  source = os.path.realpath(source) if source else None
  existing = _REGISTRY.get(name)
  if existing is not None and not _same_module(existing, defined_in, source):
    raise PluginError(
        f"attention {name!r} is registered twice: by {_describe(existing.defined_in)} and by "
        f"{_describe(defined_in)}; rename one of them")
  if existing is not None:  # records keep naming the module that registered it first
    defined_in, source = existing.defined_in, existing.source
  _REGISTRY[name] = _Entry(module_cls, config_cls, defined_in, source)


def _same_module(entry: _Entry, defined_in: str, source: str | None) -> bool:
  if entry.defined_in == defined_in:
    return True
  return entry.source is not None and entry.source == source


# ----------------------------------------------------------------------------------------------------
# The NNX and function styles, wrapped into linen modules with the one ``config`` field

FUNCTION_KEYWORDS = ("config", "deterministic", "dropout_rng")  # what a function core may declare


def _as_linen(name: str, core: Any) -> type[nn.Module]:
  """The linen module class that runs ``core`` (itself when it is one)."""
  if isinstance(core, type) and issubclass(core, nn.Module):
    return core
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
  """The module that registered ``name`` (``attention_zoo.vanilla``, or a plugin's module)."""
  return _entry(name).defined_in


def list_attentions() -> list[str]:
  """Sorted names of every registered attention core (built-in and plugins)."""
  _load_automatic_plugins()
  return sorted(_REGISTRY)


def _entry(name: str) -> _Entry:
  _load_automatic_plugins()
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(
        f"unknown attention {name!r}; known attentions: {', '.join(list_attentions())} (a core defined "
        f"outside lra-bench is loaded by --plugin MODULE, ${PLUGINS_ENV} or an installed "
        f"{ENTRY_POINT_GROUP!r} entry point)") from None


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


def state_size(name: str, length: int, num_heads: int, head_dim: int, **overrides: Any
               ) -> tuple[int | None, str]:
  """(scalars, reason): the causal state of one layer of ``name`` (config ``overrides`` applied) per
  example after ``length`` tokens, ``num_heads`` heads of ``head_dim`` (value dim the same); see
  :meth:`AttentionConfig.state_size`.

  - ``(n, formula)``: the count and the first paragraph of the config's ``state_size`` docstring (its
    formula and why);
  - ``(None, "no causal form: ...")``: the core has none (``AttentionConfig.no_causal_form``);
  - ``(None, "unknown: ...")``: the config does not declare its state size (e.g. a plugin's core).
  """
  if length < 0 or num_heads < 1 or head_dim < 1:
    raise ValueError(f"state_size needs length >= 0, num_heads >= 1 and head_dim >= 1, got "
                     f"{length}, {num_heads}, {head_dim}")
  config = attention_config(name, **overrides)
  try:
    size = config.state_size(length, num_heads, head_dim)
  except StateSizeUnknown:
    return None, (f"unknown: {type(config).__qualname__} ({defining_module(name)}) does not declare "
                  "state_size")
  if size is None:
    return None, f"no causal form: {config.no_causal_form or 'causal=True raises NotImplementedError'}"
  method = type(config).state_size
  doc = inspect.cleandoc(method.__doc__ or "") if method is not AttentionConfig.state_size else ""
  return int(size), " ".join(doc.split("\n\n")[0].split()) or f"declared by {method.__qualname__}"


import contextlib as _contextlib  # noqa: E402 - kept with the one helper that needs it
from typing import Iterator as _Iterator  # noqa: E402


@_contextlib.contextmanager
def temporary(cores: dict[str, tuple[Any, type[AttentionConfig]]]) -> _Iterator[list[str]]:
  """Registers ``{name: (module class, config class)}`` for the ``with`` block only (tests' fake cores).

  A name already registered is an error; on exit those names are unregistered, whatever the block
  raised. Yields the names. A core may be of any style ``register_attention`` takes.
  """
  taken = sorted(set(cores) & set(_REGISTRY))
  if taken:
    raise PluginError(f"temporary: {', '.join(map(repr, taken))} already registered by "
                      f"{', '.join(_describe(_REGISTRY[name].defined_in) for name in taken)}")
  try:
    for name, (core, config_cls) in cores.items():
      register_attention(name, config_cls)(core)
      _REGISTRY[name] = dataclasses.replace(_REGISTRY[name], defined_in=core.__module__)  # not this one
    yield list(cores)
  finally:
    for name in cores:
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
    _restore(before)
    raise PluginError(f"plugin {module!r}: {err}") from None
  except Exception as err:  # noqa: BLE001 - any failure of user code is reported alike
    _restore(before)
    detail = " ".join(str(err).split())
    if isinstance(err, ModuleNotFoundError) and err.name and f"{module}.".startswith(f"{err.name}."):
      detail += " (install it, or put the directory that holds it on PYTHONPATH)"  # the plugin itself
    raise PluginError(f"plugin {module!r} failed to import: {type(err).__name__}: {detail}") from None
  _LOADED.add(spec)


def _restore(snapshot: dict[str, _Entry]) -> None:
  _REGISTRY.clear()
  _REGISTRY.update(snapshot)


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
  """Imports the plugin modules named here, in ``$LRA_BENCH_PLUGINS`` and by the ``lra_bench.attentions``
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
