"""The gradient all-reduce without a GPU: StoreAllReduce over a real loopback Store (three ranks as threads of this
process, each with its own connection) against a NumPy mean; NcclAllReduce's argument checks and the conversion
of cupy's NCCL unique id (resnet_native.distributed.allreduce)."""

import threading

import numpy as np
import pytest

from resnet_native.distributed import World, rendezvous
from resnet_native.distributed.allreduce import (
    NCCL_UNIQUE_ID_BYTES,
    GradientAllReduce,
    NcclAllReduce,
    StoreAllReduce,
    nccl_id_from_bytes,
    nccl_id_to_bytes,
)
from resnet_native.distributed.launch import free_port

TIMEOUT_S = 20.0
SHAPES = [(3, 5), (7,), (1,), (2, 3, 3), (0,), (129,), (4, 4)]  # odd sizes, an empty one


def run_threads(size, target, limit_s=30.0):
    """target(rank, store) on size threads, each its own rank of a loopback job; the per-rank results."""
    port = free_port()
    results, errors = [None] * size, []

    def body(rank):
        try:
            with rendezvous(World(rank, size, rank, "127.0.0.1", port), TIMEOUT_S) as store:
                results[rank] = target(rank, store)
                store.barrier("end", TIMEOUT_S)
        except BaseException as e:  # reported by the test
            errors.append((rank, e))

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit_s)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors
    return results


def grads_of(rank, call, dtype=np.float32):
    rng = np.random.default_rng([rank, call])
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


@pytest.mark.parametrize("bucket_bytes", [256, 1000, 1 << 20])  # many buckets, a few, one
def test_store_allreduce_three_ranks_is_the_mean_and_bit_identical(bucket_bytes):
    size, calls = 3, 3  # three calls: the values of call 0 are emptied during call 2

    def target(rank, store):
        ar = StoreAllReduce(store, store.world, bucket_bytes=bucket_bytes, timeout_s=TIMEOUT_S)
        out = []
        for call in range(calls):
            g = grads_of(rank, call)
            views = [a for a in g]
            ar.average(g)
            assert all(a is b for a, b in zip(g, views, strict=True))  # in place
            out.append(g)
        return out

    results = run_threads(size, target)
    for call in range(calls):
        for i, shape in enumerate(SHAPES):
            expected = (sum(grads_of(r, call)[i].astype(np.float64) for r in range(size)) / size).astype(np.float32)
            for r in range(size):
                assert results[r][call][i].shape == shape and results[r][call][i].dtype == np.float32
                np.testing.assert_array_equal(results[r][call][i], expected, err_msg=f"rank {r} grad {i}")
                assert results[r][call][i].tobytes() == results[0][call][i].tobytes()


def test_store_allreduce_float64_and_a_mismatch_between_ranks():
    def target(rank, store):
        ar = StoreAllReduce(store, store.world, timeout_s=TIMEOUT_S)
        g = [np.full(5, rank + 1.0), np.arange(3, dtype=np.float64)]
        ar.average(g)
        bad = [np.zeros(4 + rank, np.float32)]
        with pytest.raises(ValueError, match="sent .* bytes.*differ in shape or dtype"):
            ar.average(bad)
        return g

    for g in run_threads(2, target):
        np.testing.assert_array_equal(g[0], np.full(5, 1.5))
        np.testing.assert_array_equal(g[1], np.arange(3.0))


def test_store_allreduce_argument_checks():
    def target(rank, store):
        ar = StoreAllReduce(store, store.world)
        assert isinstance(ar, GradientAllReduce)
        with pytest.raises(TypeError, match="grads: expected a sequence of NumPy arrays"):
            ar.average(np.zeros(3))
        with pytest.raises(TypeError, match=r"grads\[1\]: expected a NumPy array, got list"):
            ar.average([np.zeros(3), [1.0]])
        with pytest.raises(ValueError, match=r"grads\[0\]: expected a C-contiguous"):
            ar.average([np.zeros((3, 4)).T])
        with pytest.raises(TypeError, match=r"grads\[0\]: expected a floating-point array, got int32"):
            ar.average([np.zeros(3, np.int32)])
        with pytest.raises(ValueError, match="bucket_bytes"):
            StoreAllReduce(store, store.world, bucket_bytes=0)
        with pytest.raises(ValueError, match="timeout_s"):
            StoreAllReduce(store, store.world, timeout_s=0)
        with pytest.raises(TypeError, match="world: expected a World"):
            StoreAllReduce(store, None)
        with pytest.raises(TypeError, match="store: expected a Store"):
            StoreAllReduce(object(), store.world)
        with pytest.raises(ValueError, match="store: it belongs to"):
            StoreAllReduce(store, World(1 - rank, 2, 1 - rank, "127.0.0.1", store.world.master_port))
        ar.average([])  # nothing to do, no exchange
        return True

    assert run_threads(2, target) == [True, True]


def test_nccl_unique_id_round_trip():
    uid = tuple(((i * 37) % 256) - 128 for i in range(NCCL_UNIQUE_ID_BYTES))  # cupy's: signed chars
    data = nccl_id_to_bytes(uid)
    assert isinstance(data, bytes) and len(data) == NCCL_UNIQUE_ID_BYTES
    assert data[0] == (-128) & 0xFF and nccl_id_from_bytes(data) == uid
    assert nccl_id_from_bytes(bytearray(data)) == uid
    assert nccl_id_to_bytes(list(range(128))) == bytes(range(128))  # unsigned values are taken too
    with pytest.raises(ValueError, match="expected 128 values, got 3"):
        nccl_id_to_bytes((1, 2, 3))
    with pytest.raises(ValueError, match=r"unique_id\[1\]: expected a C char value"):
        nccl_id_to_bytes((0, 300) + (0,) * 126)
    assert nccl_id_to_bytes(data) == data and nccl_id_to_bytes(bytearray(data)) == data  # cupy 14 returns bytes
    with pytest.raises(ValueError, match="unique_id: expected 128 bytes, got 4"):
        nccl_id_to_bytes(b"xxxx")
    with pytest.raises(TypeError, match="unique_id: expected 128 bytes or a tuple"):
        nccl_id_to_bytes("x" * 128)
    with pytest.raises(ValueError, match="expected an NCCL unique id of 128 bytes, got 5"):
        nccl_id_from_bytes(b"12345")
    with pytest.raises(TypeError, match="data: expected bytes"):
        nccl_id_from_bytes(uid)


def test_nccl_allreduce_checks_its_arguments_before_importing_cupy():
    with pytest.raises(TypeError, match="world: expected a World"):
        NcclAllReduce(None, "rank 0")
    with pytest.raises(TypeError, match="store: expected a Store"):
        NcclAllReduce(object(), World())
    world = World(master_port=free_port())
    with rendezvous(world, 10.0) as store, pytest.raises(ValueError, match="wire: expected None .* got 'fp8'"):
        NcclAllReduce(store, world, wire="fp8")
