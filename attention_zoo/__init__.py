"""attention_zoo: the registry of sequence layers — attention cores and sequence mixers — (see ``registry.py``
for the contract).

Every layer module in this package is imported here (the mixers through ``attention_zoo.mixers``, which imports
its own files), so a new layer is one new file with one decorated class: no other edit is needed for it to appear
in ``list_layers()``. A module whose name starts with an underscore (``_common``, ``_blocks``, ...) is a helper
that registers nothing; the layers that use it import it. Layers outside the package (plugins: ``--plugin``,
``$LRA_BENCH_PLUGINS``, the ``lra_bench.attentions`` entry points) are loaded by :func:`load_plugins`, or lazily
by the first registry lookup.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from attention_zoo import _xla_cpu  # noqa: F401  (first: sets XLA_FLAGS before any computation; _xla_cpu.py)
from attention_zoo import registry as _registry
from attention_zoo.registry import (
    FAMILIES,
    KINDS,
    AttentionConfig,
    LayerConfig,
    MixerConfig,
    PluginError,
    StateSizeUnknown,
    attention_config,
    attention_family,
    create_attention,
    create_layer,
    create_mixer,
    defining_module,
    layer_config,
    layer_defining_module,
    layer_family,
    layer_kind,
    list_attentions,
    list_layers,
    list_mixers,
    load_plugins,
    mixer_config,
    no_causal_form,
    register_attention,
    register_mixer,
    state_size,
    temporary,
)

for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
  if _info.name != "registry" and not _info.name.startswith("_"):
    _importlib.import_module(f"{__name__}.{_info.name}")
_registry.mark_builtins_registered()

__all__ = [
    "FAMILIES",
    "KINDS",
    "AttentionConfig",
    "LayerConfig",
    "MixerConfig",
    "PluginError",
    "StateSizeUnknown",
    "attention_config",
    "attention_family",
    "create_attention",
    "create_layer",
    "create_mixer",
    "defining_module",
    "layer_config",
    "layer_defining_module",
    "layer_family",
    "layer_kind",
    "list_attentions",
    "list_layers",
    "list_mixers",
    "load_plugins",
    "mixer_config",
    "no_causal_form",
    "register_attention",
    "register_mixer",
    "state_size",
    "temporary",
]
