"""Test values on their way between the float64 reference (resnet_native.reference) and the device, for the GPU
tests: device arrays of exactly known values, NaN-poisoned outputs, results read back, and the check that holds a
result to its reference.

Host values are float64 NumPy arrays; 4-D ones are in NCHW order (filters KCRS) whatever the layout of the device
array, which `layout` names. On the device a value is stored in its precision's storage dtype (bf16: uint16 bit
patterns). An output starts as NaN, so that an element an op never writes makes the check fail.
"""

import numpy as np

from resnet_native.reference import from_storage, relative_error, to_storage
from resnet_native.reference.layout import shape_from_nchw

# The norm-wise relative error a result may have against the float64 reference of the values it was given.
TOLERANCE = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}


def _cupy():
    import cupy

    return cupy


def to_layout(a, layout):
    """A 4-D NCHW-ordered array (activation or KCRS filter) in the layout's order, C-contiguous; others as given."""
    a = np.asarray(a)
    if a.ndim != 4 or layout == "NCHW":
        return a
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def from_layout(a, layout):
    """A 4-D array in the layout's order as NCHW (activations) / KCRS (filters); others as given."""
    a = np.asarray(a)
    return a if a.ndim != 4 or layout == "NCHW" else a.transpose(0, 3, 1, 2)


def shape_in(shape, layout):
    """A 4-D NCHW shape in the layout's order; other shapes as given."""
    shape = tuple(int(s) for s in shape)
    return shape_from_nchw(shape, layout) if len(shape) == 4 else shape


def rounded(values, precision):
    """`values` rounded to the precision's storage dtype, as float64: values a device array holds exactly."""
    return from_storage(to_storage(values, precision))


def to_device(values, precision, layout="NCHW"):
    """(a device array holding `values` rounded to the precision's storage dtype, in `layout`; the float64 values it
    holds, in the order given)."""
    stored = to_storage(values, precision)
    return _cupy().asarray(to_layout(stored, layout)), from_storage(stored)


def random_device(rng, shape, precision, layout="NCHW", scale=1.0):
    """to_device() of standard normal values times `scale`, of NCHW shape `shape`."""
    return to_device(rng.standard_normal(shape) * scale, precision, layout)


def poisoned(shape, precision, layout="NCHW"):
    """A device array of NaN in the precision's storage dtype, of NCHW shape `shape` in `layout`: an op's output."""
    return _cupy().asarray(to_storage(np.full(shape_in(shape, layout), np.nan), precision))


def host_values(array, layout="NCHW"):
    """The float64 values of a device (or host) storage array, 4-D ones in NCHW order; uint16 arrays are bf16."""
    return from_layout(from_storage(_cupy().asnumpy(array)), layout)


def check_close(actual, expected, tol, what, layout="NCHW"):
    """Asserts that `actual` (a device or host storage array in `layout`) was written everywhere and is within `tol`
    (a precision's TOLERANCE, or a number) of the float64 `expected` in the norm-wise relative error; returns it."""
    got, expected = host_values(actual, layout), np.asarray(expected, dtype=np.float64)
    bound = TOLERANCE[tol] if isinstance(tol, str) else tol
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert np.isfinite(got).all(), f"{what}: {np.count_nonzero(~np.isfinite(got))} of {got.size} elements not written"
    assert np.linalg.norm(expected) > 0, f"{what}: the reference is all zeros: the test data is degenerate"
    err = relative_error(got, expected)
    assert err <= bound, f"{what}: relative error {err:.3g} > {bound:g}"
    return err
