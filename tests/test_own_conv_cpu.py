"""The own convolution kernels' host side (csrc/ownconv/, ops.own_conv), no GPU: what build_info says about them,
the registry's listing, the kernel choice, every argument check of own_conv_s8 before the device, the float64
reference the GPU tests compare with, and that only the kernels' own translation units include CUTLASS."""

import pathlib
import re

import numpy as np
import pytest
from fake_arrays import expect_device_stage, fake

import resnet_native as rn
from resnet_native.ops import own_conv

REPO = pathlib.Path(__file__).resolve().parent.parent
STATUS = rn.build_info()["own_conv_kernels"]
built = pytest.mark.skipif(not STATUS["kernels"], reason=f"own convolution kernels {STATUS['reason']}")


def test_build_info_says_whether_the_kernels_are_built_and_why_not():
    assert set(STATUS) == {"built", "reason", "cutlass", "kernels"}
    names = [k["name"] for k in own_conv.kernels()]
    assert STATUS["kernels"] == names == sorted(names)
    if STATUS["built"]:
        assert STATUS["reason"] == "" and re.fullmatch(r"4\.2\.\d+", STATUS["cutlass"]) and names
        assert "90" in rn.build_info()["cuda_archs"] and rn.build_info()["cuda_compiler"].startswith("nvcc")
    else:
        assert STATUS["reason"].startswith("not built: ") and STATUS["cutlass"] == "" and names == []
        assert not own_conv.available()
        with pytest.raises(RuntimeError, match="not in this build"):
            own_conv.select((1, 8, 8, 16), (16, 3, 3, 16), pad=1, stride=1)


@built
def test_each_kernel_lists_its_fixed_properties():
    kernels = own_conv.kernels()
    for k in kernels:
        assert k["dtype"] == k["out_dtype"] == "int8" and k["sm"] == 90
        assert k["epilogue"] == ("requantize_residual" if k["residual"] else "requantize")
        assert all(isinstance(v, int) and v > 0 for v in (*k["tile"], *k["cluster"], k["threads"]))
        assert k["stages"] >= 2 and k["smem_bytes"] >= 32 * 1024
        assert k["channel_multiple"] == 16 and k["address_alignment"] == 16
    assert {k["residual"] for k in kernels} == {False, True}, "both epilogues are compiled"


def runs_3x3(info):
    """Whether the kernel takes 3x3 filters: the 1x1 GEMMs ('s8_1x1_*') take 1x1 at stride 1 only. They, the
    persistent convolutions ('s8_p_*' cooperative, 's8_pp_*' ping-pong) and the halo-window kernels ('s8_halo_*',
    one channel count each) are persistent, the rest not."""
    assert info["persistent"] == info["name"].startswith(("s8_1x1_", "s8_p_", "s8_pp_", "s8_halo_"))
    assert info["gemm_1x1"] == info["name"].startswith("s8_1x1_")
    assert info["preferred"] == (halo_channels(info) == 64)  # the 64-channel halo kernels only
    return not info["gemm_1x1"]


def halo_channels(info):
    """The one channel count (C = K) a halo-window kernel runs ('s8_halo_c64', 's8_halo_res_c128'), else None."""
    return int(info["name"].rsplit("_c", 1)[1]) if info["name"].startswith("s8_halo_") else None


def expected_auto(c, k, residual):
    """select()'s documented rule: among the kernels of the epilogue that can run the problem, a preferred one first
    (the 64-channel halo kernels), then persistent ones, then a 1x1 GEMM, then tiles without partly empty ones, then
    the larger tile (else the smallest), then fewer stages. The problems here are 3x3: no GEMM runs them."""
    def key(info):
        tm, tn, tk = info["tile"]
        whole = k % tn == 0 and c % tk == 0
        size = tm * tn * tk if whole else -tm * tn * tk
        return (info["preferred"], info["persistent"], info["gemm_1x1"], whole, size, -info["stages"])
    runs = [i for i in own_conv.kernels() if i["residual"] == residual and runs_3x3(i)
            and halo_channels(i) in (None, c if c == k else None)]
    return max(runs, key=key)["name"]


@built
@pytest.mark.parametrize("c,k", [(16, 16), (64, 64), (64, 128), (128, 128), (256, 512), (48, 80), (512, 16)])
@pytest.mark.parametrize("residual", [False, True])
def test_auto_picks_a_kernel_by_its_rule_and_a_named_one_is_checked(c, k, residual):
    name = own_conv.select((2, 8, 8, c), (k, 3, 3, c), pad=1, stride=1, residual=residual)
    assert name == expected_auto(c, k, residual)
    if c == k == 64:  # the halo-window kernel, faster there than any general one
        assert name == ("s8_halo_res_c64" if residual else "s8_halo_c64")
    for info in own_conv.kernels():
        if info["residual"] == residual and not runs_3x3(info):
            with pytest.raises(ValueError, match="takes 1x1 filters at stride 1 without padding only"):
                own_conv.select((2, 8, 8, c), (k, 3, 3, c), pad=1, stride=1, residual=residual, kernel=info["name"])
            assert own_conv.select((2, 8, 8, c), (k, 1, 1, c), pad=0, stride=1, residual=residual,
                                   kernel=info["name"]) == info["name"]
        elif info["residual"] == residual and halo_channels(info) not in (None, c if c == k else None):
            with pytest.raises(ValueError, match=f"a halo-window kernel: takes C = K = {halo_channels(info)}, 3x3"):
                own_conv.select((2, 8, 8, c), (k, 3, 3, c), pad=1, stride=1, residual=residual, kernel=info["name"])
        elif info["residual"] == residual:
            assert own_conv.select((2, 8, 8, c), (k, 3, 3, c), pad=1, stride=1, residual=residual,
                                   kernel=info["name"]) == info["name"]
        else:
            with pytest.raises(ValueError, match="needs a residual|takes no residual"):
                own_conv.select((2, 8, 8, c), (k, 3, 3, c), pad=1, stride=1, residual=residual, kernel=info["name"])


@built
def test_shapes_the_kernels_cannot_run_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"no compiled kernel can run .*C=24 is not a multiple of 16"):
        own_conv.select((1, 8, 8, 24), (16, 3, 3, 24), pad=1, stride=1)
    with pytest.raises(ValueError, match="K=40 is not a multiple of 16"):
        own_conv.select((1, 8, 8, 16), (40, 1, 1, 16), pad=0, stride=1)
    assert not own_conv.supports((1, 8, 8, 16), (16, 1, 1, 16), pad=300, stride=1)  # TMA im2col's padding limit
    assert own_conv.supports((1, 8, 8, 16), (16, 1, 1, 16), pad=0, stride=2)
    with pytest.raises(ValueError, match="kernel: expected 'auto' or one of"):
        own_conv.select((1, 8, 8, 16), (16, 1, 1, 16), pad=0, stride=1, kernel="s8_bogus")
    with pytest.raises(ValueError, match=r"w_shape: expected \(K, R, S, C\) filters with C = 16"):
        own_conv.select((1, 8, 8, 16), (16, 1, 1, 32), pad=0, stride=1)
    with pytest.raises(ValueError, match="larger than the padded input"):
        own_conv.select((1, 2, 2, 16), (16, 5, 5, 16), pad=1, stride=1)
    with pytest.raises(ValueError, match="stride: expected values >= 1"):
        own_conv.select((1, 8, 8, 16), (16, 1, 1, 16), pad=0, stride=0)


# --- own_conv_s8's argument checks (fake device arrays: validation ends at the device check) -----------------------

X, W, Y, K = (2, 8, 8, 16), (32, 3, 3, 16), (2, 8, 8, 32), 32


def call(**changes):
    args = dict(x=fake(X, "int8"), w=fake(W, "int8"), out=fake(Y, "int8"), alpha=fake((K,), "float32"),
                bias=fake((K,), "float32"), pad=1, stride=1)
    args.update(changes)
    return own_conv.conv2d_s8(args.pop("x"), args.pop("w"), args.pop("out"), **args)


def expect_valid():
    """All arguments valid: the device check (no GPU here), or without kernels the build's refusal."""
    return expect_device_stage() if STATUS["kernels"] else pytest.raises(RuntimeError, match="not in this build")


def test_valid_arguments_reach_the_device_check():
    with expect_valid():
        call()
    with expect_valid():
        call(residual=fake(Y, "int8"), beta=0.5, relu=False)
    with expect_valid():
        call(out=None)  # allocated after validation
    with expect_valid():
        call(x=fake((2, 9, 9, 16), "int8"), out=fake((2, 5, 5, 32), "int8"), stride=2)


@pytest.mark.parametrize("changes,error,match", [
    (dict(x=fake(X, "float16")), TypeError, "x: expected an int8 array"),
    (dict(x=fake((8, 8, 16), "int8")), ValueError, r"x: expected a 4-D activation \(N, H, W, C\)"),
    (dict(w=fake(W, "float32")), TypeError, "w: expected an int8 array"),
    (dict(w=fake((32, 3, 3, 8), "int8")), ValueError, r"w: expected \(K, R, S, C\) filters with C = 16"),
    (dict(alpha=fake((K,), "float16")), TypeError, "alpha: expected a float32 array"),
    (dict(alpha=fake((K - 1,), "float32")), ValueError, r"alpha: expected shape \(32,\)"),
    (dict(bias=None), TypeError, "bias: expected a CUDA array, got None"),
    (dict(bias=fake((K, 1), "float32")), ValueError, "bias: expected a 1-D array"),
    (dict(residual=fake((2, 8, 8, 16), "int8"), beta=1.0), ValueError, r"residual: expected shape \(2, 8, 8, 32\)"),
    (dict(residual=fake(Y, "uint8"), beta=1.0), TypeError, "residual: expected an int8 array"),
    (dict(beta=0.5), ValueError, "beta: a residual scale without a residual"),
    (dict(residual=fake(Y, "int8"), beta=float("nan")), ValueError, "beta: expected a finite number"),
    (dict(residual=fake(Y, "int8"), beta=1e39), ValueError, r"beta: expected a finite number \(in float32\)"),
    (dict(out=fake((2, 4, 4, 32), "int8")), ValueError, r"out: expected shape \(2, 8, 8, 32\)"),
    (dict(out=fake(Y, "float32")), TypeError, "out: expected an int8 array"),
    (dict(out=fake(Y, "int8", readonly=True)), ValueError, "out: the array is read-only"),
    (dict(x=fake(X, "int8", ptr=(1 << 44) + 8)), ValueError, "x: expected an address aligned to 16 bytes"),
    (dict(alpha=fake((K,), "float32", ptr=(1 << 44) + 4)), ValueError, "alpha: expected an address aligned to 16"),
    (dict(pad=-1), ValueError, "pad: expected values >= 0"),
    (dict(stride=(1, 0)), ValueError, "stride: expected values >= 1"),
    (dict(pad=1.5), TypeError, "pad: expected an int or a pair of ints"),
    (dict(kernel=3), TypeError, "incompatible function arguments"),
])
def test_each_bad_argument_is_named_before_the_device(changes, error, match):
    with pytest.raises(error, match=match):
        call(**changes)


def test_out_sharing_memory_with_an_input_is_refused():
    x = fake(X, "int8")
    with pytest.raises(ValueError, match="out must not share memory with x|out partially overlaps x"):
        call(x=x, out=fake(Y, "int8", ptr=x.ptr))


@built
def test_shapes_no_kernel_runs_are_refused_before_the_device():
    with pytest.raises(ValueError, match="C=24 is not a multiple of 16"):
        call(x=fake((2, 8, 8, 24), "int8"), w=fake((32, 3, 3, 24), "int8"))
    name = next(k["name"] for k in own_conv.kernels() if k["residual"])
    with pytest.raises(ValueError, match="needs a residual"):
        call(kernel=name)


# --- the float64 reference -------------------------------------------------------------------------------------------

def direct(x, w, pad, stride):
    """The exact int64 sums of a convolution, NHWC x KRSC, looped."""
    n, h, wd, c = x.shape
    k, r, s, _ = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    p, q = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    acc = np.zeros((n, p, q, k), np.int64)
    for i in range(p):
        for j in range(q):
            patch = xp[:, i * stride:i * stride + r, j * stride:j * stride + s]
            acc[:, i, j] = np.einsum("nrsc,krsc->nk", patch, w.astype(np.int64))
    return acc


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("residual", [False, True])
def test_the_reference_is_the_exact_sum_then_the_epilogue_rounded_once_into_the_symmetric_range(rng, relu, residual):
    x = rng.integers(-127, 128, (2, 6, 6, 16)).astype(np.int8)
    w = rng.integers(-127, 128, (8, 3, 3, 16)).astype(np.int8)
    alpha = rng.uniform(0.5, 1.5, 8).astype(np.float32) / 500
    bias = rng.uniform(-20, 20, 8).astype(np.float32)
    z = rng.integers(-127, 128, (2, 3, 3, 8)).astype(np.int8) if residual else None
    beta = 0.75 if residual else 0.0
    got = own_conv.conv2d_s8(x, w, alpha=alpha, bias=bias, pad=1, stride=2, residual=z, beta=beta, relu=relu)
    v = direct(x, w, 1, 2) * alpha.astype(np.float64) + bias.astype(np.float64)
    if residual:
        v = v + beta * z
    v = np.maximum(v, 0 if relu else -127)
    want = np.clip(np.rint(v), -127, 127).astype(np.int8)
    assert got.dtype == np.int8 and np.array_equal(got, want)
    assert (got == 127).any() and ((got == 0).any() if relu else (got == -127).any()), "saturation not exercised"
    with pytest.raises(ValueError, match="beta: a residual scale without a residual"):
        own_conv.conv2d_s8(x, w, alpha=alpha, bias=bias, pad=1, stride=2, beta=0.5)


# --- the layers of csrc -------------------------------------------------------------------------------------------

def includes(path):
    return re.findall(r'^#include\s+"([^"]+)"', path.read_text(), re.M)


def test_only_the_kernels_translation_units_include_cutlass_and_the_layer_includes_only_core():
    csrc = REPO / "csrc"
    kernel_dir = csrc / "ownconv" / "sm90"
    for path in csrc.rglob("*"):
        if path.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        cutlass = [i for i in includes(path) if i.startswith(("cutlass/", "cute/"))]
        assert not cutlass or path.parent == kernel_dir, f"{path.relative_to(REPO)} includes {cutlass}"
        if path.parent.parent == csrc and path.parent.name == "ownconv" or path.parent == kernel_dir:
            for inc in includes(path):
                target = (path.parent / inc).resolve()
                if inc.startswith(("cutlass/", "cute/")):
                    continue
                assert target.is_relative_to(csrc / "core") or target.is_relative_to(csrc / "ownconv"), (path, inc)


@built
@pytest.mark.parametrize("residual", [False, True])
def test_a_1x1_stride_1_layer_prefers_a_persistent_gemm(residual):
    def info(name):
        return next(k for k in own_conv.kernels() if k["name"] == name)

    name = own_conv.select((2, 8, 8, 64), (256, 1, 1, 64), pad=0, stride=1, residual=residual)
    assert name.startswith("s8_1x1_") and info(name)["persistent"] and info(name)["residual"] == residual
    strided = own_conv.select((2, 8, 8, 64), (256, 1, 1, 64), pad=0, stride=2, residual=residual)
    assert not strided.startswith("s8_1x1_") and info(strided)["residual"] == residual
