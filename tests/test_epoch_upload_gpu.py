"""The AutoAugmented epochs' upload from the workers' page-locked buffers: each epoch on the GPU equals the serial
reference, the buffers are registered while in use and unregistered after, and the workers never overwrite a slot
whose copy has not finished (a copy held back behind a long kernel); the copies overlap the current stream's work,
and a device buffer is not overwritten while work queued before the previous upload may still read it."""

import time

import numpy as np
import pytest
from stream_spin import spin_kernel as _spin_kernel

from resnet_native.data import autoaugment_workers as aa
from resnet_native.data.autoaugment import sample_autoaugment
from resnet_native.training.epoch_upload import EpochUpload

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: page-locked host memory known to CUDA


def _memory_type(ptr: int) -> int:
    try:
        return cp.cuda.runtime.pointerGetAttributes(ptr).type
    except cp.cuda.runtime.CUDARuntimeError:
        return 0  # unregistered (older drivers report an error instead of cudaMemoryTypeUnregistered)


def test_every_epoch_arrives_whole_from_page_locked_buffers(rng):
    images = rng.integers(0, 256, (1200, 32, 32, 3), dtype=np.uint8)
    epochs = 5
    with aa.AutoAugmentWorkers(images, seed=3, workers=2, chunk=256, crop_padding=4, flip=True) as workers:
        slots = [view.ctypes.data for view in workers.slots()]
        workers.prefetch(0)
        with EpochUpload(workers) as upload:
            assert upload.pinned and [_memory_type(p) for p in slots] == [MEMORY_TYPE_HOST] * 2
            got = []
            for epoch in range(epochs):
                dev = upload(epoch, epochs)
                dev_copy = cp.empty_like(dev)
                dev_copy[...] = dev  # ordered after the upload on the same stream
                got.append(dev_copy)
            cp.cuda.get_current_stream().synchronize()
        assert all(_memory_type(p) != MEMORY_TYPE_HOST for p in slots)
    for epoch, dev in enumerate(got):
        want = aa.autoaugment_images(images, sample_autoaugment(3, epoch, len(images), crop_padding=4, flip=True))
        np.testing.assert_array_equal(cp.asnumpy(dev), want, err_msg=f"epoch {epoch}")


@pytest.mark.parametrize("pinned", [True, False])
def test_the_workers_never_overwrite_a_slot_whose_copy_is_still_queued(rng, monkeypatch, pinned):
    """Epoch 0's copy waits behind a long kernel; upload(1) prefetches epoch 2 into slot 0. Without the wait for
    epoch 0's copy, the workers would write epoch 2 into slot 0 before the copy reads it."""
    if not pinned:
        monkeypatch.setattr(cp.cuda.runtime, "hostRegister", _refuse)
    images = rng.integers(0, 256, (1200, 32, 32, 3), dtype=np.uint8)
    spin = _spin_kernel()  # the inference timing's: holds the stream for a given number of nanoseconds
    with aa.AutoAugmentWorkers(images, seed=4, workers=2, chunk=256) as workers, EpochUpload(workers) as upload:
        assert upload.pinned == pinned
        workers.prefetch(0)
        with upload.stream:  # the copies' stream
            spin((1,), (1,), (np.int64(500_000_000),))  # 0.5 s: the workers fill a slot in well under that
        first = upload(0, 4)
        upload(1, 4)  # prefetch(2) into slot 0: must wait for epoch 0's copy first
        cp.cuda.get_current_stream().synchronize()
        np.testing.assert_array_equal(cp.asnumpy(first), aa.autoaugment_images(images, sample_autoaugment(4, 0, 1200)))
        workers.result(2)  # the pool finishes before the context closes


def _refuse(*args):
    raise cp.cuda.runtime.CUDARuntimeError(2)  # cudaErrorMemoryAllocation


def test_refused_page_locking_falls_back_to_cupys_staged_copy(rng, monkeypatch):
    images = rng.integers(0, 256, (300, 32, 32, 3), dtype=np.uint8)
    monkeypatch.setattr(cp.cuda.runtime, "hostRegister", _refuse)
    with aa.AutoAugmentWorkers(images, seed=1, workers=0) as workers, EpochUpload(workers) as upload:
        assert not upload.pinned
        for epoch in range(3):
            want = aa.autoaugment_images(images, sample_autoaugment(1, epoch, len(images)))
            np.testing.assert_array_equal(cp.asnumpy(upload(epoch, 3)), want)


def test_the_copy_overlaps_the_current_stream_and_waits_for_the_slots_readers(rng):
    images = rng.integers(0, 256, (600, 32, 32, 3), dtype=np.uint8)
    spin = _spin_kernel()
    with aa.AutoAugmentWorkers(images, seed=5, workers=2, chunk=256) as workers, EpochUpload(workers) as upload:
        workers.prefetch(0)
        first = upload(0, 3)
        kept = cp.empty_like(first)  # allocated before the spin: an allocation would wait for it
        spin((1,), (1,), (np.int64(3_000_000_000),))  # epoch 0's "steps": 3 s on the current stream
        spun = cp.cuda.get_current_stream().record()
        kept[...] = first  # read after the spin: what epoch 0's readers see
        second = upload(1, 3)
        t0 = time.perf_counter()
        while not upload._copies[1].done and time.perf_counter() - t0 < 2.0:
            time.sleep(0.01)
        assert upload._copies[1].done and not spun.done, "epoch 1's copy waited for the current stream's work"
        third = upload(2, 3)  # slot 0 again: waits for `kept`'s copy, queued before upload(1)
        assert third.data.ptr == first.data.ptr and second.data.ptr != first.data.ptr
        cp.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(cp.asnumpy(kept), aa.autoaugment_images(images, sample_autoaugment(5, 0, 600)))
    np.testing.assert_array_equal(cp.asnumpy(third), aa.autoaugment_images(images, sample_autoaugment(5, 2, 600)))
