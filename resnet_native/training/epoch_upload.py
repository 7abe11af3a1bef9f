"""Each epoch's AutoAugmented training set, copied to the GPU from the workers' shared buffers.

The AutoAugment workers write an epoch's copy (150 MB for CIFAR-10) into one of two shared host buffers. Copied from
pageable memory, the upload is synchronous: the host waits for the stream's queued work, then for a copy staged
through the driver's bounce buffers, while the GPU idles. Registered as page-locked memory, the buffers are read by
the copy engines directly, several times faster, and the copy is queued on the training stream like any other work.

The copy of epoch e reads slot e % 2, which the workers overwrite once epoch e + 2 is prefetched. Every prefetch
therefore waits first for the copy that last read its slot: the previous epoch's, recorded as an event.
"""

from __future__ import annotations


class EpochUpload:
    """upload(epoch, end_epoch) -> epoch's images on the GPU, and the workers started on epoch + 1 (when it is
    before end_epoch). Use as a context manager: on exit the buffers are unregistered once no copy reads them."""

    def __init__(self, aa):
        import cupy

        self.aa = aa
        self._registered = []
        self._event = None
        try:
            for view in aa.slots():
                cupy.cuda.runtime.hostRegister(view.ctypes.data, view.nbytes, 0)
                self._registered.append(view.ctypes.data)
        except cupy.cuda.runtime.CUDARuntimeError:
            # Page-locking can be refused (a locked-memory limit): the synchronous copy from pageable memory
            # is then the fallback, correct and only slower.
            self._unregister()

    @property
    def pinned(self) -> bool:
        return bool(self._registered)

    def __call__(self, epoch: int, end_epoch: int):
        import cupy

        host = self.aa.result(epoch)
        if self.pinned:
            stream = cupy.cuda.get_current_stream()
            images = cupy.empty(host.shape, host.dtype)
            images.set(host, stream=stream)
            event = stream.record()
        else:
            images, event = cupy.asarray(host), None
        if epoch + 1 < end_epoch:
            if self._event is not None:  # the copy that read slot (epoch + 1) % 2
                self._event.synchronize()
            self.aa.prefetch(epoch + 1)
        self._event = event
        return images

    def _unregister(self) -> None:
        import cupy

        if self._event is not None:
            self._event.synchronize()
            self._event = None
        while self._registered:
            cupy.cuda.runtime.hostUnregister(self._registered.pop())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._unregister()
