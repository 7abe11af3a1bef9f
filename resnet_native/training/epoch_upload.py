"""Each epoch's AutoAugmented training set, copied to the GPU from the workers' shared buffers.

The AutoAugment workers write an epoch's copy (150 MB for CIFAR-10) into one of two shared host buffers.
cupy.asarray of such a buffer first copies it on the host into cupy's own page-locked staging memory, 150 MB of
memcpy per epoch. Registered as page-locked memory instead, the buffers are read by the copy engine directly,
and the copy is queued on the training stream like any other work.

The copy of epoch e reads slot e % 2, which the workers overwrite once epoch e + 2 is prefetched. Every prefetch
therefore waits first for the copy that last read its slot, recorded as an event (on the fallback path too: the
wait does not rely on how cupy stages a pageable copy).
"""

from __future__ import annotations


class EpochUpload:
    """upload(epoch, end_epoch) -> epoch's images on the GPU, and the workers started on epoch + 1 (when it is
    before end_epoch). Use as a context manager: on exit the buffers are unregistered once no copy reads them."""

    def __init__(self, aa):
        import cupy

        self.aa = aa
        self._registered = []
        self._copies = {}  # slot -> the event after the last copy that read it
        try:
            for view in aa.slots():
                cupy.cuda.runtime.hostRegister(view.ctypes.data, view.nbytes, 0)
                self._registered.append(view.ctypes.data)
        except cupy.cuda.runtime.CUDARuntimeError:
            # Page-locking can be refused (a locked-memory limit): cupy.asarray's staged copy is then the
            # fallback, correct and only slower.
            self._release(quiet=True)

    @property
    def pinned(self) -> bool:
        return bool(self._registered)

    def __call__(self, epoch: int, end_epoch: int):
        import cupy

        host = self.aa.result(epoch)
        stream = cupy.cuda.get_current_stream()
        if self.pinned:
            images = cupy.empty(host.shape, host.dtype)
            images.set(host, stream=stream)
        else:
            images = cupy.asarray(host)
        self._copies[epoch % 2] = stream.record()
        if epoch + 1 < end_epoch:
            last = self._copies.pop((epoch + 1) % 2, None)
            if last is not None:
                last.synchronize()
            self.aa.prefetch(epoch + 1)
        return images

    def _release(self, quiet: bool) -> None:
        """Wait for the copies still reading the buffers, then unregister them. quiet (leaving on an exception):
        a CUDA error here must not hide the one that is propagating, and the buffers are unregistered anyway."""
        import cupy

        errors = []
        for event in self._copies.values():
            try:
                event.synchronize()
            except cupy.cuda.runtime.CUDARuntimeError as e:
                errors.append(e)
        self._copies.clear()
        while self._registered:
            try:
                cupy.cuda.runtime.hostUnregister(self._registered.pop())
            except cupy.cuda.runtime.CUDARuntimeError as e:
                errors.append(e)
        if errors and not quiet:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self._release(quiet=exc_type is not None)
