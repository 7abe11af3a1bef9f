"""The conv GPU tests' view of the package's float64 convolution reference (resnet_native.reference.conv): NCHW
arrays with filters (K, C/groups, R, S), and the geometry as arguments instead of a ConvSpec.

Device values in either layout come and go through device_values.py (to_layout / from_layout).
"""

from types import SimpleNamespace

import numpy as np

from resnet_native import reference


def _spec(stride, padding, dilation, groups):
    return SimpleNamespace(stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=groups,
                           layout="NCHW", precision="fp32")


def _f64(a):
    return None if a is None else np.asarray(a, np.float64)


def output_shape(x_shape, w_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """The NCHW output shape of convolving NCHW x_shape with KCRS w_shape."""
    return reference.conv.conv_output_shape(tuple(x_shape), tuple(w_shape), _spec(stride, padding, dilation, groups))


def conv2d(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, *, bias=None, z=None,
           activation="identity", alpha1=1.0, alpha2=1.0):
    """activation(alpha1 * conv(x, w) + alpha2 * z + bias), the convolution a cross-correlation:
    y[n, k, p, q] = sum_{c, r, s} x[n, g(k)*C/g + c, p*s0 + r*d0 - pad0, ...] * w[k, c, r, s]."""
    return reference.conv.conv2d(_f64(x), _f64(w), _spec(stride, padding, dilation, groups), bias=_f64(bias),
                                 z=_f64(z), activation=activation, alpha1=alpha1, alpha2=alpha2)


def conv2d_backward_data(dy, w, x_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """dx of conv2d: the adjoint of conv2d with respect to x."""
    return reference.conv.conv2d_backward_data(_f64(dy), _f64(w), _spec(stride, padding, dilation, groups),
                                               tuple(x_shape))


def conv2d_backward_filter(x, dy, w_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """dw of conv2d: the adjoint of conv2d with respect to w."""
    return reference.conv.conv2d_backward_filter(_f64(x), _f64(dy), _spec(stride, padding, dilation, groups),
                                                 tuple(w_shape))
