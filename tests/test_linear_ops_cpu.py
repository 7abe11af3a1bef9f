"""The fully connected layer's kernels (ops/linear.py): every argument check of the native ops runs before any
device access and names the argument (fake device arrays, no GPU needed); the host versions compute in float64."""

import numpy as np
import pytest
from fake_arrays import FakeCudaArray, expect_device_stage, fake

from resnet_native.ops.linear import linear_backward_data, linear_backward_weight, linear_forward


def test_forward_checks_every_argument_by_name():
    x, w, b, out = fake((8, 16), "float16"), fake((10, 16)), fake((10,)), fake((8, 10))
    with expect_device_stage():
        linear_forward(x, w, b, out=out)
    with pytest.raises(ValueError, match=r"w: expected \(K, 16\) to match x's features, got \(10, 12\)"):
        linear_forward(x, fake((10, 12)), b, out=out)
    with pytest.raises(TypeError, match="w: expected a float32 array, got float16"):
        linear_forward(x, fake((10, 16), "float16"), b, out=out)
    with pytest.raises(ValueError, match=r"b: expected shape \(10,\) \(one per output\)"):
        linear_forward(x, w, fake((9,)), out=out)
    with pytest.raises(ValueError, match=r"out: expected shape \(8, 10\)"):
        linear_forward(x, w, b, out=fake((8, 9)))
    with pytest.raises(ValueError, match="x: expected a 2-D array"):
        linear_forward(fake((8, 16, 1), "float16"), w, b, out=out)
    with pytest.raises(ValueError, match="out must not share memory with x"):
        linear_forward(x, w, b, out=FakeCudaArray((8, 10), "float32", ptr=x.ptr))


def test_backward_checks_every_argument_by_name():
    dy, w, out = fake((8, 10)), fake((10, 16)), fake((8, 16), "uint16")  # uint16: bf16 features
    with expect_device_stage():
        linear_backward_data(dy, w, out)
    with pytest.raises(ValueError, match=r"dy: expected shape \(8, 10\)"):
        linear_backward_data(fake((7, 10)), w, out)
    with pytest.raises(ValueError, match=r"w: expected \(K, 16\) to match out's features"):
        linear_backward_data(dy, fake((10, 15)), out)
    with pytest.raises(TypeError, match="out: expected a float32, float16 or bf16"):
        linear_backward_data(dy, w, fake((8, 16), "int32"))
    x = fake((8, 16), "float16")
    with expect_device_stage():
        linear_backward_weight(x, dy, out=fake((10, 16)))
    with pytest.raises(ValueError, match=r"dy: expected 8 rows, one per row of x"):
        linear_backward_weight(x, fake((9, 10)), out=fake((10, 16)))
    with pytest.raises(ValueError, match=r"out: expected shape \(10, 16\)"):
        linear_backward_weight(x, dy, out=fake((16, 10)))
    with pytest.raises(TypeError, match="dy: expected a float32 array, got float16"):
        linear_backward_weight(x, fake((8, 10), "float16"), out=fake((10, 16)))


def test_the_host_versions_are_the_float64_products(rng):
    x, w, b = rng.standard_normal((5, 7)), rng.standard_normal((3, 7)), rng.standard_normal(3)
    dy = rng.standard_normal((5, 3))
    np.testing.assert_allclose(linear_forward(x, w, b), x @ w.T + b, rtol=1e-15)
    np.testing.assert_allclose(linear_backward_weight(x, dy), dy.T @ x, rtol=1e-15)
    dx = np.empty((5, 7), np.float16)
    assert linear_backward_data(dy, w, dx) is dx
    np.testing.assert_array_equal(dx, (dy @ w).astype(np.float16))
    with pytest.raises(ValueError, match=r"w: expected \(K, 7\) to match x's features"):
        linear_forward(x, w[:, :6], b)
