"""Protocol presets: one module per protocol, each with ``get_config(task) -> ConfigDict``.

Load them through ``lra_bench.training.config.load_config(protocol, task)``, which locks the result (unknown keys
are errors) and applies command-line overrides.
"""
