"""An example lra-bench plugin package (see ``core.py``; ``broken.py`` is a deliberately wrong variant).

Nothing is imported here: the entry point names ``my_attention.core``, so installing the package
registers ``my_attention`` and never the broken variant.
"""
