"""The process's place in a data-parallel job, read from the environment in torchrun's convention.

torchrun (and resnet_native.distributed.launch) set, for every process:
  RANK         its index among all processes, 0 .. WORLD_SIZE-1 (rank 0 hosts the rendezvous store)
  WORLD_SIZE   the number of processes
  LOCAL_RANK   its index among the processes of its host (the GPU it uses)
  MASTER_ADDR  the host of rank 0's store; MASTER_PORT its TCP port
  LOCAL_WORLD_SIZE (optional) the number of processes on its host
No variable at all means a single process. world_from_launcher_env() also reads mpirun's and Slurm's variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .._core.names import bounded_int

DEFAULT_ADDR = "127.0.0.1"  # loopback: a job on one host needs no network interface
DEFAULT_PORT = 29500  # torchrun's default
MAX_WORLD_SIZE = 1 << 20
# The variables that place a process; all of them or none.
REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# mpirun (Open MPI) and Slurm spell RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE these ways.
LAUNCHER_NAMES = {
    "mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
}


@dataclass(frozen=True)
class World:
    """rank of world_size processes, local_rank on its host; rank 0's store listens on master_addr:master_port."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = DEFAULT_ADDR
    master_port: int = DEFAULT_PORT

    def __post_init__(self):
        bounded_int("world_size", self.world_size, 1, MAX_WORLD_SIZE, "processes")
        bounded_int("rank", self.rank, 0, self.world_size - 1, "ranks (below world_size)")
        bounded_int("local_rank", self.local_rank, 0, self.world_size - 1, "ranks (below world_size)")
        bounded_int("master_port", self.master_port, 1, 65535, "TCP ports")
        if not isinstance(self.master_addr, str) or not self.master_addr or any(c.isspace()
                                                                                for c in self.master_addr):
            raise ValueError(f"master_addr: expected a host name or IP address, got {self.master_addr!r}")

    @property
    def is_primary(self) -> bool:
        """Rank 0: the process that hosts the store and alone writes the run folder."""
        return self.rank == 0

    @property
    def address(self) -> str:
        """'host:port' of the store, for messages."""
        return f"{self.master_addr}:{self.master_port}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> World:
        """The World torchrun's variables describe; World() when none is set. A partial set or a malformed value
        is a ValueError naming the variable and what was expected."""
        present = [name for name in REQUIRED if name in env]
        if not present:
            return cls()
        missing = [name for name in REQUIRED if name not in env]
        if missing:
            raise ValueError(f"{', '.join(missing)}: not set, but {', '.join(present)} are; a distributed process "
                             f"needs all of {', '.join(REQUIRED)} (or none, for a single process)")
        return _checked_world(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                              env["MASTER_ADDR"], env_int(env, "MASTER_PORT", 1, 65535))


def env_int(env: Mapping[str, str], name: str, low: int, high: int) -> int:
    """The integer in env[name], in [low, high]; else a ValueError naming the variable."""
    text = env[name].strip()
    try:
        value = int(text, 10)
    except ValueError:
        raise ValueError(f"{name}={env[name]!r}: expected an integer between {low} and {high}") from None
    if not low <= value <= high:
        raise ValueError(f"{name}={value}: expected an integer between {low} and {high}")
    return value


def _checked_world(env, rank_name, size_name, local_name, local_size_name, addr, port) -> World:
    """A World from the counting variables named, each checked against the others (messages name them);
    local_size_name None or unset: LOCAL_RANK is only checked against the world size."""
    size = env_int(env, size_name, 1, MAX_WORLD_SIZE)
    rank = env_int(env, rank_name, 0, MAX_WORLD_SIZE)
    if rank >= size:
        raise ValueError(f"{rank_name}={rank}: expected a rank below {size_name}={size}")
    local = env_int(env, local_name, 0, MAX_WORLD_SIZE)
    if local_size_name is not None and local_size_name in env:
        local_size = env_int(env, local_size_name, 1, size)
        if local >= local_size:
            raise ValueError(f"{local_name}={local}: expected a rank below {local_size_name}={local_size}")
    elif local >= size:
        raise ValueError(f"{local_name}={local}: expected a rank below {size_name}={size}")
    if not addr.strip() or any(c.isspace() for c in addr):
        raise ValueError(f"MASTER_ADDR={addr!r}: expected a host name or IP address")
    return World(rank, size, local, addr, port)


def world_from_launcher_env(env: Mapping[str, str] = os.environ) -> World:
    """The World of a process started by torchrun / resnet_native's launcher, mpirun or srun.

    torchrun's RANK / WORLD_SIZE / LOCAL_RANK win whenever one of them is set (World.from_env). Otherwise:
      mpirun (Open MPI): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE stand for RANK, WORLD_SIZE,
                         LOCAL_RANK, LOCAL_WORLD_SIZE;  pass the address with `mpirun -x MASTER_ADDR -x MASTER_PORT`
      Slurm (srun):      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (SLURM_NTASKS_PER_NODE) stand for the same;
                         MASTER_ADDR is typically `scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1`
    MASTER_ADDR and MASTER_PORT come from the environment in both cases; when they are unset, a job whose processes
    all share one host (local size == world size, or SLURM_NNODES=1) uses 127.0.0.1:29500, and a job over several
    hosts is a ValueError asking for MASTER_ADDR.
    """
    if any(name in env for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return World.from_env(env)
    for launcher, (rank, size, local, local_size) in LAUNCHER_NAMES.items():
        if rank not in env:
            continue
        for name in (size, local):
            if name not in env:
                raise ValueError(f"{name}: not set, but {rank} is ({launcher} sets both)")
        port = env_int(env, "MASTER_PORT", 1, 65535) if "MASTER_PORT" in env else DEFAULT_PORT
        if "MASTER_ADDR" in env:
            addr = env["MASTER_ADDR"]
        elif _one_host(env, size, local_size):
            addr = DEFAULT_ADDR
        else:
            raise ValueError(f"MASTER_ADDR: not set; a {launcher} job over several hosts needs the address of "
                             f"rank 0's host in MASTER_ADDR")
        # Slurm's SLURM_NTASKS_PER_NODE may read '4(x2)' (tasks per node, per node group): not a local size.
        sized = local_size if env.get(local_size, "").strip().isdigit() else None
        return _checked_world(env, rank, size, local, sized, addr, port)
    return World.from_env(env)


def _one_host(env, size_name, local_size_name) -> bool:
    """Whether the launcher's variables say every process runs on this host."""
    if env.get("SLURM_NNODES", "").strip() == "1":
        return True
    return local_size_name in env and env[local_size_name].strip() == env[size_name].strip()
