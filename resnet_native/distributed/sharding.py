"""Each rank's share of an epoch: one seeded permutation of the data set, the same on every rank, dealt out
round-robin, so the shares are disjoint, equal-sized, and together the whole (truncated or padded) permutation."""

from __future__ import annotations

import numpy as np

from .._core.names import bounded_int
from .._core.rng import epoch_rng
from .world import World

# The generator stream of the sharding permutation: data/augment.py's streams are 1..4.
STREAM_SHARD = 5


def shard_indices(n: int, world: World, epoch: int, seed: int, drop_last: bool = True) -> np.ndarray:
    """The int64 indices into range(n) rank world.rank uses in epoch, in its order of use.

    The permutation is a function of (seed, epoch) only. drop_last: it is cut to a multiple of world_size (the
    last n % world_size images sit this epoch out; another permutation drops others next epoch); else it is
    padded by wrapping around to the next multiple, so some images appear twice. Rank r takes every
    world_size-th element starting at r.
    """
    if not isinstance(world, World):
        raise TypeError(f"world: expected a World, got {type(world).__name__}")
    n = bounded_int("n", n, 1, 2**62, "images")
    epoch = bounded_int("epoch", epoch, 0, 2**62, "epochs")
    seed = bounded_int("seed", seed, 0, 2**63 - 1, "seed values")
    if not isinstance(drop_last, bool):
        raise TypeError(f"drop_last: expected a bool, got {drop_last!r}")
    size = world.world_size
    if drop_last and n < size:
        raise ValueError(f"n: {n} images cannot be shared by {size} ranks with drop_last (every share would be "
                         f"empty); pass drop_last=False to pad")
    order = epoch_rng(seed, epoch, STREAM_SHARD).permutation(n).astype(np.int64)
    total = (n // size) * size if drop_last else -(-n // size) * size
    order = order[:total] if drop_last else np.resize(order, total)  # np.resize repeats the array to fill
    return order[world.rank::size].copy()
