"""GPU augmentation, checked without a GPU: host-side parameter sampling, the NumPy reference's properties, the
normalisation table, and the CUDA kernel itself — compiled by NVRTC (as cupy will on the device) and, with a few
host shims, by g++ and run on the CPU against the reference."""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from resnet_native.data import augment as aug
from resnet_native.data.augment import (
    MEAN,
    STD,
    AugmentConfig,
    apply_reference,
    cutout_box,
    identity_params,
    normalization_lut,
    sample_epoch,
)
from resnet_native.reference.bf16 import from_bf16_bits, to_bf16_bits

CUTOUT = AugmentConfig(crop_padding=4, flip=True, cutout=16)


def images_for(rng, n=12, h=32, w=32):
    # Values 1..255 so that a zero in the output can only come from padding (never from a real black pixel).
    return rng.integers(1, 256, (n, h, w, 3), dtype=np.uint8)


def raw_lut():
    """An identity 'normalisation' (pixel value as float) so that the reference output shows the source pixels."""
    return np.tile(np.arange(256, dtype=np.float32), (3, 1))


# ----------------------------------------------------------------------------------------------------------------
# (a) sampling


def test_sampling_ranges_and_permutation():
    n = 5000
    t = sample_epoch(7, 3, n, CUTOUT)
    assert t.shape == (6, n) and t.dtype == np.int32 and t.flags.c_contiguous
    assert sorted(t[aug.ROW_INDEX].tolist()) == list(range(n))
    for row in (aug.ROW_OFFSET_Y, aug.ROW_OFFSET_X):
        assert t[row].min() == 0 and t[row].max() == 8  # padding 4: offsets 0..8, all reached
        assert abs(np.bincount(t[row], minlength=9) / n - 1 / 9).max() < 0.02
    assert set(np.unique(t[aug.ROW_FLIP])) == {0, 1} and abs(t[aug.ROW_FLIP].mean() - 0.5) < 0.03
    for row in (aug.ROW_CUT_Y, aug.ROW_CUT_X):
        assert t[row].min() == 0 and t[row].max() == 31
        assert abs(t[row].mean() - 15.5) < 0.5


def test_sampling_is_reproducible_and_epoch_dependent():
    a = sample_epoch(0, 5, 1000, CUTOUT)
    np.testing.assert_array_equal(a, sample_epoch(0, 5, 1000, CUTOUT))
    assert not np.array_equal(a[aug.ROW_INDEX], sample_epoch(0, 6, 1000, CUTOUT)[aug.ROW_INDEX])
    assert not np.array_equal(a[aug.ROW_INDEX], sample_epoch(1, 5, 1000, CUTOUT)[aug.ROW_INDEX])


def test_sampling_options():
    t = sample_epoch(0, 0, 100, AugmentConfig(crop_padding=0, flip=False, cutout=0), shuffle=False)
    np.testing.assert_array_equal(t[aug.ROW_INDEX], np.arange(100))
    assert not t[aug.ROW_OFFSET_Y].any() and not t[aug.ROW_OFFSET_X].any() and not t[aug.ROW_FLIP].any()
    with pytest.raises(ValueError, match="cutout"):
        AugmentConfig(cutout=-1)
    with pytest.raises(ValueError, match="crop_padding"):
        AugmentConfig(crop_padding=1.5)


# ----------------------------------------------------------------------------------------------------------------
# The reference's properties (shapes, crop bounds, flip exactness, cutout area)


def test_identity_params_reproduce_the_image(rng):
    images = images_for(rng)
    out = apply_reference(images, identity_params(len(images), CUTOUT), raw_lut(), crop_padding=4, cutout=0)
    assert out.shape == (12, 32, 32, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out, images.astype(np.float32))
    nchw = apply_reference(images, identity_params(len(images)), raw_lut(), layout="NCHW", crop_padding=0)
    assert nchw.shape == (12, 3, 32, 32)
    np.testing.assert_array_equal(nchw, images.transpose(0, 3, 1, 2).astype(np.float32))


def test_crop_is_a_shift_with_zero_padding(rng):
    images = images_for(rng, n=9 * 9)
    t = identity_params(len(images), CUTOUT)
    oy, ox = np.meshgrid(np.arange(9), np.arange(9), indexing="ij")
    t[aug.ROW_OFFSET_Y], t[aug.ROW_OFFSET_X] = oy.ravel(), ox.ravel()
    out = apply_reference(images, t, raw_lut(), crop_padding=4)
    for k in range(len(images)):
        padded = np.zeros((40, 40, 3), np.float32)
        padded[4:36, 4:36] = images[k]
        dy, dx = t[aug.ROW_OFFSET_Y, k], t[aug.ROW_OFFSET_X, k]
        np.testing.assert_array_equal(out[k], padded[dy:dy + 32, dx:dx + 32])
        # Exactly the padded rows/columns are zero (source pixels are >= 1).
        zero = abs(int(dy) - 4) * 32 + abs(int(dx) - 4) * 32 - abs(int(dy) - 4) * abs(int(dx) - 4)
        assert (out[k, ..., 0] == 0).sum() == zero


def test_flip_mirrors_the_crop(rng):
    images = images_for(rng)
    t = sample_epoch(3, 0, len(images), CUTOUT)
    t[aug.ROW_FLIP] = 0
    plain = apply_reference(images, t, raw_lut(), crop_padding=4)
    t[aug.ROW_FLIP] = 1
    flipped = apply_reference(images, t, raw_lut(), crop_padding=4)
    np.testing.assert_array_equal(flipped, plain[:, :, ::-1])


def test_cutout_area_and_value(rng):
    images = images_for(rng, n=200)
    t = identity_params(len(images), CUTOUT)
    t[aug.ROW_CUT_Y] = rng.integers(0, 32, len(images))
    t[aug.ROW_CUT_X] = rng.integers(0, 32, len(images))
    lut = normalization_lut("fp32")
    out = apply_reference(images, t, lut, crop_padding=4, cutout=16)
    base = apply_reference(images, t, lut, crop_padding=4, cutout=0)
    for k in range(len(images)):
        y0, y1, x0, x1 = cutout_box(t[aug.ROW_CUT_Y, k], t[aug.ROW_CUT_X, k], 16)
        assert 8 * 8 <= (y1 - y0) * (x1 - x0) <= 16 * 16
        changed = np.any(out[k] != base[k], axis=-1)
        expect = np.zeros((32, 32), bool)
        expect[y0:y1, x0:x1] = True
        np.testing.assert_array_equal(changed, expect)  # the clipped box, nothing else
        assert not out[k][expect].any()  # set to 0 after normalisation: the data-set mean
    # A centre in the middle gives the full 16x16 square.
    assert cutout_box(16, 16, 16) == (8, 24, 8, 24)
    assert cutout_box(0, 31, 16) == (0, 8, 23, 32)


def test_normalization_table():
    for dtype, np_dtype in (("fp32", np.float32), ("tf32", np.float32), ("fp16", np.float16), ("bf16", np.uint16)):
        lut = normalization_lut(dtype)
        assert lut.shape == (3, 256) and lut.dtype == np_dtype
    exact = (np.arange(256)[None] / 255.0 - np.array(MEAN)[:, None]) / np.array(STD)[:, None]
    np.testing.assert_allclose(normalization_lut("fp32"), exact, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(normalization_lut("fp16").astype(np.float64), exact, rtol=1e-3, atol=1e-3)
    bf = from_bf16_bits(normalization_lut("bf16")).astype(np.float64)
    np.testing.assert_allclose(bf, exact, rtol=8e-3, atol=8e-3)
    # The bf16 table is the package's bf16 rounding (to nearest even, of the float32 value) of the exact values.
    np.testing.assert_array_equal(normalization_lut("bf16"), to_bf16_bits(exact))
    assert to_bf16_bits(np.float32(1.0 + 2**-8)).item() == 0x3F80  # tie -> even (down)
    assert to_bf16_bits(np.float32(1.0 + 3 * 2**-8)).item() == 0x3F82  # tie -> even (up)
    assert to_bf16_bits(np.float32(-2.5)).item() == 0xC020


def test_normalize_on_host_matches_the_formula(rng):
    images = images_for(rng)
    x = aug.normalize_on_host(images, layout="NCHW", dtype="fp32")
    want = ((images / 255.0 - np.array(MEAN)) / np.array(STD)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# (b) the kernel source: NVRTC compiles it; the same source, run on the CPU, equals the reference bit for bit


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError:
        return None
    return nvrtc


def test_kernel_compiles_with_nvrtc():
    nvrtc = _nvrtc()
    if nvrtc is None:
        pytest.skip("cupy's NVRTC bindings are not importable")
    try:
        prog = nvrtc.createProgram(aug.KERNEL_SOURCE, "augment.cu", [], [])
    except Exception as e:  # libnvrtc missing
        pytest.skip(f"NVRTC unavailable: {e}")
    try:
        nvrtc.compileProgram(prog, ["-arch=compute_90"])
    except Exception as e:
        pytest.fail(f"augment kernel does not compile: {e}\n{nvrtc.getProgramLog(prog)}")
    ptx = nvrtc.getPTX(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert ".entry augment_2byte" in ptx and ".entry augment_4byte" in ptx


HOST_SHIM = r"""
struct Dim3 { unsigned int x, y, z; };
static Dim3 blockIdx, blockDim, threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
"""

HOST_DRIVER = r"""
extern "C" void run_grid(int itemsize, unsigned grid, unsigned block, const unsigned char* images,
                         const int* params, int stride, int start, int batch, int h, int w, int pad, int cut,
                         int nchw, const void* lut, void* out) {
  blockDim.x = block;
  for (unsigned g = 0; g < grid; ++g) {
    blockIdx.x = g;
    for (unsigned t = 0; t < block; ++t) {
      threadIdx.x = t;
      if (itemsize == 2)
        augment_2byte(images, params, stride, start, batch, h, w, pad, cut, nchw, (const unsigned short*)lut,
                      (unsigned short*)out);
      else
        augment_4byte(images, params, stride, start, batch, h, w, pad, cut, nchw, (const unsigned int*)lut,
                      (unsigned int*)out);
    }
  }
}
"""


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to run the kernel on the CPU")
    d = tmp_path_factory.mktemp("augment_kernel")
    src = d / "augment_host.cpp"
    src.write_text(HOST_SHIM + aug.KERNEL_SOURCE + HOST_DRIVER)
    lib = d / "augment_host.so"
    subprocess.run([cxx, "-O1", "-std=c++14", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True,
                   capture_output=True)
    return ctypes.CDLL(str(lib))


def run_on_cpu(host_kernel, images, table, start, batch, lut, layout, pad, cut, block=aug.THREADS_PER_BLOCK):
    """Launch the kernel's exact grid on the CPU; out starts as all-ones bits (NaN) so unwritten elements show."""
    n, h, w, _ = images.shape
    shape = (batch, h, w, 3) if layout == "NHWC" else (batch, 3, h, w)
    out = np.frombuffer(bytearray(b"\xff" * (int(np.prod(shape)) * lut.dtype.itemsize)), lut.dtype).reshape(shape)
    grid = (batch * h * w + block - 1) // block
    p = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    images, table, lut = (np.ascontiguousarray(a) for a in (images, table, lut))
    host_kernel.run_grid(ctypes.c_int(lut.dtype.itemsize), ctypes.c_uint(grid), ctypes.c_uint(block), p(images),
                         p(table), ctypes.c_int(table.shape[1]), ctypes.c_int(start), ctypes.c_int(batch),
                         ctypes.c_int(h), ctypes.c_int(w), ctypes.c_int(pad), ctypes.c_int(cut),
                         ctypes.c_int(layout == "NCHW"), p(lut), p(out))
    return out


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_kernel_on_cpu_equals_reference(host_kernel, rng, dtype, layout):
    images = images_for(rng, n=40)
    table = sample_epoch(11, 2, len(images), CUTOUT)
    lut = normalization_lut(dtype)
    start, batch = 5, 23  # a slice in the middle; 23 * 1024 is not a multiple of the block size
    got = run_on_cpu(host_kernel, images, table, start, batch, lut, layout, 4, 16)
    want = apply_reference(images, table[:, start:start + batch], lut, layout=layout, crop_padding=4, cutout=16)
    bits = np.uint16 if lut.dtype.itemsize == 2 else np.uint32
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_kernel_on_cpu_other_sizes_and_options(host_kernel, rng, layout):
    images = images_for(rng, n=6, h=20, w=28)
    cfg = AugmentConfig(crop_padding=2, flip=True, cutout=5)
    table = sample_epoch(1, 1, len(images), cfg, height=20, width=28)
    lut = normalization_lut("fp16")
    got = run_on_cpu(host_kernel, images, table, 0, 6, lut, layout, 2, 5, block=64)
    want = apply_reference(images, table, lut, layout=layout, crop_padding=2, cutout=5)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


# ----------------------------------------------------------------------------------------------------------------
# Labels are checked once, on the host, when a data set enters the pipeline


def test_check_labels_names_the_first_bad_label():
    aug.check_labels(np.arange(10, dtype=np.int32), 10)
    with pytest.raises(ValueError, match=r"labels\[5\] = 10: expected a class index in \[0, 10\) \(2 label"):
        aug.check_labels(np.array([0, 1, 2, 3, 4, 10, 6, 11]), 10)
    with pytest.raises(ValueError, match=r"y\[2\] = -1"):
        aug.check_labels(np.array([0, 9, -1], np.int64), 10, "y")
    with pytest.raises(ValueError, match=r"labels\[0\] = 4294967296"):  # would wrap to 0 as int32
        aug.check_labels(np.array([2**32], np.int64), 10)
    with pytest.raises(ValueError, match="integer class indices"):
        aug.check_labels(np.array([0.5, 1.0]), 10)


def test_gpu_augmenter_rejects_out_of_range_labels(rng, monkeypatch):
    import sys
    import types

    # The augmenter's cupy calls on NumPy, so that a bad label can only be caught by the check itself.
    fake = types.SimpleNamespace(asarray=np.asarray, ascontiguousarray=np.ascontiguousarray, int32=np.int32,
                                 asnumpy=np.asarray)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    images = images_for(rng, n=8)
    labels = np.arange(8, dtype=np.int32)
    a = aug.GpuAugmenter(images, labels, batch_size=4)
    assert a.num_images == 8
    labels[6] = 10
    with pytest.raises(ValueError, match=r"labels\[6\] = 10"):
        aug.GpuAugmenter(images, labels, batch_size=4)
    aug.GpuAugmenter(images, np.arange(8) % 7, batch_size=4, num_classes=7)
    with pytest.raises(ValueError, match=r"labels\[7\] = 7: expected a class index in \[0, 7\)"):
        aug.GpuAugmenter(images, np.arange(8), batch_size=4, num_classes=7)
