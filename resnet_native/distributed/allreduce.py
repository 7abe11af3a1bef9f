"""The gradient all-reduce of a data-parallel step: average(grads) replaces every rank's gradients, in place, by
their mean over all ranks. TrainStep calls it after backward and before the optimizer's update (and before the
loss scaler's inf/nan check: every rank then sees the same gradients and makes the same skip decision).

- StoreAllReduce  NumPy gradients through the rendezvous Store (CPU tests, debugging): per bucket of
                  plan_buckets, rank r sets its bucket's bytes, every rank gets all of them and sums them in
                  float64 in rank order, so every rank computes bit-identical results; then / world_size.
- NcclAllReduce   cupy gradients through cupy.cuda.nccl: one ncclAllReduce (sum) per bucket of flat device
                  buffers, then * 1/world_size, on a given stream (default: the current one); wire='bf16' sends
                  them as bf16 (half the bytes; the sum rounds to bf16). Nothing in it
                  synchronises the host or allocates after its first call, so TrainStep captures it in the step's
                  CUDA graph (capturable). cupy is imported only when one is made.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._core.names import bounded_int
from ..ops import kernels
from .buckets import bucket_offsets, plan_buckets
from .overlap import DeferredOverlap, StreamOverlap
from .store import Store, checked_timeout, exchange_nccl_id
from .world import World

STORE_BUCKET_BYTES = 4 << 20  # under the store's 64 MiB item limit, with room to spare
NCCL_BUCKET_BYTES = 25 << 20  # PyTorch DDP's default
NCCL_UNIQUE_ID_BYTES = 128  # sizeof(ncclUniqueId)


class GradientAllReduce:
    """average(grads): every array of grads (same shapes and dtypes, in the same order, on every rank) becomes,
    in place, the mean of that array over all ranks. Every rank must call it the same number of times."""

    world: World
    capturable = False  # True: average() may be recorded into a CUDA graph and replayed

    def average(self, grads: Sequence) -> None:
        raise NotImplementedError

    def sum_(self, array) -> None:
        """array (one C-contiguous float array, the same shape and dtype on every rank) becomes, in place, its sum
        over all ranks: synchronized batch norm's per-channel sums."""
        raise NotImplementedError

    def overlapping(self, grads: Sequence):
        """An overlap session for one step's backward (overlap.py): ready(indices) says which of grads are final,
        finish() completes the average. This default runs average(grads) in finish(): nothing overlaps."""
        return DeferredOverlap(self, grads)

    def close(self) -> None:
        """Release what the all-reduce holds (the NCCL communicator); the Store is its owner's to close."""


def _checked_world_store(store, world) -> None:
    if not isinstance(world, World):
        raise TypeError(f"world: expected a World, got {type(world).__name__}")
    if not isinstance(store, Store):
        raise TypeError(f"store: expected a Store (from rendezvous), got {type(store).__name__}")
    if store.world != world:
        raise ValueError(f"store: it belongs to {store.world}, not to {world}")


def _checked_array(name: str, a, kind: str, is_array):
    """a, when it is a C-contiguous floating-point array of `kind` (it is written in place)."""
    if not is_array(a):
        raise TypeError(f"{name}: expected a {kind} array, got {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array (it is written in place)")
    if np.dtype(a.dtype).kind != "f":
        raise TypeError(f"{name}: expected a floating-point array, got {np.dtype(a.dtype).name}")
    return a


def _checked_grads(grads, kind: str, is_array) -> list:
    if isinstance(grads, str | bytes) or not isinstance(grads, Sequence):
        raise TypeError(f"grads: expected a sequence of {kind} arrays, got {type(grads).__name__}")
    return [_checked_array(f"grads[{i}]", g, kind, is_array) for i, g in enumerate(grads)]


class _Plan:
    """The buckets of one gradient layout (sizes and dtypes): indices, byte offsets, buffer sizes."""

    def __init__(self, key: tuple, grads, bucket_bytes: int):
        self.key = key
        sizes = [int(g.nbytes) for g in grads]
        self.buckets = plan_buckets(sizes, bucket_bytes)
        self.layout = [bucket_offsets(sizes, b) for b in self.buckets]  # (offsets, total) per bucket


def _plan_for(plan, grads, bucket_bytes: int) -> _Plan:
    """`plan` when it was made for grads' layout (shapes and dtypes), else a new plan of it."""
    key = tuple((tuple(g.shape), np.dtype(g.dtype).str) for g in grads)
    return plan if plan is not None and plan.key == key else _Plan(key, grads, bucket_bytes)


class StoreAllReduce(GradientAllReduce):
    """The all-reduce over the Store, for NumPy gradients. Values go through rank 0's process: slow, and meant for
    tests and debugging. Rank r empties the values it set two calls earlier (every rank has read them by then:
    a rank can start call n only once every rank has set its values of call n-1, after reading those of n-2),
    so the store keeps at most two calls' gradients."""

    def __init__(self, store: Store, world: World, *, bucket_bytes: int = STORE_BUCKET_BYTES,
                 timeout_s: float = 60.0):
        _checked_world_store(store, world)
        self.store, self.world = store, world
        self.bucket_bytes = bounded_int("bucket_bytes", bucket_bytes, 1, 64 << 20, "bytes")
        self.timeout_s = checked_timeout(timeout_s, zero=False)
        self._plan = None
        self._calls = 0
        self._previous: list[list[str]] = []  # the keys this rank set in the last calls (oldest first)

    def average(self, grads) -> None:
        self._exchange(_checked_grads(grads, "NumPy", lambda g: isinstance(g, np.ndarray)), mean=True)

    def sum_(self, array) -> None:
        self._exchange([_checked_array("array", array, "NumPy", lambda a: isinstance(a, np.ndarray))], mean=False)

    def _exchange(self, grads: list, mean: bool) -> None:
        if self.world.world_size == 1 or not grads:
            return
        plan = self._plan = _plan_for(self._plan, grads, self.bucket_bytes)
        call = self._calls
        self._calls += 1
        if len(self._previous) == 2:
            for key in self._previous.pop(0):
                self.store.set(key, b"")
        keys = []
        rank, size = self.world.rank, self.world.world_size
        for b, (bucket, (offsets, _)) in enumerate(zip(plan.buckets, plan.layout, strict=True)):
            total = offsets[-1] + grads[bucket[-1]].nbytes  # unpadded at the end: a size mismatch shows
            buf = bytearray(total)
            for i, off in zip(bucket, offsets, strict=True):
                buf[off:off + grads[i].nbytes] = grads[i].tobytes()
            prefix = f"allreduce/{call}/{b}/"
            self.store.set(prefix + str(rank), buf)
            keys.append(prefix + str(rank))
            parts = [buf if r == rank else self.store.get(prefix + str(r), self.timeout_s) for r in range(size)]
            for r, part in enumerate(parts):
                if len(part) != total:
                    raise ValueError(f"all-reduce call {call}, bucket {b}: rank {r} sent {len(part)} bytes, rank "
                                     f"{rank} expected {total} (the ranks' gradients differ in shape or dtype)")
            for i, off in zip(bucket, offsets, strict=True):
                g = grads[i]
                if g.size == 0:
                    continue
                acc = np.zeros(g.size, np.float64)
                for part in parts:  # rank order: the same additions, in the same order, on every rank
                    acc += np.frombuffer(part, dtype=g.dtype, count=g.size, offset=off)
                if mean:
                    acc /= size
                g[...] = acc.reshape(g.shape)
        self._previous.append(keys)


def nccl_id_to_bytes(unique_id) -> bytes:
    """cupy.cuda.nccl.get_unique_id()'s value as the 128 bytes the Store carries: cupy 14 returns those bytes,
    older cupy a tuple of 128 C chars (ints in [-128, 127])."""
    if isinstance(unique_id, bytes | bytearray):
        if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
            raise ValueError(f"unique_id: expected {NCCL_UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        return bytes(unique_id)
    if isinstance(unique_id, str) or not isinstance(unique_id, Sequence):
        raise TypeError(f"unique_id: expected {NCCL_UNIQUE_ID_BYTES} bytes or a tuple of {NCCL_UNIQUE_ID_BYTES} "
                        f"ints, got {type(unique_id).__name__}")
    if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"unique_id: expected {NCCL_UNIQUE_ID_BYTES} values, got {len(unique_id)}")
    for i, v in enumerate(unique_id):
        if isinstance(v, bool) or not isinstance(v, int) or not -128 <= v <= 255:
            raise ValueError(f"unique_id[{i}]: expected a C char value in [-128, 255], got {v!r}")
    return bytes(v & 0xFF for v in unique_id)


def nccl_id_from_bytes(data: bytes) -> tuple:
    """The tuple of signed chars an older cupy's NcclCommunicator takes (cupy 14's takes the bytes)."""
    if not isinstance(data, bytes | bytearray):
        raise TypeError(f"data: expected bytes, got {type(data).__name__}")
    if len(data) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"data: expected an NCCL unique id of {NCCL_UNIQUE_ID_BYTES} bytes, got {len(data)}")
    return tuple(b - 256 if b > 127 else b for b in data)


_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}
NCCL_BFLOAT16 = 9  # ncclBfloat16 in nccl.h (NCCL >= 2.10); older cupy bindings do not name it
WIRE_DTYPES = {"bf16"}  # what gradients may travel as instead of their own dtype


class NcclAllReduce(GradientAllReduce):
    """The all-reduce over NCCL (cupy.cuda.nccl), for cupy gradients of one device. Makes the communicator from the
    unique id rank 0 sends through the Store. Per bucket: gradients copied into a flat buffer (kept), one in-place
    ncclAllReduce (sum), * 1/world_size, copied back; all of it on stream (default: the current stream at each
    call), so nothing synchronises the host. It runs NCCL at world_size 1 too (a one-rank communicator: the
    same code path as a job's, checked on one GPU)."""

    capturable = True  # fixed buffers after the first call, no host synchronisation: NCCL calls can be captured

    def __init__(self, store: Store, world: World, *, bucket_bytes: int = NCCL_BUCKET_BYTES, stream=None,
                 timeout_s: float = 60.0, wire: str | None = None):
        _checked_world_store(store, world)
        if wire is not None and wire not in WIRE_DTYPES:
            raise ValueError(f"wire: expected None (the gradients' own dtype) or one of {sorted(WIRE_DTYPES)}, got "
                             f"{wire!r}")
        self.wire = wire
        self.world = world
        self.bucket_bytes = bounded_int("bucket_bytes", bucket_bytes, 1, 1 << 40, "bytes")
        timeout_s = checked_timeout(timeout_s, zero=False)
        from cupy.cuda import nccl

        self._nccl = nccl
        self.stream = stream
        uid = exchange_nccl_id(store, world, lambda: nccl_id_to_bytes(nccl.get_unique_id()), timeout_s)
        try:  # cupy 14 takes the id as bytes, older cupy as a tuple of chars
            self.comm = nccl.NcclCommunicator(world.world_size, uid, world.rank)
        except TypeError:
            self.comm = nccl.NcclCommunicator(world.world_size, nccl_id_from_bytes(uid), world.rank)
        self._plan = None
        self._buffers = []
        self._overlap = None  # (plan, communication stream, events) of overlap sessions

    def average(self, grads) -> None:
        grads = self._prepare(grads)
        if not grads:
            return
        stream = self._stream()
        with stream:
            for b in range(len(self._plan.buckets)):
                self._reduce_bucket(b, grads, stream)

    def overlapping(self, grads):
        """Buckets reduced on a communication stream while backward goes on (overlap.py's StreamOverlap): each as
        soon as its gradients are final, ordered after them by an event; finish() makes the step's stream wait."""
        return StreamOverlap(self, grads)

    def _overlap_resources(self):
        """(communication stream, one event per bucket of the current plan + one to join): made once per plan,
        so that a captured step's sessions (made during the eager warm-up first) create nothing."""
        import cupy

        if self._overlap is None or self._overlap[0] is not self._plan:
            events = [cupy.cuda.Event(disable_timing=True) for _ in range(len(self._plan.buckets) + 1)]
            stream = self._overlap[1] if self._overlap is not None else cupy.cuda.Stream(non_blocking=True)
            self._overlap = (self._plan, stream, events)
        return self._overlap[1], self._overlap[2]

    def _prepare(self, grads) -> list:
        """grads checked (one NCCL dtype), with the bucket plan and buffers of their layout in place."""
        import cupy

        grads = _checked_grads(grads, "cupy", lambda g: isinstance(g, cupy.ndarray))
        if not grads:
            return grads
        dtypes = {np.dtype(g.dtype).name for g in grads}
        if len(dtypes) != 1 or next(iter(dtypes)) not in _NCCL_TYPES:
            raise TypeError(f"grads: expected one dtype of {sorted(_NCCL_TYPES)}, got {sorted(dtypes)}")
        dtype = np.dtype(next(iter(dtypes)))
        bf16 = self.wire == "bf16"
        plan = _plan_for(self._plan, grads, self.bucket_bytes)
        if plan is not self._plan:
            self._plan = plan
            # Offsets are in the gradients' elements; a bf16 wire holds the same elements in 2-byte bf16 bits.
            self._buffers = [cupy.empty(total // dtype.itemsize, np.uint16 if bf16 else dtype)
                             for _, total in plan.layout]
        self._dtype = dtype
        return grads

    def _reduce_bucket(self, b: int, grads: list, stream) -> None:
        """Bucket b of the current plan: packed, summed over the ranks, averaged and unpacked, on `stream` (the
        caller's `with stream:`)."""
        dtype, bf16 = self._dtype, self.wire == "bf16"
        nccl_type = (getattr(self._nccl, "NCCL_BFLOAT16", NCCL_BFLOAT16) if bf16
                     else getattr(self._nccl, _NCCL_TYPES[dtype.name]))
        inv = dtype.type(1.0 / self.world.world_size)
        bucket, (offsets, _), buf = self._plan.buckets[b], self._plan.layout[b], self._buffers[b]
        views = [buf[off // dtype.itemsize: off // dtype.itemsize + grads[i].size]
                 for i, off in zip(bucket, offsets, strict=True)]
        for i, view in zip(bucket, views, strict=True):
            _pack(grads[i].ravel(), view, bf16)
        self._sum_in_place(buf, nccl_type, stream)
        if not bf16:
            buf *= inv
        for i, view in zip(bucket, views, strict=True):
            _pack(view, grads[i].ravel(), bf16)  # C-contiguous: ravel() is a view, written through
            if bf16:
                grads[i] *= inv  # in the gradient's precision, after the bf16 sum

    def sum_(self, array) -> None:
        import cupy

        _checked_array("array", array, "cupy", lambda a: isinstance(a, cupy.ndarray))
        name = np.dtype(array.dtype).name
        if name not in _NCCL_TYPES:
            raise TypeError(f"array: expected one of {sorted(_NCCL_TYPES)}, got {name}")
        self._sum_in_place(array, getattr(self._nccl, _NCCL_TYPES[name]), self._stream())

    def _stream(self):
        """The stream the NCCL calls go on: the given one, else cupy's current stream."""
        import cupy

        return self.stream if self.stream is not None else cupy.cuda.get_current_stream()

    def _sum_in_place(self, array, nccl_type: int, stream) -> None:
        self.comm.allReduce(array.data.ptr, array.data.ptr, array.size, nccl_type, self._nccl.NCCL_SUM, stream.ptr)

    def close(self) -> None:
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None:
            comm.destroy()


def _pack(src, dst, bf16: bool) -> None:
    """dst = src, through the bf16 cast kernel (round to nearest even) when one side is bf16 bits."""
    if src.size == 0:  # an empty gradient has nothing to send (and the cast kernel refuses empty arrays)
        return
    if bf16:
        kernels.cast(src, dst)
    else:
        dst[...] = src
