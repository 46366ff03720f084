"""Scale-out with JAX's SPMD engine: multi-host start-up, the device mesh, shardings, global batches.

Every run is data-parallel over a 1-D mesh of all devices of all processes, ``Mesh(devices, ("data",))``
(one device is a mesh of one; there is no single-device code path). Batches are sharded over ``data``
(their leading axis); the train state is replicated, or with ``param_sharding = "fsdp"`` each large
array of it (parameters and the optimizer moments alike) is split over ``data`` along its largest
divisible axis and XLA inserts the all-gathers / reduce-scatters. The steps themselves stay pure and
unaware of devices: the loop jits them with ``in_shardings`` / ``out_shardings`` from here.

Multi-host: each process reads its own shard of the data (``tasks.base.batched(num_shards=...)``) and
``global_batch`` assembles the per-process pieces into one global ``jax.Array``.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lra_bench.errors import ConfigError

DATA = "data"  # the mesh axis batches are split over
PARAM_SHARDINGS = ("replicated", "fsdp")  # config.param_sharding: the state replicated, or split (module docstring)
# Arrays smaller than this stay replicated under "fsdp" (biases, norms, step counters, keys): splitting
# them saves nothing and costs a collective each.
FSDP_MIN_SIZE = 2 ** 14

# Environment variables under which a process is one of several (so start jax.distributed): JAX's own
# coordinator variable, and the launchers JAX detects itself (Slurm, Open MPI) when they start > 1 task.
_COUNT_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def wants_distributed(environ=os.environ) -> bool:
  """Whether the environment says this process is one of several."""
  if environ.get("JAX_COORDINATOR_ADDRESS"):
    return True
  return any(int(environ.get(var, "1") or 1) > 1 for var in _COUNT_VARS)


def distributed_arguments(coordinator_address: str | None = None, num_processes: int | None = None,
                          process_id: int | None = None, distributed: bool | None = None,
                          environ=os.environ) -> dict[str, Any] | None:
  """The ``jax.distributed.initialize`` keyword arguments, or None when this is a one-process run.

  Explicit values (CLI flags) win; then ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` /
  ``JAX_PROCESS_ID``; whatever is still unset JAX detects itself (Slurm, Open MPI, Cloud TPU pod slices,
  Kubernetes). ``distributed=True`` forces the start-up (e.g. a TPU pod slice, where nothing in the
  environment says so), ``False`` forbids it, ``None`` decides from the arguments and the environment.
  """
  if distributed is False:
    return None
  env_int = lambda name: int(environ[name]) if environ.get(name) else None
  kwargs = {"coordinator_address": coordinator_address or environ.get("JAX_COORDINATOR_ADDRESS") or None,
            "num_processes": num_processes if num_processes is not None else env_int("JAX_NUM_PROCESSES"),
            "process_id": process_id if process_id is not None else env_int("JAX_PROCESS_ID")}
  explicit = coordinator_address is not None or (num_processes or 1) > 1
  if not (distributed or explicit or wants_distributed(environ)):
    return None
  if kwargs["num_processes"] is not None and kwargs["process_id"] is not None \
      and not 0 <= kwargs["process_id"] < kwargs["num_processes"]:
    raise ConfigError(f"process_id {kwargs['process_id']} is not in [0, num_processes = "
                      f"{kwargs['num_processes']})")
  return {k: v for k, v in kwargs.items() if v is not None}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, distributed: bool | None = None) -> bool:
  """Starts ``jax.distributed`` when this is a multi-process run (see ``distributed_arguments``).

  Must run before anything touches a device. Returns whether it started it.
  """
  kwargs = distributed_arguments(coordinator_address, num_processes, process_id, distributed)
  if kwargs is None:
    return False
  jax.distributed.initialize(**kwargs)
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
  return True


def make_mesh(devices=None) -> Mesh:
  """The 1-D ``data`` mesh over ``devices`` (default: every device of every process)."""
  devices = list(jax.devices() if devices is None else devices)
  return Mesh(np.asarray(devices), (DATA,))


def batch_split(batch_size: int, accumulate_steps: int, num_devices: int, num_processes: int) -> dict:
  """How one global batch is split; a ConfigError naming the numbers when it cannot be split evenly.

  The global (protocol) batch is ``accumulate_steps`` micro-batches; each micro-batch is spread over
  every device, and each process loads its own slice of every batch.
  """
  if accumulate_steps < 1:
    raise ConfigError(f"accumulate_steps must be >= 1, got {accumulate_steps}")
  if batch_size % accumulate_steps:
    raise ConfigError(f"batch_size {batch_size} is not divisible by accumulate_steps {accumulate_steps}")
  micro = batch_size // accumulate_steps
  if micro % num_devices or micro < num_devices:
    raise ConfigError(
        f"the micro-batch (batch_size {batch_size} / accumulate_steps {accumulate_steps} = {micro}) is "
        f"not divisible by the {num_devices} devices ({num_processes} process(es)); choose a batch_size "
        f"that is a multiple of {accumulate_steps * num_devices}")
  return {"per_process_batch_size": batch_size // num_processes,
          "per_device_batch_size": micro // num_devices, "micro_batch_size": micro}


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _fsdp_spec(shape: tuple[int, ...], num_shards: int) -> P:
  """Split the largest axis that ``num_shards`` divides (if the array is large enough), else replicate."""
  if num_shards == 1 or math.prod(shape) < FSDP_MIN_SIZE:
    return P()
  axes = sorted((size, axis) for axis, size in enumerate(shape) if size % num_shards == 0)
  if not axes:
    return P()
  axis = axes[-1][1]
  return P(*([None] * axis + [DATA]))


def state_shardings(state, mesh: Mesh, param_sharding: str = "replicated"):
  """A ``NamedSharding`` per leaf of ``state`` (arrays or ``ShapeDtypeStruct``s)."""
  if param_sharding == "replicated":
    return jax.tree.map(lambda _: replicated(mesh), state)
  return jax.tree.map(lambda x: NamedSharding(mesh, _fsdp_spec(tuple(x.shape), mesh.size)), state)


def global_batch(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """This process's slice of a batch -> the global batch, sharded over ``data``.

  The global batch is the concatenation of the processes' slices in process order (one process: the
  slice is the whole batch).
  """
  sharding = batch_sharding(mesh)
  return {key: jax.make_array_from_process_local_data(sharding, value) for key, value in local.items()}

