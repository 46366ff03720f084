"""attention_zoo: a registry of attention cores (see ``registry.py`` for the contract).

Every module in this package is imported here, so a new attention is one new file with one decorated
class: no other edit is needed for it to appear in ``list_attentions()``.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from attention_zoo.registry import (
    AttentionConfig,
    attention_config,
    create_attention,
    list_attentions,
    register_attention,
)

for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
  if _info.name not in ("registry",):
    _importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "AttentionConfig",
    "attention_config",
    "create_attention",
    "list_attentions",
    "register_attention",
]
