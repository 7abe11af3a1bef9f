"""The CPU stand-ins under which the trainer runs without a GPU (tests/test_train_dryrun_cpu.py's cpu_backend fixture,
and the ranks of tests/test_train_dp_cpu.py): the slice of cupy the trainer and augmenter use, on NumPy, the
augmentation kernel replaced by its NumPy reference, and a tiny data set."""

import time
import types

import numpy as np


def numpy_as_cupy():
    """A module standing in for cupy, on NumPy."""
    fake = types.ModuleType("cupy")
    for name in ("zeros", "asarray", "ascontiguousarray", "log", "exp", "arange", "einsum", "floor", "clip", "int32",
                 "int64", "float16", "float32", "float64", "uint8", "uint16"):
        setattr(fake, name, getattr(np, name))
    class Event:  # NumPy's work is done when it is queued: an event is complete when recorded
        def __init__(self, *args, **kwargs):
            self.time = None

        def synchronize(self):
            pass

    def record(event=None):
        event = Event() if event is None else event
        event.time = time.perf_counter()
        return event

    stream = types.SimpleNamespace(synchronize=lambda: None, ptr=0, record=record, wait_event=lambda event: None)

    class DeviceArray(np.ndarray):  # what cupy.empty gives: ndarray.set(host, stream=...) copies into it
        def set(self, host, stream=None):
            self[...] = host

    fake.empty = lambda shape, dtype=float: np.empty(shape, dtype).view(DeviceArray)

    class CUDARuntimeError(RuntimeError):
        pass

    def host_register(*args):
        raise CUDARuntimeError("no GPU: host memory cannot be page-locked")

    class Device:  # the one "device": its id, and a context that changes nothing
        id = 0

        def __init__(self, device=None):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    runtime = types.SimpleNamespace(CUDARuntimeError=CUDARuntimeError, hostRegister=host_register)
    fake.cuda = types.SimpleNamespace(get_current_stream=lambda: stream, Stream=lambda **kwargs: stream,
                                      runtime=runtime, Event=Event, Device=Device,
                                      get_elapsed_time=lambda start, end: (end.time - start.time) * 1e3)
    fake.asnumpy = np.asarray
    return fake


def launch_on_numpy(images, params, batch_start, batch, lut, out, *, layout="NHWC", crop_padding=4, cutout=0,
                    labels=None, labels_out=None):
    """resnet_native.data.augment.launch_augment's NumPy reference."""
    from resnet_native.data import augment as aug  # imported when used: a child installs the stand-ins first

    columns = params[:, batch_start:batch_start + batch]
    out[...] = aug.apply_reference(np.asarray(images), columns, lut, layout=layout, crop_padding=crop_padding,
                                   cutout=cutout)
    if labels_out is not None:
        labels_out[...] = labels[columns[aug.ROW_INDEX]]


def tiny_cifar(rng):
    """8x8 'CIFAR': a bright or dark image per class parity, learnable in a few steps (32 train, 16 test)."""
    from resnet_native.data.cifar10 import CIFAR10Data  # imported when used, as above

    def split(n):
        labels = (np.arange(n) % 10).astype(np.int32)
        images = rng.integers(0, 120, (n, 8, 8, 3)).astype(np.uint8)
        images[labels % 2 == 1] += 120
        return images, labels

    (tr, trl), (te, tel) = split(32), split(16)
    return CIFAR10Data(tr, trl, te, tel, source="tiny")
