"""The convolution path with less per-call host work, on the GPU:

- the graph engine keeps the variant pack of a plan's last execution and reuses it while the operand and
  workspace pointers stay the same; results must match the float64 reference whether pointers change between
  calls (alternating buffers, one operand swapped) or not (same buffers, new contents), and each plan holds
  exactly one pack;
- a convolution captured into a CUDA graph replays to the reference, for both engines, every direction and the
  fused forward epilogue, also after its inputs' contents change (nothing in an op may allocate, synchronise or
  search during capture); a search that would run during capture is refused with a clear error;
- cupy arrays that the direct-read path of tensor_arg does not take (wrong dtype, strides, rank, empty) get the
  same errors as the general parser gives, naming the argument, and accepted ones the same views.
"""

import contextlib

import conv_reference as ref
import numpy as np
import pytest
from device_values import check_close, host_values, poisoned, random_device, shape_in
from fake_arrays import InterfaceOnly

import resnet_native as rn
from resnet_native.ops import conv as rconv

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

# A small stride-2 convolution, like the per-conv rows whose time was host time.
X, W, Y = (4, 16, 10, 10), (32, 16, 3, 3), (4, 32, 5, 5)
STRIDE, PAD = (2, 2), (1, 1)

# Per direction: the inputs (NCHW / KCRS shapes; 1-D is the bias) and the output.
INPUTS = {
    "forward": {"x": X, "w": W},
    "backward_data": {"dy": Y, "w": W},
    "backward_filter": {"x": X, "dy": Y},
    "fused_forward": {"x": X, "w": W, "z": Y, "bias": (W[0],)},  # relu(conv(x, w) + z + bias)
}
OUTPUT = {"forward": Y, "backward_data": X, "backward_filter": W, "fused_forward": Y}
PLAIN = ["forward", "backward_data", "backward_filter"]
# The fused epilogue only in NHWC fp16, where the graph engine must support it (tests/test_graph_conv_gpu.py).
COMBOS = [(d, "NHWC", "fp16") for d in PLAIN + ["fused_forward"]] + [(d, "NCHW", "fp32") for d in PLAIN]
COMBO_IDS = [f"{d}-{layout}-{precision}" for d, layout, precision in COMBOS]


# ------------------------------------------------------------------------------------------------------------------
# Helpers


def spec_for(engine, layout, precision, algo):
    return rconv.ConvSpec(stride=STRIDE, padding=PAD, layout=layout, precision=precision, algo=algo, engine=engine)


def new_inputs(rng, direction, precision, layout):
    """({name: device array in the layout}, {name: float64 NCHW values it holds})."""
    arrays, values = {}, {}
    for name, shape in INPUTS[direction].items():
        arrays[name], values[name] = random_device(rng, shape, precision, layout)
    return arrays, values


def refill(rng, arrays, direction, precision, layout):
    """New random contents in the same device buffers (same pointers); returns the new float64 values."""
    fresh, values = new_inputs(rng, direction, precision, layout)
    for name, array in fresh.items():
        arrays[name][...] = array
    return values


def poison(out, precision):
    out[...] = poisoned(out.shape, precision)


def run(direction, spec, layout, a, out):
    if direction == "forward":
        return rconv.conv2d(a["x"], a["w"], spec, out=out)
    if direction == "fused_forward":
        return rconv.conv2d(a["x"], a["w"], spec, bias=a["bias"], z=a["z"], activation="relu", out=out)
    if direction == "backward_data":
        return rconv.conv2d_backward_data(a["dy"], a["w"], spec, shape_in(X, layout), out=out)
    return rconv.conv2d_backward_filter(a["x"], a["dy"], spec, shape_in(W, layout), out=out)


def expected(direction, v):
    if direction == "forward":
        return ref.conv2d(v["x"], v["w"], STRIDE, PAD)
    if direction == "fused_forward":
        return ref.conv2d(v["x"], v["w"], STRIDE, PAD, bias=v["bias"], z=v["z"], activation="relu")
    if direction == "backward_data":
        return ref.conv2d_backward_data(v["dy"], v["w"], X, STRIDE, PAD)
    return ref.conv2d_backward_filter(v["x"], v["dy"], W, STRIDE, PAD)


def live_variant_packs():
    return rn.live_descriptors().get("backend.VARIANT_PACK", 0)


def capture(stream, fn):
    """fn() captured on `stream` (which must be current) into a cupy CUDA graph; fn's own error wins."""
    stream.begin_capture()
    try:
        fn()
    except BaseException:
        with contextlib.suppress(Exception):
            stream.end_capture()
        raise
    return stream.end_capture()


# ------------------------------------------------------------------------------------------------------------------
# The graph engine's reused variant pack


@pytest.mark.parametrize("direction,layout,precision", COMBOS, ids=COMBO_IDS)
def test_reused_variant_pack_follows_pointer_changes(rng, direction, layout, precision):
    rn._drop_cached_descriptors()
    packs_before = live_variant_packs()
    spec = spec_for("graph", layout, precision, "heuristic")
    a, a_values = new_inputs(rng, direction, precision, layout)
    b, b_values = new_inputs(rng, direction, precision, layout)
    first = next(iter(INPUTS[direction]))  # one operand from b, the others from a
    mixed, mixed_values = dict(a, **{first: b[first]}), dict(a_values, **{first: b_values[first]})
    out_a, out_b = (poisoned(OUTPUT[direction], precision, layout) for _ in range(2))
    steps = [
        ("first call", a, a_values, out_a),
        ("same pointers again", a, a_values, out_a),
        ("every pointer changed", b, b_values, out_b),
        ("only the output changed", b, b_values, out_a),
        ("one input changed", mixed, mixed_values, out_a),
        ("back to the first inputs, other output", a, a_values, out_b),
    ]
    for what, arrays, values, out in steps:
        poison(out, precision)
        assert run(direction, spec, layout, arrays, out) is out
        check_close(out, expected(direction, values), precision, what, layout)
    # Same pointers as the last call, new contents: the reused pack reads what the buffers hold now.
    new_values = refill(rng, a, direction, precision, layout)
    poison(out_b, precision)
    run(direction, spec, layout, a, out_b)
    check_close(out_b, expected(direction, new_values), precision, "new contents", layout)
    # One plan, holding exactly one pack: packs built per call would leave none alive, leaked ones more.
    assert rn._C.graph_num_plans() == 1
    assert live_variant_packs() == packs_before + 1
    rn._drop_cached_descriptors()
    assert live_variant_packs() == packs_before


# ------------------------------------------------------------------------------------------------------------------
# CUDA-graph capture and replay


@pytest.mark.parametrize("engine", ["legacy", "graph"])
@pytest.mark.parametrize("direction,layout,precision", COMBOS, ids=COMBO_IDS)
def test_captured_convolution_replays_to_the_reference(rng, engine, direction, layout, precision):
    spec = spec_for(engine, layout, precision, "find")
    arrays, values = new_inputs(rng, direction, precision, layout)
    out = poisoned(OUTPUT[direction], precision, layout)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        run(direction, spec, layout, arrays, out)  # the search (it synchronises) runs here, outside the capture
        poison(out, precision)
        stream.synchronize()
        graph = capture(stream, lambda: run(direction, spec, layout, arrays, out))
        # Captured work is recorded, not run: the output still holds the poison.
        assert not np.isfinite(host_values(out)).any()
        for replay in range(2):
            if replay:  # the graph reads the buffers' contents at replay time
                values = refill(rng, arrays, direction, precision, layout)
                poison(out, precision)
            graph.launch(stream)
            stream.synchronize()
            check_close(out, expected(direction, values), precision, f"{engine} {direction} replay {replay}",
                        layout)


@pytest.mark.parametrize("engine", ["legacy", "graph"])
def test_search_during_capture_is_refused_and_runs_after(rng, engine):
    rconv.clear_algorithm_cache()  # the key must be unknown, so that the call would search
    spec = spec_for(engine, "NHWC", "fp16", "find")
    arrays, values = new_inputs(rng, "forward", "fp16", "NHWC")
    out = poisoned(OUTPUT["forward"], "fp16", "NHWC")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(ValueError, match="CUDA-graph capture"):
                run("forward", spec, "NHWC", arrays, out)
        finally:
            stream.end_capture()
        assert rconv.last_algorithm(shape_in(X, "NHWC"), shape_in(W, "NHWC"), spec) is None
        run("forward", spec, "NHWC", arrays, out)  # outside the capture the search runs
        check_close(out, expected("forward", values), "fp16", "after the refusal", "NHWC")
    assert rconv.last_algorithm(shape_in(X, "NHWC"), shape_in(W, "NHWC"), spec)["mode"] == "find"


def test_capture_never_narrows_the_legacy_choice(rng):
    """A cached legacy choice whose workspace the pool no longer holds: outside capture the pool grows; during
    capture (where it cannot) the call raises the capture error instead of running a smaller algorithm."""
    for layout, precision in (("NCHW", "fp32"), ("NHWC", "fp16")):
        spec = spec_for("legacy", layout, precision, "find")
        arrays, values = new_inputs(rng, "forward", precision, layout)
        out = poisoned(OUTPUT["forward"], precision, layout)
        run("forward", spec, layout, arrays, out)
        choice = rconv.last_algorithm(shape_in(X, layout), shape_in(W, layout), spec)
        if choice["workspace"] > 0:
            break
    else:
        pytest.skip("Find chose workspace-free algorithms for both problems")
    cp.cuda.Device().synchronize()
    rn.release_workspace()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(ValueError, match="during CUDA-graph capture; call resnet_native.reserve_workspace"):
                run("forward", spec, layout, arrays, out)
        finally:
            stream.end_capture()
        rn.reserve_workspace(choice["workspace"])
        graph = capture(stream, lambda: run("forward", spec, layout, arrays, out))
        graph.launch(stream)
        stream.synchronize()
    check_close(out, expected("forward", values), precision, "after reserve_workspace", layout)
    assert rconv.last_algorithm(shape_in(X, layout), shape_in(W, layout), spec)["algo"] == choice["algo"]


# ------------------------------------------------------------------------------------------------------------------
# tensor_arg's direct read of cupy arrays


def outcome(obj, name, dtype, ndim):
    try:
        return rn._C._testing.parse_tensor(obj, name, dtype, ndim)
    except (TypeError, ValueError) as e:
        return type(e), str(e)


def test_cupy_arrays_parse_as_their_array_interface_describes():
    base = cp.zeros((2, 8, 8, 16), cp.float16)
    cases = [
        (base, "fp16", 4),  # read directly
        (base[1:], "fp16", 4),  # an offset view
        (cp.zeros((16,), cp.int16), "bf16", 1),  # bf16 as int16 bits
        (cp.zeros((3, 5), cp.uint16), "bf16", -1),
        (cp.zeros((2, 8, 8, 16), cp.float64), "fp32", 4),  # wrong dtype
        (base.transpose(0, 3, 1, 2), "fp16", 4),  # not C-contiguous
        (base[:, :, :, :1], "fp16", 4),  # not C-contiguous either
        (base[0], "fp16", 4),  # wrong rank
        (cp.zeros((0, 8, 8, 16), cp.float16), "fp16", 4),  # empty
    ]
    accepted = 0
    for array, dtype, ndim in cases:
        direct, general = outcome(array, "x", dtype, ndim), outcome(InterfaceOnly(array), "x", dtype, ndim)
        assert direct == general, (array.shape, array.strides, array.dtype)
        if not isinstance(direct[0], type):
            accepted += 1
            assert direct[0] == array.data.ptr and direct[2] == array.shape
        else:
            assert direct[1].startswith("x: "), direct  # the error names the argument
    assert accepted == 4
