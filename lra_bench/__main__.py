"""``python -m lra_bench``: the same command line as ``lra-bench`` (lra_bench/cli.py)."""

from lra_bench.cli import run

run()
