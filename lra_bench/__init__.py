"""lra-bench: the Long-Range Arena harness (shared encoder, training loop, results, suite, reports)."""

__version__ = "0.1.0"
