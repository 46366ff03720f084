"""What XLA and the runtime say about a compiled step: FLOPs, compiled memory, peak memory, OOM errors."""

from __future__ import annotations

import resource

import jax


def cost_analysis(compiled) -> dict[str, float | None]:
  """XLA's FLOPs and memory estimate of a compiled executable (None where the backend has none).

  ``compiled_memory_bytes`` = arguments + outputs + temporaries - aliased (donated) bytes, from
  ``memory_analysis()``: what XLA plans to hold at once for one call, computed without running it, so it
  means the same on CPU, GPU and TPU (unlike the measured peak, which only GPU/TPU report).
  """
  out: dict[str, float | None] = {"flops": None, "compiled_memory_bytes": None, "temp_bytes": None}
  try:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0] if cost else {}
    out["flops"] = float(cost.get("flops")) if cost and cost.get("flops") is not None else None
  except Exception:  # noqa: BLE001 - not every backend implements it
    pass
  try:
    mem = compiled.memory_analysis()
    if mem is not None:
      out["temp_bytes"] = int(mem.temp_size_in_bytes)
      out["compiled_memory_bytes"] = int(mem.temp_size_in_bytes + mem.argument_size_in_bytes
                                         + mem.output_size_in_bytes - mem.alias_size_in_bytes)
  except Exception:  # noqa: BLE001
    pass
  return out


def peak_memory_bytes() -> int | None:
  """Measured peak bytes in use on the first local device since the process started, where the backend
  reports it (``memory_stats()["peak_bytes_in_use"]`` on GPU/TPU; None on CPU)."""
  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception:  # noqa: BLE001
    return None
  return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def is_oom(err: BaseException) -> bool:
  text = f"{type(err).__name__}: {err}"
  return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM"))


def host_peak_rss_bytes() -> int:
  """Peak resident memory of this process (Linux reports KiB)."""
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
