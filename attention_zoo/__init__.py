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

__all__ = [
    "AttentionConfig",
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
