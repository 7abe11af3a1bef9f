"""Each rank's share of an epoch (resnet_native.distributed.sharding): disjoint, equal-sized, together the
truncated or padded permutation, the same on every rank, another one each epoch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resnet_native.data.augment import STREAM_AUGMENT, STREAM_AUTOAUGMENT, STREAM_AUTOAUGMENT_CROP, STREAM_SUBSET
from resnet_native.distributed import World, shard_indices
from resnet_native.distributed.sharding import STREAM_SHARD


def shards(n, size, epoch, seed, drop_last):
    return [shard_indices(n, World(r, size, r), epoch, seed, drop_last) for r in range(size)]


jobs = st.tuples(st.integers(1, 2000), st.integers(1, 9), st.integers(0, 1000), st.integers(0, 2**32))


@settings(max_examples=80, deadline=None)
@given(jobs)
def test_drop_last_shares_are_disjoint_equal_and_cover_the_truncated_permutation(job):
    n, size, epoch, seed = job
    if n < size:
        with pytest.raises(ValueError, match=f"n: {n} images cannot be shared by {size} ranks"):
            shard_indices(n, World(0, size), epoch, seed)
        return
    parts = shards(n, size, epoch, seed, True)
    assert all(p.dtype == np.int64 and len(p) == n // size for p in parts)
    union = np.concatenate(parts)
    assert len(np.unique(union)) == len(union) == (n // size) * size  # disjoint
    assert ((union >= 0) & (union < n)).all()
    # Dealt round-robin from one permutation: interleaving the shares gives it back, a prefix of a permutation.
    order = np.stack(parts, axis=1).reshape(-1)
    full = shards(n, 1, epoch, seed, True)[0]
    np.testing.assert_array_equal(order, full[:len(order)])
    assert sorted(full.tolist()) == list(range(n))


@settings(max_examples=80, deadline=None)
@given(jobs)
def test_padded_shares_cover_every_image_and_repeat_only_the_wrap(job):
    n, size, epoch, seed = job
    parts = shards(n, size, epoch, seed, False)
    per_rank = -(-n // size)
    assert all(len(p) == per_rank for p in parts)
    order = np.stack(parts, axis=1).reshape(-1)
    assert set(order.tolist()) == set(range(n))  # every image, some of them twice
    full = shards(n, 1, epoch, seed, False)[0]
    np.testing.assert_array_equal(order, np.resize(full, per_rank * size))  # the wrap starts the permutation again


@settings(max_examples=30, deadline=None)
@given(st.integers(50, 2000), st.integers(1, 8), st.integers(0, 100), st.integers(0, 2**32))
def test_same_on_every_rank_and_new_each_epoch(n, size, epoch, seed):
    rank = size - 1
    a = shard_indices(n, World(rank, size, 0), epoch, seed)
    np.testing.assert_array_equal(a, shard_indices(n, World(rank, size, 0, "10.1.1.1", 1234), epoch, seed))
    assert not np.array_equal(a, shard_indices(n, World(rank, size, 0), epoch + 1, seed))
    assert not np.array_equal(a, shard_indices(n, World(rank, size, 0), epoch, seed + 1))


def test_its_own_generator_stream():
    assert STREAM_SHARD not in (STREAM_AUGMENT, STREAM_AUTOAUGMENT, STREAM_SUBSET, STREAM_AUTOAUGMENT_CROP)


def test_arguments_are_checked():
    world = World(0, 2)
    with pytest.raises(TypeError, match="world: expected a World"):
        shard_indices(10, (0, 2), 0, 0)
    with pytest.raises(ValueError, match="n: expected a number of images"):
        shard_indices(0, world, 0, 0)
    with pytest.raises(TypeError, match="epoch"):
        shard_indices(10, world, 1.0, 0)
    with pytest.raises(ValueError, match="seed"):
        shard_indices(10, world, 0, -1)
    with pytest.raises(TypeError, match="drop_last: expected a bool"):
        shard_indices(10, world, 0, 0, drop_last=1)
