"""The AutoAugmented epochs' upload from the workers' page-locked buffers: each epoch on the GPU equals the serial
reference, the buffers are registered while in use and unregistered after, and the workers never overwrite a slot
whose copy has not finished."""

import numpy as np
import pytest

from resnet_native.data import autoaugment as aa
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
        assert [_memory_type(p) for p in slots] != [MEMORY_TYPE_HOST] * 2
    for epoch, dev in enumerate(got):
        want = aa.autoaugment_images(images, sample_autoaugment(3, epoch, len(images), crop_padding=4, flip=True))
        np.testing.assert_array_equal(cp.asnumpy(dev), want, err_msg=f"epoch {epoch}")


def test_refused_page_locking_falls_back_to_the_synchronous_copy(rng, monkeypatch):
    def refuse(*args):
        raise cp.cuda.runtime.CUDARuntimeError(2)  # cudaErrorMemoryAllocation

    images = rng.integers(0, 256, (300, 32, 32, 3), dtype=np.uint8)
    monkeypatch.setattr(cp.cuda.runtime, "hostRegister", refuse)
    with aa.AutoAugmentWorkers(images, seed=1, workers=0) as workers, EpochUpload(workers) as upload:
        assert not upload.pinned
        for epoch in range(3):
            want = aa.autoaugment_images(images, sample_autoaugment(1, epoch, len(images)))
            np.testing.assert_array_equal(cp.asnumpy(upload(epoch, 3)), want)
