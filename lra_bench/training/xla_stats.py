"""What XLA and the runtime say about a compiled step: FLOPs, compiled memory, peak memory, OOM errors.

Before a compiled program first runs, ``check_fits`` compares what it will allocate (XLA's memory
analysis: outputs + temporaries - donated buffers) with the memory still free (the device's allocator
limit on GPU/TPU; on CPU the host's available memory and the cgroup limit), and refuses a program that
cannot fit with ``MemoryEstimateError`` (an ``oom`` record with the estimate) instead of letting the
allocator abort the process or the kernel's OOM killer end it without a record.
"""

from __future__ import annotations

import resource

import jax

from lra_bench import errors

GIB = 2 ** 30


class MemoryEstimateError(errors.UserError, MemoryError):
  """A compiled program needs more memory than is free; refused before it runs (the message says both)."""


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
  """Whether ``err`` is an allocation failure: XLA's (RESOURCE_EXHAUSTED, "Out of memory ..."), the
  host's (MemoryError, numpy's "Unable to allocate", C++ bad_alloc) or ``check_fits``'s refusal."""
  if isinstance(err, MemoryError):
    return True
  text = f"{type(err).__name__}: {err}"
  return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM",
                                 "Unable to allocate", "Failed to allocate", "bad_alloc"))


def _read_int(path: str) -> int | None:
  try:
    with open(path) as f:
      text = f.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None


def host_available_bytes() -> int | None:
  """Memory this process can still take on the host: MemAvailable, and the cgroup's limit if lower."""
  available = None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          available = int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
  if limit is not None and used is not None:
    available = min(available, limit - used) if available is not None else limit - used
  return available


def available_bytes(device=None) -> tuple[int | None, str]:
  """(free bytes, where) on ``device`` (default: the first local one); None where nothing says."""
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 - not every backend reports
    stats = None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), f"{device.device_kind} memory"
  return host_available_bytes(), "host memory"


def new_bytes(compiled) -> int | None:
  """Bytes a call of ``compiled`` allocates (outputs + temporaries - donated), from XLA's analysis."""
  try:
    mem = compiled.memory_analysis()
  except Exception:  # noqa: BLE001
    return None
  if mem is None:
    return None
  return int(mem.temp_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes)


def check_fits(compiled, what: str, fix: str) -> None:
  """Raises ``MemoryEstimateError`` if one call of ``compiled`` cannot fit in the free memory."""
  needed = new_bytes(compiled)
  free, where = available_bytes()
  if needed is None or free is None or needed <= free:
    return
  raise MemoryEstimateError(f"out of memory: the {what} needs {needed / GIB:.1f} GiB (XLA's estimate, "
                            f"before running it) and {free / GIB:.1f} GiB of {where} is free; {fix}")


def host_peak_rss_bytes() -> int:
  """Peak resident memory of this process (Linux reports KiB)."""
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
