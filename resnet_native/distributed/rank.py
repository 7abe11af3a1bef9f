"""One rank's start in a data-parallel job: its GPU (LOCAL_RANK), NCCL's settings, and the rendezvous.

The trainer's command line calls join(world) for a World of world_size > 1; the Store it yields carries the NCCL
unique id, the barriers and (on the host backend) the gradients.
"""

from __future__ import annotations

import contextlib
import os

from .store import rendezvous
from .world import World

RENDEZVOUS_TIMEOUT_S = 300.0  # every rank must have started within this long of rank 0 (imports, data decode)


def use_local_gpu(world: World) -> int:
    """Makes GPU local_rank the current device of this process (before anything touches a GPU); returns it. A
    host with fewer GPUs than the rank needs is a RuntimeError naming both."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if world.local_rank >= count:
        raise RuntimeError(f"rank {world.rank}: LOCAL_RANK {world.local_rank} needs GPU {world.local_rank}, but "
                           f"this host has {count} visible GPU(s) (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    cupy.cuda.Device(world.local_rank).use()
    return world.local_rank


@contextlib.contextmanager
def join(world: World, timeout_s: float = RENDEZVOUS_TIMEOUT_S):
    """Selects this rank's GPU, keeps NVLink multicast off unless the environment says otherwise, and yields the
    job's Store once every rank has checked in (closed on exit)."""
    use_local_gpu(world)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # multicast needs fabric setup these hosts lack
    with rendezvous(world, timeout_s) as store:
        yield store
