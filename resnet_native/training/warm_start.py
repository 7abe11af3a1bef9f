"""A fresh machine's two slow starts, run side by side: decoding the CIFAR-10 source and the first steps' searches.

Decoding the source is CPU bound; the first epoch's cuDNN algorithm searches (every convolution of every batch
shape) are GPU and driver bound, and neither needs the other. So while a child process decodes the source, this
process trains one step per batch shape, downscales two zero images to each progressive-resizing size and runs one
evaluation (with the run's test-time views) per evaluation shape with a throwaway model (undrawn weights) on zeros, then
builds what the run trains that needs no data (`meanwhile`). Searches' choices are per process, not per model, so
the run's own first steps find them, and the run never meets the throwaway: what it computes is unchanged, only
where its first seconds go ("warm-up" in the summary). The child copies the decoded arrays into a shared memory
block this process mapped before the fork, says so through a pipe and only then writes the data cache: the run
waits for neither the file's write nor its read, and takes the arrays without a copy of its own (arrays that do not
fit the block, from a larger source, come through the pipe instead). When the child fails, the parent's load
decodes the source itself, with the error it raises then.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import multiprocessing
import sys
import time
import warnings

import numpy as np

from ..data.augment import storage_dtype
from ..data.cifar10 import (
    ARRAY_FIELDS,
    CIFAR10Data,
    decode_source,
    default_data_path,
    load_cached,
    load_cifar10,
    write_cache,
)
from ..data.resize import downscale_on_gpu
from ..optim.step import TrainStep
from .builders import build_model, build_optimizer, build_scaler, partial_batch_search, test_set_views
from .config import FULL_SIZE, TrainConfig, train_image_sizes
from .evaluation import Evaluation

TRAIN_IMAGES, TEST_IMAGES = 50_000, 10_000  # CIFAR-10's splits: the batch shapes a run will see
# The shared block: CIFAR-10's arrays (uint8 images, int32 labels), each at a 64-byte aligned offset.
SHARED_BYTES = (TRAIN_IMAGES + TEST_IMAGES) * (32 * 32 * 3 + 4) + 4 * 64


def load_while_priming(cfg: TrainConfig, data_path, cache_dir, spent, report: dict | None = None, *,
                       meanwhile=None, cleanup: contextlib.ExitStack | None = None):
    """load_cifar10(data_path, cache_dir=cache_dir), with the run's first-step searches done meanwhile when the
    source has to be decoded (no cache yet). spent: the run's Stopwatch ("warm-up", "build", "data"). report: when
    the source was decoded, receives the priming's phases ({phase: s}) and the child's decode seconds ("decode"),
    which say which of the two a fresh run waited for. meanwhile: called after the priming, before the wait for
    the data (its seconds are "build"). cleanup: where the wait for the child's cache write is left (closed at the
    run's end); without one it is waited for before returning."""
    path = data_path if data_path is not None else default_data_path()
    if path is None:  # load_cifar10 says what is missing
        return load_cifar10(data_path, cache_dir=cache_dir)
    with spent("data"):
        data = load_cached(path, cache_dir)
    if data is not None:
        return data
    # The child runs only lzma, NumPy and Pillow, never CUDA (as the decoding pool's workers do).
    # Not a daemon: a daemonic process may not start the decoding pool's workers.
    context = multiprocessing.get_context("fork")
    decode_s = context.Value("d", -1.0, lock=False)  # the child's seconds, once it has decoded
    ours, theirs = context.Pipe(duplex=False)
    try:  # anonymous and shared: the child's writes are ours to read
        shared = mmap.mmap(-1, SHARED_BYTES)
    except OSError:  # no shared memory to be had here: the arrays come through the pipe
        shared = None
    child = context.Process(target=_decode_and_send, args=(path, cache_dir, decode_s, theirs, ours, shared),
                            name="cifar10-decode")
    child.start()
    theirs.close()
    data = None
    try:
        with spent("warm-up"):
            phases = prime_first_steps(cfg)
        if meanwhile is not None:
            with spent("build"):
                meanwhile()
        with spent("data"):
            data = _receive(ours, str(path), shared)
    finally:  # never killed: an interrupted cache write would leave its temporary file behind
        ours.close()  # a child still sending (this process failed first) stops sending and writes the cache
        if data is None or cleanup is None:
            with spent("data"):
                child.join()
        else:
            cleanup.callback(child.join)
    if report is not None:
        report.update(phases)
        if decode_s.value >= 0:
            report["decode"] = decode_s.value
    if data is None:
        with spent("data"):
            warnings.warn(f"decoding {path} in a child process sent no data (exit code {child.exitcode}); "
                          "decoding it here", RuntimeWarning, stacklevel=2)
            data = load_cifar10(path, cache_dir=cache_dir)
    return data


def _decode_and_send(path, cache_dir, seconds, conn, parents_end, shared) -> None:
    """The child: decode, hand the arrays over (a header of their shapes, dtypes and where they are: copied into
    the shared block when they fit, else each one's bytes sent after the header), write the cache. A parent that
    stopped listening only loses the handing over."""
    parents_end.close()  # else a parent that closed its end would leave a reader, and the sending would block
    t0 = time.perf_counter()
    try:
        data = decode_source(path)
        seconds.value = time.perf_counter() - t0
    except BaseException as e:  # the parent decodes again, and raises a data error where it is handled
        print(f"cifar10-decode: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    arrays = [np.ascontiguousarray(getattr(data, name)) for name in ARRAY_FIELDS]
    offsets = None if shared is None else _shared_offsets([a.nbytes for a in arrays], len(shared))
    if offsets is not None:
        for a, offset in zip(arrays, offsets, strict=True):
            _view(shared, offset, a.shape, a.dtype)[...] = a
    with contextlib.suppress(OSError), conn:  # BrokenPipeError: the parent has gone on without the data
        conn.send((offsets, [(a.shape, a.dtype.str) for a in arrays]))
        if offsets is None:
            for a in arrays:
                conn.send_bytes(memoryview(a).cast("B"))
    write_cache(path, data, cache_dir)


def _shared_offsets(sizes: list, capacity: int) -> list | None:
    """Where arrays of these byte sizes go in a shared block of `capacity` bytes (64-byte aligned), or None when
    they do not fit."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // 64) * 64
    return offsets if end <= capacity else None


def _view(shared: mmap.mmap, offset: int, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(shared, dtype, count, offset).reshape(shape)


def _receive(conn, source: str, shared: mmap.mmap | None) -> CIFAR10Data | None:
    """The child's arrays (views of the shared block, or received through the pipe), or None when it sent none (it
    failed, and has exited)."""
    try:
        offsets, header = conn.recv()
        if offsets is not None:  # the block stays mapped while the views refer to it
            arrays = [_view(shared, offset, shape, dtype) for offset, (shape, dtype) in zip(offsets, header,
                                                                                              strict=True)]
            return CIFAR10Data(*arrays, source=source)
        arrays = [np.empty(shape, np.dtype(dtype)) for shape, dtype in header]
        for a in arrays:
            if conn.recv_bytes_into(memoryview(a).cast("B")) != a.nbytes:
                raise RuntimeError(f"decoding {source} in a child process: an array of {a.nbytes} bytes came short")
    except EOFError:
        return None
    return CIFAR10Data(*arrays, source=source)


def batch_shapes(n: int, batch_size: int) -> tuple:
    """The batch sizes of an epoch of n images: full batches, and the remainder."""
    return tuple(b for b in (min(batch_size, n), n % batch_size if n > batch_size else 0) if b)


def prime_first_steps(cfg: TrainConfig) -> dict:
    """One eager training step per training batch shape (at each image size progressive resizing trains at), the
    downscaling of two images to each of those sizes, and one evaluation (with the run's test-time views) per
    evaluation batch shape, with a throwaway model of cfg (initialize=False: no weights drawn) on zeros. Everything
    it allocated goes back to cupy's pool on return, where the run's own model and steps find blocks of the same
    sizes. Returns {phase: seconds} and says it on stderr."""
    seconds, t0 = {}, time.perf_counter()
    import cupy

    def lap(what: str) -> None:
        nonlocal t0
        cupy.cuda.get_current_stream().synchronize()
        t = time.perf_counter()
        seconds[what], t0 = t - t0, t

    lap("imports and context")
    model = build_model(cfg, initialize=False)  # only its shapes matter: the searches time kernels, not values
    step = TrainStep(model, build_optimizer(cfg, model), label_smoothing=cfg.label_smoothing,
                     scaler=build_scaler(cfg), cuda_graph=False, direct_gradients=True)
    lap("model")
    n_train = TRAIN_IMAGES if cfg.subset is None else min(cfg.subset, TRAIN_IMAGES)
    dtype = storage_dtype(cfg.precision)

    def zeros(b, s=FULL_SIZE):
        return cupy.zeros((b, s, s, 3) if cfg.layout == "NHWC" else (b, 3, s, s), dtype=dtype)

    for s in train_image_sizes(cfg):
        for b in batch_shapes(n_train, cfg.batch_size):
            with partial_batch_search(b, cfg.batch_size):  # as the run's own steps choose
                step.run(zeros(b, s), cupy.zeros((b,), dtype=cupy.int32))
            lap(f"step {b}" + (f" at {s} px" if s != FULL_SIZE else ""))
    for s in train_image_sizes(cfg):
        if s != FULL_SIZE:
            downscale_on_gpu(cupy.zeros((2, FULL_SIZE, FULL_SIZE, 3), dtype=cupy.uint8), s)
            lap(f"downscale to {s} px")
    # One batch of each evaluation shape (Evaluation chooses the partial one's algorithms as the run will).
    shapes = batch_shapes(TEST_IMAGES, cfg.eval_batch_size)
    n = sum(shapes)
    views, weights = test_set_views(cfg, cupy.zeros((n, FULL_SIZE, FULL_SIZE, 3), dtype=cupy.uint8))
    Evaluation(model, zeros(n), cupy.zeros((n,), dtype=cupy.int32), cfg.eval_batch_size, x_views=views,
               view_weights=weights)()
    lap("evaluation " + "+".join(map(str, shapes)))
    del step, model, views
    gc.collect()  # the layers refer to each other: their device arrays go with the cycles
    lap("release")
    print("warm start: " + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items()), file=sys.stderr)
    return seconds
