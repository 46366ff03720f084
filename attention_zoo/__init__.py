"""attention_zoo: a registry of attention cores (see ``registry.py`` for the contract).

Every core module in this package is imported here, so a new attention is one new file with one decorated
class: no other edit is needed for it to appear in ``list_attentions()``. A module whose name starts with an
underscore (``_common``, ``_blocks``, ...) is a helper that registers nothing; the cores that use it import
it. Cores outside the package (plugins: ``--plugin``, ``$LRA_BENCH_PLUGINS``, the ``lra_bench.attentions``
entry points) are loaded by :func:`load_plugins`, or lazily by the first registry lookup.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from attention_zoo import registry as _registry
from attention_zoo.registry import (
    AttentionConfig,
    PluginError,
    StateSizeUnknown,
    attention_config,
    create_attention,
    defining_module,
    list_attentions,
    load_plugins,
    register_attention,
    state_size,
)

for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
  if _info.name != "registry" and not _info.name.startswith("_"):
    _importlib.import_module(f"{__name__}.{_info.name}")
_registry.mark_builtins_registered()

from attention_zoo.mixers import (  # noqa: E402 - imported (and its mixers registered) by the loop above
    MixerConfig,
    create_mixer,
    is_mixer,
    list_mixers,
    mixer_config,
    register_mixer,
)


def layer_kind(name: str) -> str:
  """``"mixer"`` for a registered sequence mixer, else ``"attention"`` (unknown names included: the
  attention registry's lookup then names the error)."""
  return "mixer" if is_mixer(name) else "attention"


def list_layers() -> list[str]:
  """Every registered attention core, then every sequence mixer (what ``--attentions all`` selects)."""
  return list_attentions() + list_mixers()


def layer_config(name: str, **overrides):
  """The frozen config of ``name``, attention core or sequence mixer."""
  return mixer_config(name, **overrides) if is_mixer(name) else attention_config(name, **overrides)


def layer_defining_module(name: str) -> str:
  """The module that registered ``name``, attention core or sequence mixer."""
  from attention_zoo import mixers

  return mixers.mixer_defining_module(name) if is_mixer(name) else defining_module(name)

__all__ = [
    "AttentionConfig",
    "MixerConfig",
    "create_mixer",
    "is_mixer",
    "layer_config",
    "layer_defining_module",
    "layer_kind",
    "list_layers",
    "list_mixers",
    "mixer_config",
    "register_mixer",
    "PluginError",
    "StateSizeUnknown",
    "attention_config",
    "create_attention",
    "defining_module",
    "list_attentions",
    "load_plugins",
    "register_attention",
    "state_size",
]
