"""A workaround for a crash of XLA's CPU backend, applied when this module is imported: first thing, by
``attention_zoo/__init__.py`` (a leading underscore: registers nothing).

jaxlib 0.8.1 to at least 0.10.2 hand some fused elementwise and reduce computations on CPU to the YNNPACK
library (``xla_cpu_experimental_ynn_fusion_type``), and on an AVX2-only host (AMD EPYC, no AVX-512) some of
those programs crash the process at run time (a segmentation fault in YNNPACK's transpose,
``slinky::fuse_contiguous_dims``): the gradient of ``sum(x[.., :, None, :] * y[.., None, :, :], -1)`` for x, y
of shape [2, 2, 1, 2, 8, 16] (the engine's per-key-decay Gram matrix: GLA's chunked form under the conformance
kit's ``gradients`` check), and GLA's chunked train step at MQAR's shape. With YNNPACK's fusions off
(``--xla_cpu_experimental_ynn_fusion_type=``) both run, and the layers' CPU steps are as fast or faster
(gradient of one layer, batch 64, 64 tokens, width 64, one XLA thread: rwkv7 chunked 420 -> 220 ms, deltanet
169 -> 162 ms, mamba2 95 -> 98 ms). XLA reads ``XLA_FLAGS`` when its first backend starts, so the flag is set
here, before any computation; a program that started a JAX backend before importing ``attention_zoo`` keeps
the default (set the flag yourself). ``XLA_FLAGS`` that already name the flag are left alone; jaxlib before
0.8.1 lacks the flag (0.8.0 has none, and XLA aborts on an unknown flag), so nothing is set there. Test:
tests/test_xla_cpu.py.
"""

from __future__ import annotations

import importlib.metadata
import os
import re

NAME = "xla_cpu_experimental_ynn_fusion_type"
FLAG = f"--{NAME}="  # empty: no YNNPACK fusion
FIRST = (0, 8, 1)  # the first jaxlib with the flag (the wheels' strings: 0.8.0 lacks it; 0.8.1-0.10.2 have it)


def _version(text: str) -> tuple[int, ...]:
  """(major, minor, patch) of a version string ("0.11.0rc1" -> (0, 11, 0))."""
  return tuple(int(n) for n in re.findall(r"\d+", text)[:3])


def flags_with_workaround(flags: str, jaxlib_version: str | None) -> str:
  """``flags`` (an ``XLA_FLAGS`` value) with YNNPACK's fusions turned off, where this jaxlib has the flag and
  ``flags`` does not name it. The flag goes first: XLA ignores whatever follows a word that is not a flag."""
  if NAME in flags or jaxlib_version is None or _version(jaxlib_version) < FIRST:
    return flags
  return f"{FLAG} {flags}".strip()


def apply() -> None:
  """Sets ``XLA_FLAGS`` for this process and the processes it starts (module docstring)."""
  try:
    version = importlib.metadata.version("jaxlib")
  except importlib.metadata.PackageNotFoundError:
    version = None
  flags = os.environ.get("XLA_FLAGS", "")
  new = flags_with_workaround(flags, version)
  if new != flags:
    os.environ["XLA_FLAGS"] = new


apply()
