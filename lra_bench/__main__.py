from lra_bench.cli import run

run()
