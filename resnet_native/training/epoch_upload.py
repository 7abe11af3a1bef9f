"""Each epoch's AutoAugmented training set, copied to the GPU from the workers' shared buffers, beside the training.

The workers write an epoch's copy into one of two shared host buffers, registered as page-locked memory so the
copy engine reads them directly (a pageable copy would first be staged through page-locked memory on the host).
The copy runs on a side stream into one of two device buffers, so it overlaps the previous epoch's steps; the
current stream waits for the copy's event before anything reads the images. Epoch e uses slot e % 2 on both
sides: its device copy waits for the work queued before epoch e-1's upload (epoch e-2's steps, the slot's last
readers), and each prefetch waits for the copy that last read its host slot. Uploads are therefore called for
consecutive epochs, and what one returns is valid until the upload two epochs later.
"""

from __future__ import annotations

import threading


class EpochUpload:
    """upload(epoch, end_epoch) -> epoch's images on the GPU, and the workers started on epoch + 1 (when it is
    before end_epoch). Use as a context manager: on exit the buffers are unregistered once no copy reads them."""

    def __init__(self, aa):
        import cupy

        self.aa = aa
        self.stream = cupy.cuda.Stream(non_blocking=True)  # the copies' side stream
        self._registered = []
        self._copies = {}  # slot -> the event after the last copy that read it
        # The device buffers, one per slot, allocated here: an allocation in the loop would synchronise the device.
        views = aa.slots()
        self._device = [cupy.empty(view.shape, view.dtype) for view in views]
        self._readers_done = {}  # slot -> an event after the last work that may read its device buffer
        # Page-locking faults in and pins every page of both buffers, which takes a while: on a thread, beside the
        # rest of the trainer's set-up. The first upload waits for it.
        self._registering = threading.Thread(target=self._register, args=(views, cupy.cuda.Device().id),
                                             name="upload-register", daemon=True)
        self._register_error = None
        self._registering.start()

    def _register(self, views, device) -> None:
        import cupy

        try:
            with cupy.cuda.Device(device):
                for view in views:
                    cupy.cuda.runtime.hostRegister(view.ctypes.data, view.nbytes, 0)
                    self._registered.append(view.ctypes.data)
        except cupy.cuda.runtime.CUDARuntimeError:
            # Page-locking can be refused (a locked-memory limit): a copy from pageable memory, staged by the
            # driver, is then the fallback, correct and only slower.
            self._unregister(errors=[])
        except BaseException as e:  # raised where the upload waits for the registration
            self._register_error = e

    def _registration_done(self) -> None:
        self._registering.join()
        if self._register_error is not None:
            error, self._register_error = self._register_error, None
            raise error

    @property
    def pinned(self) -> bool:
        self._registration_done()
        return bool(self._registered)

    def __call__(self, epoch: int, end_epoch: int):
        import cupy

        self._registration_done()
        host = self.aa.result(epoch)
        stream, slot = cupy.cuda.get_current_stream(), epoch % 2
        # Everything queued so far (epoch-1's steps included) comes before the next upload into the other slot.
        self._readers_done[1 - slot] = stream.record()
        images = self._device[slot]
        if slot in self._readers_done:
            self.stream.wait_event(self._readers_done.pop(slot))
        images.set(host, stream=self.stream)  # the copy engine reads page-locked memory; else the driver stages it
        copied = self._copies[slot] = self.stream.record()
        stream.wait_event(copied)
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
        try:
            self._registration_done()
        except Exception as e:
            errors.append(e)
        for event in self._copies.values():
            try:
                event.synchronize()
            except cupy.cuda.runtime.CUDARuntimeError as e:
                errors.append(e)
        self._copies.clear()
        self._unregister(errors)
        if errors and not quiet:
            raise errors[0]

    def _unregister(self, errors: list) -> None:
        import cupy

        while self._registered:
            try:
                cupy.cuda.runtime.hostUnregister(self._registered.pop())
            except cupy.cuda.runtime.CUDARuntimeError as e:
                errors.append(e)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self._release(quiet=exc_type is not None)
