"""Protocol presets: one module per protocol, each with ``get_config(task) -> ConfigDict``.

Load them through ``lra_bench.training.config.load_config(protocol, task)``, which locks the result (unknown keys
are errors) and applies command-line overrides.
"""

import pkgutil


def list_protocols() -> list[str]:
  """The protocol modules of this package (``lra-bench list protocols``): the one list of protocols."""
  return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
