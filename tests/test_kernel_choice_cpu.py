"""The int8 engine's per-layer kernel choice without a GPU: the whole quantised forward bound on host arrays runs the
own kernels' float64 reference (ops.own_conv) with the operands quantized.py makes for them and agrees with the
simulation at least as well as cuDNN's path does; KernelChooser's modes on stand-in calls (what is timed, what is
kept, what is reused); the choices' keys in the algorithm cache file. The engine on the GPU is
test_quantized_conv_gpu.py's."""

import numpy as np
import pytest
from quant_helpers import tiny_resnet18_state
from test_choice_cache_cpu import read
from test_conv_cache_cpu import insert_samples

from resnet_native.data.augment import normalize_on_host
from resnet_native.inference import choice_cache as cc
from resnet_native.inference.buffers import plan_buffers
from resnet_native.inference.fold import conv_step_params
from resnet_native.inference.kernel_choice import KernelChooser
from resnet_native.inference.plan import build_plan
from resnet_native.inference.quantized import INPUT_CHANNELS, quantized_convs, quantized_plan, residual_scratch_elements
from resnet_native.inference.runner import CUDNN_KERNEL, OWN_PREFIX, bind_forward
from resnet_native.inference.simulate import calibrate, simulate_logits
from resnet_native.ops import conv
from resnet_native.quantization import quantize_int8


def _host_int8_forward(state, calibration, batch):
    """The 'stem' int8 engine's forward over host buffers (the storage dtypes), as binding.Binder binds it."""
    base = build_plan(state, "cifar", "fp32", 32)
    plan = quantized_plan(base, "int8")
    assignment = plan_buffers(plan)
    arena = [np.zeros(size * batch, np.uint8) for size in assignment.sizes]

    def view(v, n):
        value = plan.values[v]
        c, h, w = value.shape
        flat = arena[assignment.buffer_of[v]][: n * value.bytes_per_sample]
        return flat.view({"int8": np.int8, "fp32": np.float32}[value.dtype]).reshape(n, h, w, c)

    convs = quantized_convs(base, state, calibration, "int8", np.asarray)
    fc = plan.conv_steps()[-1]
    weights = {fc.name: tuple(a.astype(np.float32) for a in conv_step_params(fc, state, "NHWC"))}
    specs = {s.name: conv.ConvSpec(stride=s.stride, padding=s.padding, layout="NHWC",
                                   precision="int8" if s.name in convs else "fp32", engine="graph")
             for s in plan.conv_steps()}
    scratch = np.zeros(residual_scratch_elements(base) * batch, np.float16)
    return plan, convs, bind_forward(plan, batch, view, weights, specs, "NHWC", convs, scratch)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(5)
    state = tiny_resnet18_state(seed=2)
    pixels = rng.integers(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    images = normalize_on_host(pixels, layout="NCHW", dtype="fp32").astype(np.float64)
    calibration = calibrate(state, images, "max", dtype="int8")
    return state, images, calibration, simulate_logits(state, images, calibration)


def _logits(problem, own: bool):
    state, images, calibration, _ = problem
    plan, convs, forward = _host_int8_forward(state, calibration, len(images))
    codes = quantize_int8(images.transpose(0, 2, 3, 1), calibration.activation_scales["input"])
    forward.input[...] = np.concatenate([codes, np.zeros((*codes.shape[:3], INPUT_CHANNELS - 3), np.int8)], 3)
    switched = 0
    for name, call in forward.quantized_calls.items():
        if own and convs[name].own is not None:
            call.kernel = OWN_PREFIX + "any"  # host arrays: every own kernel is the same float64 reference
            switched += 1
    forward.run()
    return np.asarray(forward.logits, np.float64), switched


def test_the_own_kernels_operands_compute_the_simulated_network(problem):
    want = problem[3]
    cudnn, _ = _logits(problem, own=False)
    own, switched = _logits(problem, own=True)
    assert switched == 19  # the stem, 16 block convolutions, 3 downsamples: all but the last one (fp32 out)
    err = {name: np.linalg.norm(got - want) / np.linalg.norm(want) for name, got in [("cudnn", cudnn), ("own", own)]}
    print(f"host int8 forward vs simulation: {err}")
    # The own epilogue rounds once from fp32 operands (no fp16 intermediate): a code flips only where the exact
    # value lies within fp32 rounding of a half-code.
    assert err["own"] <= 1e-3 and err["own"] <= err["cudnn"] + 1e-9, err
    assert np.array_equal(np.argmax(own, 1), np.argmax(want, 1))


class FakeCall:
    """A QuantizedCall's surface for KernelChooser: what it asks and what it sets."""

    def __init__(self, own=("own:a", "own:b"), shape=(4, 8, 8, 16)):
        self._own = own
        self.spec = conv.ConvSpec(padding=1, layout="NHWC", precision="int8", engine="graph")
        self.x, self.out, self.z, self.relu = np.zeros(shape, np.int8), np.zeros(shape, np.int8), None, True
        self.q = type("Q", (), {"weight": np.zeros((16, 3, 3, shape[3]), np.int8)})()
        self.kernel, self.runs, self.asked = CUDNN_KERNEL, [], 0

    def own_kernels(self):
        self.asked += 1
        return self._own

    def __call__(self):
        self.runs.append(self.kernel)


def timer(times):
    def timed(call):
        call.runs.append(("timed", call.kernel))
        return times[call.kernel]
    return timed


def test_each_mode_picks_as_documented():
    call = FakeCall()
    assert KernelChooser("cudnn").decide("s", 4, call) == CUDNN_KERNEL and call.asked == 0
    call = FakeCall()
    assert KernelChooser("own").decide("s", 4, call) == "own:a" and call.runs == ["own:a"]
    assert call.spec.algo == "find"  # cuDNN's plan, not used, is not searched
    for mode in ("auto", "own"):  # nothing of ours can run it: cuDNN, untimed, searched as before
        call = FakeCall(own=())
        chooser = KernelChooser(mode, timer=timer({}))
        assert chooser.decide("s", 4, call) == CUDNN_KERNEL and call.spec.algo == "find" and not chooser.timed


def test_auto_times_every_candidate_once_per_problem_and_keeps_the_fastest():
    chooser = KernelChooser("auto", timer=timer({"cudnn": 0.3, "own:a": 0.2, "own:b": 0.1}))
    call = FakeCall()
    assert chooser.decide("layer1.0.conv1", 4, call) == "own:b"
    assert call.spec.algo == "heuristic"  # cuDNN's candidate: its heuristic plan, no search
    assert [r for r in call.runs if isinstance(r, tuple)] == [("timed", "cudnn"), ("timed", "own:a"),
                                                              ("timed", "own:b")]
    assert call.runs[-1] == "own:b"  # then run once on the choice
    assert chooser.times[("layer1.0.conv1", 4)] == {"cudnn": 0.3, "own:a": 0.2, "own:b": 0.1}
    assert chooser.sources[("layer1.0.conv1", 4)] == "timed"
    (key, (kernel, times)), = chooser.timed.items()
    assert key.startswith(cc.KERNEL_KIND + " x=4x8x8x16 w=16x3x3x16 pad=1x1 stride=1x1 residual=0 relu=1 out=int8 "
                          "cudnn_algo=heuristic det=0 candidates=cudnn,own:a,own:b") and kernel == "own:b"
    same = FakeCall()  # another step of the same problem: not timed again
    assert chooser.decide("layer1.1.conv1", 4, same) == "own:b" and same.runs == ["own:b"]
    bigger = FakeCall(shape=(8, 8, 8, 16))  # another batch size is another problem
    chooser.decide("layer1.0.conv1", 8, bigger)
    assert len(chooser.timed) == 2 and chooser.summary() == {"own:b": 3}
    chooser.forget_steps()
    assert chooser.kernels == {} and len(chooser.timed) == 2


def test_a_stored_choice_is_used_without_timing():
    first = KernelChooser("auto", timer=timer({"cudnn": 0.1, "own:a": 0.2, "own:b": 0.3}))
    first.decide("s", 4, FakeCall())
    (key, (kernel, times)), = first.timed.items()
    assert kernel == CUDNN_KERNEL
    stored = {key: {"kernel": kernel, "times_ms": times}}
    second = KernelChooser("auto", stored, timer=timer({}))  # any timing would raise KeyError
    call = FakeCall()
    assert second.decide("s", 4, call) == CUDNN_KERNEL and call.runs == [CUDNN_KERNEL]
    assert second.sources[("s", 4)] == "cache" and second.times[("s", 4)] == times and not second.timed
    other = FakeCall(own=("own:a",))  # another build's kernels: another key, timed
    third = KernelChooser("auto", stored, timer=timer({"cudnn": 0.5, "own:a": 0.2}))
    assert third.decide("s", 4, other) == "own:a" and third.sources[("s", 4)] == "timed"


def test_kernel_choices_round_trip_beside_the_prefix_choices(empty_cache, fake_gpu, tmp_path):
    path = tmp_path / "algos.json"
    insert_samples()
    conv.save_algorithm_cache(path)
    chooser = KernelChooser("auto", timer=timer({"cudnn": 0.25, "own:s8_128x64x64_s4": 0.125}))
    chooser.decide("s", 4, FakeCall(own=("own:s8_128x64x64_s4",)))
    assert cc.store_choices(path, chooser.timed)
    (key, (kernel, times)), = chooser.timed.items()
    assert cc.load_choices(path) == {key: {"kernel": "own:s8_128x64x64_s4", "times_ms": times}}
    assert list(read(path)[cc.SECTION][key]) == ["kernel", "times_ms"]


BAD_KERNEL_RECORDS = {
    "an unknown candidate": ("cudnn,fast", {"kernel": "cudnn", "times_ms": {"cudnn": 1.0, "fast": 1.0}}),
    "a kernel name that is no identifier": ("cudnn,own:a;b", {"kernel": "cudnn",
                                                              "times_ms": {"cudnn": 1.0, "own:a;b": 1.0}}),
    "the prefix choice's field": ("cudnn,own:a", {"quantize_from": "cudnn",
                                                  "times_ms": {"cudnn": 1.0, "own:a": 1.0}}),
}


@pytest.mark.parametrize("which", list(BAD_KERNEL_RECORDS))
def test_malformed_kernel_choices_raise_naming_the_file(empty_cache, fake_gpu, tmp_path, which):
    candidates, record = BAD_KERNEL_RECORDS[which]
    key = cc.kernel_key((1, 8, 8, 16), (16, 3, 3, 16), pad=(1, 1), stride=(1, 1), residual=False, relu=True,
                        out="int8", cudnn_algo="heuristic", deterministic=False, candidates=("cudnn", "own:a"))
    key = key.replace("candidates=cudnn,own:a", f"candidates={candidates}")
    with pytest.raises(ValueError, match=str(tmp_path)):
        cc.check_choices({key: record}, tmp_path / "algos.json")
