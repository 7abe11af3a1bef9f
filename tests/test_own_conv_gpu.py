"""The own int8 convolution kernels (csrc/ownconv/, ops.own_conv) on a Hopper GPU, every compiled kernel and 'auto',
over fuzzed shapes, strides and channel counts, with and without the residual and the ReLU, outputs poisoned: bit
for bit against an fp32 model of the kernel's arithmetic, and within the derived bound of the float64 reference.

The bound, derived. The kernel sums the int8 products exactly in int32 (acc), then in fp32, round to nearest (unit
roundoff u = 2^-24), one rounding per step:  a = fl(acc) (exact below 2^24), t = fl(alpha * a + bias) (a fused
multiply-add), v' = fl(beta * r + t) (another, with a residual), then clamps to [lower, 127] (exact) and rounds to
nearest even (saturating). The float64 reference computes v = alpha * acc + bias + beta * r once, exactly enough,
and rounds once. So |v' - v| <= u * (|t| + |v'|) + |alpha| * |a - acc| =: e, and since the clamp moves both alike
and rounding moves a value by at most 1/2, the two int8 results differ by at most one code, and only where v lies
within e of a rounding boundary (m + 1/2). Elsewhere the rounding is defined the same way and they agree bit for
bit; the fp32 model (emulate below, fused multiply-adds emulated exactly) agrees everywhere.
"""

import numpy as np
import pytest

from resnet_native import reference
from resnet_native._core import capture as cuda_graph
from resnet_native.ops import own_conv
from resnet_native.ops.conv_spec import ConvSpec

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

needs_kernels = pytest.mark.skipif(not own_conv.available(),
                                   reason="no own convolution kernels for this GPU or build (build_info()"
                                          "['own_conv_kernels'])")
MAX_MACS = 1.2e8  # keeps the float64 reference at a fraction of a second per case
GEOMETRIES = [(3, 1, 1), (3, 1, 2), (1, 0, 1), (1, 0, 2)]  # (filter size, pad, stride)


def fuzz_cases(count=30, seed=40):
    """(n, hw, c, k, r, pad, stride): H = W in {4, 8, 16, 32}, C and K multiples of 16 in 16..512, each geometry,
    ResNet-18's CIFAR layer shapes, ResNet-50's 1x1 ones (some on pixel counts no tile divides) and 64- and 128-channel
    3x3s on partial 8x8 tiles among them; the batch shrinks a case to MAX_MACS."""
    rng = np.random.default_rng(seed)
    channels = [16, 32, 48, 64, 80, 128, 144, 192, 256, 320, 384, 512]
    cases = [(2, 32, 64, 64, 3, 1, 1), (2, 32, 64, 128, 3, 1, 2), (2, 32, 64, 128, 1, 0, 2), (2, 16, 128, 128, 3, 1, 1),
             (2, 8, 256, 256, 3, 1, 1), (2, 4, 512, 512, 3, 1, 1), (2, 8, 256, 512, 1, 0, 2),
             (2, 32, 64, 256, 1, 0, 1), (2, 32, 256, 64, 1, 0, 1), (3, 8, 1024, 256, 1, 0, 1),  # ResNet-50's 1x1s
             (3, 12, 64, 64, 3, 1, 1), (1, 4, 64, 64, 3, 1, 1), (2, 12, 128, 128, 3, 1, 1),  # partial 8x8 tiles
             (2, 16, 128, 512, 1, 0, 1), (1, 5, 64, 256, 1, 0, 1), (3, 7, 128, 512, 1, 0, 1)]  # odd pixel counts
    while len(cases) < count:
        r, pad, stride = GEOMETRIES[len(cases) % len(GEOMETRIES)]
        hw = int(rng.choice([4, 8, 16, 32]))
        c, k = (int(rng.choice(channels)) for _ in range(2))
        n = int(rng.integers(1, 4))
        p = (hw + 2 * pad - r) // stride + 1
        while n > 1 and n * p * p * k * c * r * r > MAX_MACS:
            n -= 1
        if n * p * p * k * c * r * r <= MAX_MACS:
            cases.append((n, hw, c, k, r, pad, stride))
    return cases


CASES = fuzz_cases()


def case_id(case):
    n, hw, c, k, r, pad, stride = case
    return f"n{n}-{hw}px-c{c}-k{k}-{r}x{r}-s{stride}"


def problem(rng, case, residual):
    """Inputs whose outputs spread over the int8 range: some saturate, some land at 0 / -127."""
    n, hw, c, k, r, pad, stride = case
    p = (hw + 2 * pad - r) // stride + 1
    x = rng.integers(-127, 128, (n, hw, hw, c)).astype(np.int8)
    w = rng.integers(-127, 128, (k, r, r, c)).astype(np.int8)
    spread = np.sqrt(c * r * r) * np.mean(np.abs(x.astype(np.float64))) * np.mean(np.abs(w.astype(np.float64)))
    alpha = (127.0 / 2 / spread * rng.uniform(0.5, 1.5, k)).astype(np.float32)
    bias = rng.uniform(-12.7, 12.7, k).astype(np.float32)
    z = rng.integers(-127, 128, (n, p, p, k)).astype(np.int8) if residual else None
    beta = float(np.float32(rng.uniform(0.25, 0.75))) if residual else 0.0
    return dict(x=x, w=w, alpha=alpha, bias=bias, pad=pad, stride=stride, residual=z, beta=beta)


def exact_sums(a):
    """The int32 accumulator, exactly (float64 holds these sums exactly), through the reference convolution."""
    spec = ConvSpec(stride=a["stride"], padding=a["pad"], layout="NHWC", precision="fp32", engine="graph")
    return reference.conv.conv2d(a["x"].astype(np.float64), a["w"].astype(np.float64), spec)


def fma32(a, b, c):
    """fl32(a * b + c) with one rounding, for float32 arrays: a * b is exact in float64, TwoSum gives the float64
    sum's error, and a sum exactly halfway between two float32 values is nudged towards its error before the
    final rounding (the only case where rounding through float64 differs from rounding once)."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = np.broadcast_to(c.astype(np.float64), p.shape)
    s = p + c
    bv = s - p
    err = (p - (s - bv)) + (c - bv)
    nudged = np.where(err != 0, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return nudged.astype(np.float32)


def emulate(acc, a, relu):
    """The kernel's arithmetic in fp32 (module doc): what the GPU must write, bit for bit; and the fp32 values t
    (alpha * a + bias) and v' (before the clamp)."""
    t = fma32(a["alpha"], acc.astype(np.int64).astype(np.float32), a["bias"])
    v = t
    if a["residual"] is not None:
        v = fma32(np.full(t.shape, a["beta"], np.float32), a["residual"].astype(np.float32), t)
    y = np.rint(np.clip(v, np.float32(0 if relu else -127), np.float32(127))).astype(np.int8)
    return y, t, v


class Expected:
    """What one problem's output must be: the fp32 model, the float64 reference, and where they may differ."""

    def __init__(self, a, relu):
        acc = exact_sums(a)
        self.want64 = own_conv.conv2d_s8(a["x"], a["w"], alpha=a["alpha"], bias=a["bias"], pad=a["pad"],
                                         stride=a["stride"], residual=a["residual"], beta=a["beta"], relu=relu)
        self.model, t, v32 = emulate(acc, a, relu)
        v = acc * a["alpha"].astype(np.float64) + a["bias"].astype(np.float64)
        if a["residual"] is not None:
            v = v + a["beta"] * a["residual"].astype(np.float64)
        conversion = np.abs(a["alpha"].astype(np.float64) * (acc.astype(np.float32).astype(np.float64) - acc))
        # e of the module doc (t counted again without a residual: v' is t then), a hair above for float64's own
        # rounding of v.
        error = 2.0**-24 * (np.abs(t.astype(np.float64)) + np.abs(v32.astype(np.float64))) + conversion
        self.near_tie = np.abs(np.abs(v - np.floor(v)) - 0.5) <= error * 1.001 + 1e-9
        self.low = 0 if relu else -127

    def check(self, got, what, data=True):
        mismatch = np.flatnonzero(got != self.model)
        assert mismatch.size == 0, (f"{what}: {mismatch.size} of {got.size} outputs differ from the fp32 model, "
                                    f"e.g. got {got.ravel()[mismatch[:5]]}, model {self.model.ravel()[mismatch[:5]]}")
        # Against float64: one code at most, and only within the derived error of a rounding boundary.
        diff = np.abs(got.astype(np.int32) - self.want64.astype(np.int32))
        assert diff.max() <= 1, f"{what}: {diff.max()} codes off the float64 reference"
        assert np.all(self.near_tie[diff != 0]), f"{what}: an output one code off is not within e of a tie"
        if data and got.size >= 512:  # the data exercise the range: the clamp's ends and most values between
            want, low = self.want64, self.low
            assert (want == 127).any() and (want == low).any(), f"{what}: degenerate data"
            assert np.count_nonzero((want > low) & (want < 127)) > want.size // 4, f"{what}: degenerate data"


def run_gpu(a, relu, kernel, poison):
    """The kernel's output, out filled with `poison` first."""
    n, hw, _, c = a["x"].shape
    k, r, _, _ = a["w"].shape
    p = (hw + 2 * a["pad"] - r) // a["stride"] + 1
    out = cp.full((n, p, p, k), poison, cp.int8)
    residual = None if a["residual"] is None else cp.asarray(a["residual"])
    got = own_conv.conv2d_s8(cp.asarray(a["x"]), cp.asarray(a["w"]), out, alpha=cp.asarray(a["alpha"]),
                             bias=cp.asarray(a["bias"]), pad=a["pad"], stride=a["stride"], residual=residual,
                             beta=a["beta"], relu=relu, kernel=kernel)
    assert got is out
    return out.get()


@needs_kernels
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_every_kernel_matches_the_quantised_arithmetic_on_fuzzed_shapes(rng, case, residual):
    index = CASES.index(case)
    relu = index % 3 != 0 if residual else index % 2 == 0
    a = problem(rng, case, residual)
    expected = Expected(a, relu)
    shapes = dict(pad=a["pad"], stride=a["stride"], residual=residual)
    names = [k["name"] for k in own_conv.kernels() if k["residual"] == residual
             and own_conv.supports(a["x"].shape, a["w"].shape, **shapes, kernel=k["name"])]
    chosen = own_conv.select(a["x"].shape, a["w"].shape, pad=a["pad"], stride=a["stride"], residual=residual)
    assert chosen in names
    results = {}
    for kernel in [*names, "auto"]:
        first, second = run_gpu(a, relu, kernel, 99), run_gpu(a, relu, kernel, -99)
        assert np.array_equal(first, second), f"{kernel}: outputs left unwritten (they kept the poison)"
        expected.check(first, f"{kernel} {case_id(case)} relu={relu}")
        results[kernel] = first
    assert np.array_equal(results["auto"], results[chosen])


@needs_kernels
@pytest.mark.parametrize("relu", [True, False])
def test_without_a_relu_the_output_keeps_the_symmetric_range(rng, relu):
    """Large negative values clamp at -127 (quantization.int8's range), not CUTLASS's -128."""
    a = problem(rng, (2, 8, 32, 32, 3, 1, 1), residual=False)  # (n, hw, c, k, r, pad, stride)
    a["bias"] = np.full_like(a["bias"], -100.0)
    got = run_gpu(a, relu, "auto", 55)
    assert got.min() == (0 if relu else -127)
    Expected(a, relu).check(got, f"relu={relu}", data=False)


@needs_kernels
@pytest.mark.parametrize("residual", [False, True])
def test_a_captured_convolution_replays_to_the_reference_after_its_inputs_change(rng, residual):
    case = (2, 16, 64, 128, 3, 1, 2)
    a = problem(rng, case, residual)
    dev = {name: cp.asarray(a[name]) for name in ("x", "w", "alpha", "bias")}
    dev["residual"] = None if a["residual"] is None else cp.asarray(a["residual"])
    out = cp.full((2, 8, 8, 128), 99, cp.int8)
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()

    def forward():
        return own_conv.conv2d_s8(dev["x"], dev["w"], out, alpha=dev["alpha"], bias=dev["bias"], pad=1, stride=2,
                                  residual=dev["residual"], beta=a["beta"], relu=True)

    with stream:
        forward()  # eagerly first, as every capture does
    captured = cuda_graph.capture_graph(forward, stream, pool)
    assert captured.allocated_bytes == 0
    fresh = problem(rng, case, residual)
    for name in ("w", "alpha", "bias", "beta"):  # the captured parameters: only x (and the residual) change
        fresh[name] = a[name]
    with stream:  # every write on the graph's stream (a pageable set() may still be copying when it returns)
        cp.copyto(dev["x"], cp.asarray(fresh["x"]))
        if residual:
            cp.copyto(dev["residual"], cp.asarray(fresh["residual"]))
        out.fill(-99)
    cuda_graph.launch_ordered(captured.graph, stream)
    stream.synchronize()
    Expected(fresh, True).check(out.get(), "replay")


@needs_kernels
def test_a_layer_on_another_stream_and_a_misaligned_view_are_handled(rng):
    a = problem(rng, (1, 8, 16, 16, 1, 0, 1), residual=False)
    buffer = cp.zeros(a["x"].size + 16, cp.int8)
    x = buffer[8:8 + a["x"].size].reshape(a["x"].shape)  # a view 8 bytes past an aligned allocation
    x.set(a["x"])
    with pytest.raises(ValueError, match="x: expected an address aligned to 16 bytes"):
        own_conv.conv2d_s8(x, cp.asarray(a["w"]), alpha=cp.asarray(a["alpha"]), bias=cp.asarray(a["bias"]), pad=0,
                           stride=1)
    with cp.cuda.Stream(non_blocking=True) as stream:
        got = own_conv.conv2d_s8(cp.asarray(a["x"]), cp.asarray(a["w"]), alpha=cp.asarray(a["alpha"]),
                                 bias=cp.asarray(a["bias"]), pad=0, stride=1)
        stream.synchronize()
    Expected(a, True).check(got.get(), "allocated out, side stream", data=False)
