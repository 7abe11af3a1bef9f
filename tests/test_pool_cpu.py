"""Pooling on any machine: output shapes (computed by cuDNN's descriptor calls, no GPU needed) and argument
validation with fake device arrays."""

import pytest
from fake_arrays import expect_device_stage, fake

from resnet_native.ops import pool


def floor_out(size, k, s, p):
    return (size + 2 * p - k) // s + 1


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "hw, kernel, stride, padding",
    [((112, 112), 3, 2, 1), ((9, 9), 3, 2, 1), ((8, 8), 2, 2, 0), ((7, 10), (3, 2), (2, 1), (1, 0)), ((5, 5), 5, 1, 2),
     ((1, 1), 1, 1, 0), ((16, 15), 3, 1, 1)],
)
def test_max_pool_output_shape_is_the_floor_formula(layout, hw, kernel, stride, padding):
    k = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    s = stride if isinstance(stride, tuple) else (stride, stride)
    p = padding if isinstance(padding, tuple) else (padding, padding)
    ph, pw = floor_out(hw[0], k[0], s[0], p[0]), floor_out(hw[1], k[1], s[1], p[1])
    x_shape = (3, 6, *hw) if layout == "NCHW" else (3, *hw, 6)
    want = (3, 6, ph, pw) if layout == "NCHW" else (3, ph, pw, 6)
    got = pool.max_pool2d_output_shape(x_shape, kernel=kernel, stride=stride, padding=padding, layout=layout)
    assert got == want


def test_max_pool_window_validation():
    shape = (2, 3, 8, 8)
    assert pool.max_pool2d_output_shape(shape, kernel=2, layout="NCHW") == (2, 3, 4, 4)  # stride defaults to kernel
    with pytest.raises(ValueError, match="padding: expected 0 <= padding <= kernel / 2"):
        pool.max_pool2d_output_shape(shape, kernel=3, stride=2, padding=2, layout="NCHW")
    with pytest.raises(ValueError, match="kernel: expected positive"):
        pool.max_pool2d_output_shape(shape, kernel=0, stride=1, padding=0, layout="NCHW")
    with pytest.raises(ValueError, match="stride: expected positive"):
        pool.max_pool2d_output_shape(shape, kernel=2, stride=(1, 0), padding=0, layout="NCHW")
    with pytest.raises(ValueError, match="kernel: window 9 is larger than the padded input"):
        pool.max_pool2d_output_shape(shape, kernel=9, stride=1, padding=0, layout="NCHW")
    with pytest.raises(ValueError, match="kernel: expected an int or a pair"):
        pool.max_pool2d_output_shape(shape, kernel=(3, 3, 3), stride=1, padding=0, layout="NCHW")
    with pytest.raises(TypeError, match="stride: expected an int or a pair"):
        pool.max_pool2d_output_shape(shape, kernel=3, stride=1.5, padding=0, layout="NCHW")
    with pytest.raises(ValueError, match="layout: expected"):
        pool.max_pool2d_output_shape(shape, kernel=3, stride=1, padding=0, layout="HWCN")


def test_max_pool_validates_arrays():
    x = fake((2, 3, 9, 9), "float16")
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3, 5, 5\), got \(2, 3, 4, 4\)"):
        pool.max_pool2d(x, kernel=3, stride=2, padding=1, layout="NCHW", out=fake((2, 3, 4, 4), "float16"))
    with pytest.raises(TypeError, match="out: expected a float16 array"):
        pool.max_pool2d(x, kernel=3, stride=2, padding=1, layout="NCHW", out=fake((2, 3, 5, 5)))
    with expect_device_stage():
        pool.max_pool2d(x, kernel=3, stride=2, padding=1, layout="NCHW", out=fake((2, 3, 5, 5), "float16"))
    y, dy = fake((2, 3, 5, 5), "float16"), fake((2, 3, 5, 5), "float16")
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 3, 5, 5\)"):
        pool.max_pool2d_backward(fake((2, 3, 5, 4), "float16"), x, y, kernel=3, stride=2, padding=1, layout="NCHW",
                                 out=fake((2, 3, 9, 9), "float16"))
    with pytest.raises(ValueError, match="out and x must have the same shape"):
        pool.max_pool2d_backward(dy, x, y, kernel=3, stride=2, padding=1, layout="NCHW",
                                 out=fake((2, 3, 9, 8), "float16"))
    with expect_device_stage():
        pool.max_pool2d_backward(dy, x, y, kernel=3, stride=2, padding=1, layout="NCHW",
                                 out=fake((2, 3, 9, 9), "float16"))


def test_global_avg_pool_validates_arrays():
    x = fake((4, 7, 7, 32), "uint16")
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 32\), got \(4, 7\)"):
        pool.global_avg_pool(x, layout="NHWC", out=fake((4, 7), "uint16"), dtype="bf16")
    with pytest.raises(TypeError, match="x: .*dtype='bf16'"):
        pool.global_avg_pool(x, layout="NHWC", out=fake((4, 32), "uint16"))
    with expect_device_stage():
        pool.global_avg_pool(x, layout="NHWC", out=fake((4, 32), "uint16"), dtype="bf16")
    with pytest.raises(ValueError, match=r"dy: expected shape \(4, 32\), got \(4, 31\)"):
        pool.global_avg_pool_backward(fake((4, 31)), (4, 7, 7, 32), layout="NHWC", out=fake((4, 7, 7, 32)))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 7, 7, 32\) \(x_shape\)"):
        pool.global_avg_pool_backward(fake((4, 32)), (4, 7, 7, 32), layout="NHWC", out=fake((4, 32, 7, 7)))
    with expect_device_stage():
        pool.global_avg_pool_backward(fake((4, 32)), (4, 7, 7, 32), layout="NHWC", out=fake((4, 7, 7, 32)))
