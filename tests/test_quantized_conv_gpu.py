"""The int8 / FP8 forward convolution on the GPU against its float64 reference, and the quantised engine against
the host simulation of the same calibration.

Tolerances, derived: an int8 convolution sums its products exactly (int32), so the GPU and the reference differ
only in the fp32 epilogue (alpha * acc + beta + gamma * z, |v| <= ~130 here: an error of a few 1e-5), which moves
a value across a rounding boundary (.5) only when it lies within that error of one: at most one code, on a few in
10^4 elements. A float output (fp16) differs by that fp32 error plus its own rounding: 1e-3 norm-wise. FP8 inputs
are exact in fp32, but Hopper's FP8 tensor cores keep partial sums in fewer bits than fp32 (about 2^-12 relative
per addition over C*R*S terms, relative to the partial sums), so FP8 results are held to two E4M3 steps plus 0.5
(an output near zero carries the partial sums' error) elementwise, 0.04 norm-wise, and 1e-2 norm-wise for a float
output (on the H200 the elements beyond two steps were all near zero).
"""

import numpy as np
import pytest
from test_inference_plan_cpu import randomized_state

import resnet_native as rn
from resnet_native.data.tta_views import tta_views, view_images
from resnet_native.ops import quantized_conv
from resnet_native.ops.conv import ConvSpec
from resnet_native.quantization.fp8 import decode_e4m3, encode_e4m3

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

# (N, H, W, C), K, kernel, stride, padding: a stem (padded to 16 channels), a 3x3 block conv, a strided 1x1
# projection, a bottleneck's 1x1 expansion.
SHAPES = [((4, 16, 16, 16), 64, 3, 1, 1), ((4, 8, 8, 64), 64, 3, 1, 1), ((4, 8, 8, 64), 128, 1, 2, 0),
          ((2, 8, 8, 64), 256, 1, 1, 0)]
OUT_DTYPES = {"int8": np.int8, "fp8": np.uint8, "fp16": np.float16}
POISON = {"int8": 99, "fp8": 0x7F, "fp16": np.nan}


def _codes(rng, shape, precision):
    if precision == "int8":
        return rng.integers(-127, 128, shape).astype(np.int8)
    return encode_e4m3(rng.standard_normal(shape) * 2.0)


def _values(codes, precision):
    return codes.astype(np.float64) if precision == "int8" else decode_e4m3(codes)


def _problem(rng, precision, shape, k, kernel, stride, padding, residual):
    n, h, w, c = shape
    x = _codes(rng, shape, precision)
    wq = _codes(rng, (k, kernel, kernel, c), precision)
    spec = ConvSpec(stride=stride, padding=padding, layout="NHWC", precision=precision, engine="graph", algo="find")
    p = (h + 2 * padding - kernel) // stride + 1
    # alpha sized so that v = alpha * acc lands mostly within the 8-bit range: |acc| ~ sqrt(C R S) * E|x| E|w|
    spread = np.sqrt(c * kernel * kernel) * np.mean(np.abs(_values(x, precision))) * np.mean(
        np.abs(_values(wq, precision)))
    qmax = 127.0 if precision == "int8" else 448.0
    alpha = (qmax / 3 / spread * rng.uniform(0.5, 1.5, k)).astype(np.float32)
    beta = rng.uniform(-qmax / 10, qmax / 10, k).astype(np.float32)
    z = _codes(rng, (n, p, p, k), precision) if residual else None
    return x, wq, spec, alpha, beta, z


def _run(x, wq, spec, alpha, beta, z, gamma, relu, out_name):
    host_out = np.empty((x.shape[0], *_out_hw(x, wq, spec), wq.shape[0]), OUT_DTYPES[out_name])
    want = quantized_conv.reference_conv2d(x, wq, spec, alpha, bias=beta, z=z, gamma=gamma, relu=relu, out=host_out)
    out = cp.full(host_out.shape, POISON[out_name], host_out.dtype)
    got = quantized_conv.conv2d(cp.asarray(x), cp.asarray(wq), spec, cp.asarray(alpha), bias=cp.asarray(beta),
                                z=None if z is None else cp.asarray(z), gamma=gamma, relu=relu, out=out)
    assert got is out
    return out.get(), want


def _out_hw(x, wq, spec):
    (_, h, w, _), r = x.shape, wq.shape[1]
    return tuple((d + 2 * spec.padding[0] - r) // spec.stride[0] + 1 for d in (h, w))


@pytest.mark.parametrize("precision", ["int8", "fp8"])
@pytest.mark.parametrize("shape,k,kernel,stride,padding", SHAPES)
@pytest.mark.parametrize("relu,residual", [(True, False), (False, False)])
@pytest.mark.parametrize("out_kind", ["8bit", "fp16"])
def test_a_quantized_convolution_matches_its_float64_reference(rng, precision, shape, k, kernel, stride, padding,
                                                               relu, residual, out_kind):
    x, wq, spec, alpha, beta, z = _problem(rng, precision, shape, k, kernel, stride, padding, residual)
    out_name = precision if out_kind == "8bit" else "fp16"
    got, want = _run(x, wq, spec, alpha, beta, z, 0.75, relu, out_name)
    if out_name == "int8":
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1, f"largest difference {diff.max()} codes"
        assert np.count_nonzero(diff) <= max(2, diff.size // 1000), f"{np.count_nonzero(diff)} of {diff.size} off"
        assert np.count_nonzero(want) > diff.size // 10, "degenerate test data: the reference is mostly zero"
    elif out_name == "fp8":
        # Two E4M3 steps elementwise (the reduced-precision FP8 accumulation can move a value across a rounding
        # boundary and the conversion to the next code), and the rounding error's size norm-wise.
        g, w_ = decode_e4m3(got), decode_e4m3(want)
        assert np.isfinite(g).all(), "NaN codes: the output was not written everywhere"
        # The absolute term: the accumulation's error is relative to the partial sums (up to the output range,
        # 448, times ~2^-12), so an output near zero may be off by ~0.1.
        far = np.abs(g - w_) > 0.25 * np.abs(w_) + 0.5
        worst = np.argsort(-np.abs(g - w_).ravel())[:6]
        assert not far.any(), (f"{np.count_nonzero(far)} of {far.size} elements over two E4M3 steps; worst (got, "
                               f"want): {list(zip(g.ravel()[worst], w_.ravel()[worst], strict=True))}; norm-wise "
                               f"{np.linalg.norm(g - w_) / np.linalg.norm(w_):.4f}")
        assert np.linalg.norm(g - w_) / np.linalg.norm(w_) <= 0.04
    else:
        g, w_ = got.astype(np.float64), want.astype(np.float64)
        assert np.isfinite(g).all(), "NaN: the output was not written everywhere"
        err = np.linalg.norm(g - w_) / np.linalg.norm(w_)
        assert err <= (1e-3 if precision == "int8" else 1e-2), err


@pytest.mark.parametrize("precision", ["int8", "fp8"])
@pytest.mark.parametrize("out_name", ["8bit", "fp32"])
def test_the_residual_requantization_matches_its_reference(rng, precision, out_name):
    """The residual add of the quantised engine: fp32 arithmetic on the GPU against float64, so a value within
    float rounding of a .5 boundary may land one code off (int8), one E4M3 step off (fp8)."""
    shape = (4, 8, 8, 256)
    v = (rng.standard_normal(shape) * 3).astype(np.float16)
    z = _codes(rng, shape, precision)
    s_z, s_y = (0.03, 0.05) if precision == "int8" else (0.5, 0.02)
    dtype = np.float32 if out_name == "fp32" else OUT_DTYPES[precision]
    inv = 1.0 if out_name == "fp32" else 1.0 / s_y
    want = quantized_conv.residual_requantize(v, z, precision, s_z=s_z, inv_s_y=inv, relu=True,
                                              out=np.empty(shape, dtype))
    out = cp.full(shape, 99, dtype)
    quantized_conv.residual_requantize(cp.asarray(v), cp.asarray(z), precision, s_z=s_z, inv_s_y=inv, relu=True,
                                       out=out)
    got = out.get()
    if out_name == "fp32":
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    elif precision == "int8":
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and np.count_nonzero(diff) <= diff.size // 1000
        assert np.count_nonzero(want) > diff.size // 4
    else:
        g, w_ = decode_e4m3(got), decode_e4m3(want)
        assert np.all(np.abs(g - w_) <= 0.125 * np.abs(w_) + 2.0**-9)
        assert np.count_nonzero(g != w_) <= g.size // 1000


def test_bad_quantized_arguments_raise_clearly():
    spec = ConvSpec(layout="NHWC", precision="int8", engine="graph")
    x, w = cp.zeros((1, 4, 4, 16), cp.int8), cp.zeros((8, 1, 1, 16), cp.int8)
    scale, out = cp.ones(8, cp.float32), cp.zeros((1, 4, 4, 8), cp.int8)
    with pytest.raises(TypeError, match="x: expected an int8"):
        quantized_conv.conv2d(x.astype(cp.float16), w, spec, scale, out=out)
    with pytest.raises(ValueError, match="scale: expected shape"):
        quantized_conv.conv2d(x, w, spec, cp.ones(7, cp.float32), out=out)
    with pytest.raises(TypeError, match="out: expected one of"):
        quantized_conv.conv2d(x, w, spec, scale, out=out.astype(cp.uint8))
    with pytest.raises(ValueError, match="out: required"):
        quantized_conv.conv2d(x, w, spec, scale)
    with pytest.raises(ValueError, match="precision 'int8' is for quantised"):
        rn.conv.conv2d(x, w, spec)
    with pytest.raises(ValueError, match="engine='graph'"):
        ConvSpec(layout="NHWC", precision="fp8", engine="legacy")


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_the_quantized_engine_matches_the_host_simulation(rng, dtype):
    """Same calibration, same arithmetic: the engine's logits are the float64 simulation's up to the epilogue's
    fp32 rounding (an occasional code one step off, carried through the network), and the fp16 engine's within
    the quantisation error."""
    from resnet_native.inference import InferenceEngine
    from resnet_native.inference.simulate import calibrate, simulate_logits

    model = rn.ResNet(18, 10, layout="NHWC", precision="fp16", seed=0)
    model.load_state_dict(randomized_state(model, rng))
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    pixels = rng.integers(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    from resnet_native.data.augment import normalize_on_host

    images = normalize_on_host(pixels, layout="NCHW", dtype="fp32").astype(np.float64)
    calibration = calibrate(state, images, "max", dtype=dtype)
    want = simulate_logits(state, images, calibration)
    with InferenceEngine(model, batch_sizes=(4,), precision=dtype, calibration=calibration) as engine:
        got = engine(cp.asarray(pixels)).get().astype(np.float64)
        again = engine(cp.asarray(pixels)).get()
    assert np.array_equal(got, again), "replays of one input differ"
    # The residual steps' dequantised fp16 intermediate (2^-11 relative) moves some codes by one against the
    # exact simulation; those are quantisation-sized errors, carried through 8 blocks.
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"{dtype}: engine vs simulation {err:.4f}")
    assert err <= (5e-2 if dtype == "int8" else 1e-1), err
    with InferenceEngine(model, batch_sizes=(4,), precision="fp16") as fp16:
        ref = fp16(cp.asarray(pixels)).get().astype(np.float64)
    vs_fp16 = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"{dtype}: engine vs fp16 engine {vs_fp16:.4f}")
    assert vs_fp16 <= 0.25


def _prefix_problem(rng):
    from resnet_native.data.augment import normalize_on_host
    from resnet_native.inference.simulate import calibrate

    model = rn.ResNet(18, 10, layout="NHWC", precision="fp16", seed=0)
    model.load_state_dict(randomized_state(model, rng))
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    pixels = rng.integers(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    images = normalize_on_host(pixels, layout="NCHW", dtype="fp32").astype(np.float64)
    return model, state, pixels, images, calibrate(state, images, "max", dtype="int8")


@pytest.mark.parametrize("quantize_from", ["layer1", "layer2", "layer3", "layer4"])
def test_a_float_prefix_engine_matches_the_simulation_of_that_prefix(rng, quantize_from):
    """The fp16 prefix (2^-11 relative per value against the simulation's float64) moves a few boundary codes by
    one, as the residual steps' fp16 scratch does: held to the bound of quantize_from='stem' above."""
    from resnet_native.inference import InferenceEngine
    from resnet_native.inference.simulate import simulate_logits

    model, state, pixels, images, calibration = _prefix_problem(rng)
    want = simulate_logits(state, images, calibration, quantize_from=quantize_from)
    with InferenceEngine(model, batch_sizes=(4,), precision="int8", calibration=calibration,
                         quantize_from=quantize_from) as engine:
        assert engine.quantize_from == quantize_from and engine.quantize_from_times == {}
        assert [s.kind for s in engine.plan.steps].count("quantize") == 1
        got = engine(cp.asarray(pixels)).get().astype(np.float64)
        again = engine(cp.asarray(pixels)).get()
    assert np.array_equal(got, again), "replays of one input differ"
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"int8 from {quantize_from}: engine vs simulation {err:.4f}")
    assert err <= 5e-2, err


def test_auto_keeps_the_fastest_candidate_of_each_batch_size_and_records_every_time(rng):
    from resnet_native.inference import InferenceEngine
    from resnet_native.inference.simulate import float_logits, simulate_logits
    from resnet_native.quantization.prefix import FLOAT, QUANTIZE_FROM

    model, state, pixels, images, calibration = _prefix_problem(rng)
    with InferenceEngine(model, batch_sizes=(1, 4), precision="int8", calibration=calibration,
                         quantize_from="auto") as engine:
        print(engine)
        assert set(engine.quantize_from_times) == {1, 4}
        for batch, times in engine.quantize_from_times.items():
            assert set(times) == set(QUANTIZE_FROM) | {FLOAT} and all(ms > 0 for ms in times.values())
            assert engine.quantize_from_by_batch[batch] == min(times, key=times.get)
        assert engine.quantize_from == engine.quantize_from_by_batch[4] and "auto, timed" in repr(engine)
        got = engine(cp.asarray(pixels)).get().astype(np.float64)
    chosen = engine.quantize_from
    want = (float_logits(state, images) if chosen == FLOAT else
            simulate_logits(state, images, calibration, quantize_from=chosen))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 5e-2


def test_auto_serves_each_batch_size_from_its_own_choice(rng, tmp_path):
    """Timings made up so that batch size 1 keeps 'float' (the fp16 plan) and 4 keeps 'stem': a batch of 5 runs
    as a chunk of 4 on the 8-bit plan and one of 1 on the float plan, each as that plan alone computes it; float
    inputs, which the 'stem' plan does not take, are refused at every batch size; flip TTA averages each plan's
    own mirror, flip-shift each plan's own shifted views (the TTA engines take the first's choices, kernels and
    algorithms from the cache file, so all run the same kernels)."""
    import resnet_native.inference.engine as engine_module
    from resnet_native.inference import InferenceEngine
    from resnet_native.inference.simulate import simulate_logits
    from resnet_native.quantization.prefix import FLOAT

    model, state, pixels, images, calibration = _prefix_problem(rng)
    five = cp.asarray(np.concatenate([pixels, pixels[:1, ::-1]]))

    def made_up_ms(forward, pool, cuda_graph):  # fast: the float plan at batch 1, an 8-bit one at batch 4
        return 0.5 if (forward.batch == 1) == (not forward.quantized_calls) else 1.0

    kwargs = dict(batch_sizes=(1, 4), precision="int8", calibration=calibration, quantize_from="auto",
                  deterministic=True, algorithm_cache=tmp_path / "algos.json")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_module, "forward_ms", made_up_ms)
        engine = InferenceEngine(model, **kwargs)
        flipped = InferenceEngine(model, tta="flip", **kwargs)
        shifted = InferenceEngine(model, tta="flip-shift", **kwargs)
    with engine, flipped, shifted, InferenceEngine(model, batch_sizes=(1,), precision="fp16") as fp16:
        print(engine)
        assert engine.quantize_from_by_batch == {1: FLOAT, 4: "stem"} and engine.quantize_from == "stem"
        assert "'float'" in repr(engine)
        got = engine(five).get().astype(np.float64)
        assert np.array_equal(got[:4], engine(five[:4]).get()) and np.array_equal(got[4:], engine(five[4:]).get())
        want_fp16 = fp16(five[4:]).get().astype(np.float64)
        assert np.linalg.norm(got[4:] - want_fp16) / np.linalg.norm(want_fp16) <= 1e-3
        want = simulate_logits(state, images, calibration, quantize_from="stem")
        assert np.linalg.norm(got[:4] - want) / np.linalg.norm(want) <= 5e-2
        normalized = cp.zeros((4, 32, 32, 3), cp.float16)
        for batch in (normalized, normalized[:1]):  # the float plan would take the second: the engine does not
            with pytest.raises(TypeError, match="x: the int8 engine takes uint8"):
                engine(batch)
        assert flipped.quantize_from_source == "cache" and flipped.quantize_from_by_batch == {1: FLOAT, 4: "stem"}
        both = (engine(five) + engine(five[:, :, ::-1].copy())) * np.float32(0.5)
        cp.testing.assert_allclose(flipped(five), both, rtol=1e-6, atol=1e-6 * float(cp.abs(both).max()))
        # The shifted views' black pixels are the input stage's codes of a black pixel, in either plan.
        views = tta_views("flip-shift")
        weighted = sum(engine(cp.asarray(view_images(cp.asnumpy(five), v))) * np.float32(v.weight) for v in views)
        cp.testing.assert_allclose(shifted(five), weighted, rtol=1e-6, atol=1e-6 * float(cp.abs(weighted).max()))


def test_auto_reuses_the_choice_stored_in_the_algorithm_cache(rng, tmp_path):
    """A second engine of the same problem with the same cache file takes the stored choice and times nothing
    (forward_ms would fail), and computes what the first did: same plan, same algorithms from the cache. An engine
    of another problem (cuda_graph=False) in the same file times again and keeps the first's choice."""
    import resnet_native.inference.engine as engine_module
    from resnet_native.inference import InferenceEngine, choice_cache

    model, _, pixels, _, calibration = _prefix_problem(rng)
    path = tmp_path / "algos.json"
    kwargs = dict(dtype="int8", calibration=calibration, quantize_from="auto", algorithm_cache=path)
    with InferenceEngine(model, batch_sizes=(1, 4), **kwargs) as first:
        assert first.quantize_from_source == "timed" and "auto, timed" in repr(first)
        chosen, times = dict(first.quantize_from_by_batch), dict(first.quantize_from_times)
        want = first(cp.asarray(pixels)).get().astype(np.float64)
    def prefix_choices():  # the file holds the convolutions' kernel choices too
        return {k: v for k, v in choice_cache.load_choices(path).items() if k.startswith(choice_cache.KIND)}

    stored = prefix_choices()
    assert len(stored) == 2  # one per batch size
    for batch in (1, 4):
        (key,) = (k for k in stored if f" dtype=int8 batch={batch} cuda_graph=1 " in k)
        assert stored[key] == {"quantize_from": chosen[batch], "times_ms": times[batch]}

    def no_timing(*args, **kwargs):
        raise AssertionError("InferenceEngine: a stored 'auto' choice was timed again")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_module, "forward_ms", no_timing)
        with InferenceEngine(model, batch_sizes=(1, 4), **kwargs) as second:
            print(second)
            assert second.quantize_from_source == "cache" and "auto, cache" in repr(second)
            assert second.quantize_from_by_batch == chosen and second.quantize_from_times == times
            got = second(cp.asarray(pixels)).get().astype(np.float64)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"auto from the cache vs timed: {err:.2e}")
    assert err <= 1e-3, err
    with InferenceEngine(model, batch_sizes=(4,), cuda_graph=False, **kwargs) as eager:
        assert eager.quantize_from_source == "timed"
    choices = prefix_choices()
    assert len(choices) == 3 and all(choices[k] == v for k, v in stored.items())


def _own_kernels_or_skip():
    from resnet_native.ops import own_conv

    if not own_conv.available():
        pytest.skip(f"the package's own kernels cannot run here: {own_conv.unavailable_reason()}")


@pytest.mark.parametrize("kernels", ["own", "cudnn", "auto"])
def test_every_kernel_choice_computes_the_simulated_network(rng, kernels):
    """'own': every int8-out convolution on an own kernel, whose epilogue rounds once from fp32 (no fp16
    intermediate), so it is nearer the simulation than cuDNN's path; 'cudnn': none; 'auto': what was timed."""
    from resnet_native.inference import InferenceEngine
    from resnet_native.inference.simulate import simulate_logits

    if kernels != "cudnn":
        _own_kernels_or_skip()
    model, state, pixels, images, calibration = _prefix_problem(rng)
    want = simulate_logits(state, images, calibration)
    with InferenceEngine(model, batch_sizes=(1, 4), precision="int8", calibration=calibration,
                         quantized_kernels=kernels) as engine:
        print(engine)
        chosen = engine.kernel_choice.kernels
        got = engine(cp.asarray(pixels)).get().astype(np.float64)
        again = engine(cp.asarray(pixels)).get()
    assert np.array_equal(got, again), "replays of one input differ"
    assert len(chosen) == 2 * 20  # 20 quantised convolutions (all but the classifier), 2 batch sizes
    own = {step for (step, _), kernel in chosen.items() if kernel.startswith("own:")}
    if kernels == "own":
        assert own == {s for s, _ in chosen} - {"layer4.1.conv2"}  # its output is the pool's fp32 input
    elif kernels == "cudnn":
        assert not own
    else:
        for (step, batch), kernel in chosen.items():
            times = engine.kernel_choice.times.get((step, batch))
            assert (times is None) == (step == "layer4.1.conv2"), step
            assert times is None or (kernel == min(times, key=times.get) and "cudnn" in times and len(times) > 1)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"int8 kernels={kernels!r} ({len(own)} steps own): engine vs simulation {err:.2e}")
    assert err <= (1e-2 if kernels == "own" else 5e-2), err


def test_resnet50_on_the_persistent_kernels_computes_the_simulated_network(rng):
    """ResNet-50 with 'own' kernels, every convolution but the last on a persistent one (the 1x1 GEMMs where their
    tiles fit, the persistent convolutions elsewhere): the whole network against the host simulation. Each kernel is
    bit-exact against the fp32 model (test_own_conv_gpu); the network differs from float64 by the codes that fp32
    rounds across a tie, each layer adding its own: ResNet-18's 'own' bound scaled by the quantised convolutions,
    53 here against its 20."""
    from resnet_native.data.augment import normalize_on_host
    from resnet_native.inference import InferenceEngine
    from resnet_native.inference.simulate import calibrate, simulate_logits
    from resnet_native.ops import own_conv

    _own_kernels_or_skip()
    model = rn.ResNet(50, 10, layout="NHWC", precision="fp16", seed=0)
    model.load_state_dict(randomized_state(model, rng))
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    pixels = rng.integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    images = normalize_on_host(pixels, layout="NCHW", dtype="fp32").astype(np.float64)
    calibration = calibrate(state, images, "max", dtype="int8")
    want = simulate_logits(state, images, calibration, batch_size=2)
    with InferenceEngine(model, batch_sizes=(2,), precision="int8", calibration=calibration,
                         quantized_kernels="own") as engine:
        kernels = {step: kernel[4:] for (step, _), kernel in engine.kernel_choice.kernels.items()}
        got = engine(cp.asarray(pixels)).get().astype(np.float64)
    persistent = {k["name"] for k in own_conv.kernels() if k["persistent"]}
    on_gemm = [s for s, k in kernels.items() if k.startswith("s8_1x1_")]
    # 53 convolutions, less the last conv3 (fp32 out, cuDNN); the GEMMs take stride-1 1x1 layers only.
    assert len([s for s, k in kernels.items() if k in persistent]) == 52, kernels
    assert on_gemm and all(s.endswith(("conv1", "conv3", "downsample.0")) and s != "conv1" for s in on_gemm), on_gemm
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"ResNet-50 int8 'own' ({len(on_gemm)} convolutions on the 1x1 GEMMs): engine vs simulation {err:.2e}")
    assert err <= 1e-2 * 53 / 20, err


def test_kernel_choices_are_timed_once_and_kept_in_the_cache_file(rng, tmp_path):
    """A second engine with the same cache file runs every stored kernel choice without timing (device_ms would
    fail) and computes bit for bit what the first did."""
    import resnet_native.inference.kernel_choice as kernel_choice
    from resnet_native.inference import InferenceEngine, choice_cache

    _own_kernels_or_skip()
    model, _, pixels, _, calibration = _prefix_problem(rng)
    path = tmp_path / "algos.json"
    kwargs = dict(precision="int8", calibration=calibration, algorithm_cache=path)
    with InferenceEngine(model, batch_sizes=(1, 4), **kwargs) as first:
        timed = dict(first.kernel_choice.timed)
        kernels = dict(first.kernel_choice.kernels)
        assert set(first.kernel_choice.sources.values()) == {"timed"}
        want = first(cp.asarray(pixels)).get()
    stored = {k: v for k, v in choice_cache.load_choices(path).items() if k.startswith(choice_cache.KERNEL_KIND)}
    assert stored == {k: {"kernel": kernel, "times_ms": times} for k, (kernel, times) in timed.items()}

    def no_timing(*args, **kwargs):
        raise AssertionError("InferenceEngine: a stored kernel choice was timed again")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_choice, "device_ms", no_timing)
        with InferenceEngine(model, batch_sizes=(1, 4), **kwargs) as second:
            assert second.kernel_choice.kernels == kernels and not second.kernel_choice.timed
            assert set(second.kernel_choice.sources.values()) == {"cache"}
            got = second(cp.asarray(pixels)).get()
    assert np.array_equal(got, want)
