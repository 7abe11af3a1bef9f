"""The graph convolution engine's choices and plans across calls on the GPU: the algorithm-cache file round trip
(plans rebuilt from engine id + knob choices without timing), cache hits, engine='auto' timing both engines and
remembering the winner, plan and descriptor lifetimes, the plan cache's bound (least recently used plans evicted and
destroyed, rebuilt without a search; plans run during a CUDA-graph capture pinned, so the graph still replays after
evictions), and clear errors. Results are checked against the float64
reference, as in test_graph_conv_gpu.py.
"""

import json

import conv_reference as ref
import pytest
from device_values import check_close, poisoned, random_device, shape_in

import resnet_native as rn
from resnet_native.ops import conv as rconv

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")


def fresh_cache():
    rconv.clear_algorithm_cache()
    rn._drop_cached_descriptors()


# ------------------------------------------------------------------------------------------------------------------
# Algorithm cache: file round trip, counts, engine='auto'


def test_cache_file_round_trip_rebuilds_plans_without_timing(rng, tmp_path):
    fresh_cache()
    spec = rconv.ConvSpec(padding=1, layout="NHWC", precision="fp16", algo="find", engine="graph")
    x_shape, w_shape = (2, 16, 9, 9), (32, 16, 3, 3)
    x, x64 = random_device(rng, x_shape, "fp16", "NHWC")
    w, w64 = random_device(rng, w_shape, "fp16", "NHWC")
    bias, bias64 = random_device(rng, (32,), "fp16")
    plain = ref.conv2d(x64, w64, (1, 1), (1, 1))
    fused = ref.conv2d(x64, w64, (1, 1), (1, 1), bias=bias64, activation="relu")

    finds = rconv.algorithm_cache_stats()["finds"]
    rconv.conv2d(x, w, spec)
    rconv.conv2d(x, w, spec, bias=bias, activation="relu")
    assert rconv.algorithm_cache_stats()["finds"] == finds + 2
    keys = {"plain": None, "fused": "bias+relu"}
    before = {k: rconv.last_algorithm((2, 9, 9, 16), (32, 3, 3, 16), spec, fused=f) for k, f in keys.items()}
    assert all(b["engine"] == "graph" and b["time_ms"] is not None for b in before.values())

    path = tmp_path / "algos.json"
    assert rconv.save_algorithm_cache(path) >= 2
    saved = json.loads(path.read_text())
    assert any(e["engine"] == "graph" for e in saved["entries"])

    fresh_cache()
    assert rn._C.graph_num_plans() == 0
    assert rconv.last_algorithm((2, 9, 9, 16), (32, 3, 3, 16), spec) is None
    assert rconv.load_algorithm_cache(path) >= 2
    finds = rconv.algorithm_cache_stats()["finds"]

    y = rconv.conv2d(x, w, spec)
    y_fused = rconv.conv2d(x, w, spec, bias=bias, activation="relu")
    assert rconv.algorithm_cache_stats()["finds"] == finds, "a loaded choice was searched again"
    assert rn._C.graph_num_plans() == 2, "the plans were not rebuilt from the loaded choices"
    check_close(y, plain, "fp16", "reloaded plain", "NHWC")
    check_close(y_fused, fused, "fp16", "reloaded fused", "NHWC")
    for k, f in keys.items():
        after = rconv.last_algorithm((2, 9, 9, 16), (32, 3, 3, 16), spec, fused=f)
        assert (after["engine"], after["algo"], after["knobs"]) == (
            before[k]["engine"],
            before[k]["algo"],
            before[k]["knobs"],
        )


def test_cache_hits_do_not_search_again(rng):
    fresh_cache()
    spec = rconv.ConvSpec(stride=2, padding=1, layout="NHWC", precision="bf16", algo="find", engine="graph")
    x, _ = random_device(rng, (2, 16, 10, 10), "bf16", "NHWC")
    w, _ = random_device(rng, (16, 16, 3, 3), "bf16", "NHWC")
    stats = rconv.algorithm_cache_stats()
    for _ in range(4):
        rconv.conv2d(x, w, spec)
    after = rconv.algorithm_cache_stats()
    assert after["finds"] == stats["finds"] + 1
    assert after["hits"] >= stats["hits"] + 3
    assert rn._C.graph_num_plans() == 1


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_auto_engine_times_both_and_remembers(rng, direction):
    fresh_cache()
    layout, precision = "NHWC", "fp16"
    x_shape, w_shape = (8, 64, 16, 16), (64, 64, 1, 1)
    specs = {
        e: rconv.ConvSpec(layout=layout, precision=precision, algo="find", engine=e)
        for e in ("auto", "legacy", "graph")
    }
    x, x64 = random_device(rng, x_shape, precision, layout)
    w, w64 = random_device(rng, w_shape, precision, layout)
    dy, dy64 = random_device(rng, (8, 64, 16, 16), precision, layout)

    def call():
        if direction == "forward":
            return rconv.conv2d(x, w, specs["auto"]), ref.conv2d(x64, w64)
        if direction == "backward_data":
            dx = rconv.conv2d_backward_data(dy, w, specs["auto"], shape_in(x_shape, layout))
            return dx, ref.conv2d_backward_data(dy64, w64, x_shape)
        dw = rconv.conv2d_backward_filter(x, dy, specs["auto"], shape_in(w_shape, layout))
        return dw, ref.conv2d_backward_filter(x64, dy64, w_shape)

    result, expected = call()
    check_close(result, expected, precision, f"auto {direction}", layout)
    shapes = (shape_in(x_shape, layout), shape_in(w_shape, layout))
    chosen = {e: rconv.last_algorithm(*shapes, s, direction) for e, s in specs.items()}
    # Both engines' choices are cached and stay valid; the auto key remembers one of them, timed.
    assert chosen["legacy"]["engine"] == "legacy" and chosen["graph"]["engine"] == "graph"
    assert chosen["auto"]["engine"] in ("legacy", "graph")
    winner = chosen[chosen["auto"]["engine"]]
    assert (chosen["auto"]["algo"], chosen["auto"]["knobs"]) == (winner["algo"], winner["knobs"])
    assert chosen["auto"]["time_ms"] is not None
    finds = rconv.algorithm_cache_stats()["finds"]
    result, _ = call()
    check_close(result, expected, precision, f"auto {direction} again", layout)
    assert rconv.algorithm_cache_stats()["finds"] == finds


# ------------------------------------------------------------------------------------------------------------------
# Lifetimes and errors


def test_plans_hold_descriptors_until_dropped(rng):
    rn._drop_cached_descriptors()
    baseline = {k: v for k, v in rn.live_descriptors().items() if k.startswith("backend.")}
    spec = rconv.ConvSpec(padding=1, layout="NHWC", precision="fp16", algo="heuristic", engine="graph")
    x, _ = random_device(rng, (2, 16, 9, 9), "fp16", "NHWC")
    w, _ = random_device(rng, (16, 16, 3, 3), "fp16", "NHWC")
    bias, _ = random_device(rng, (16,), "fp16")
    rconv.conv2d(x, w, spec)
    rconv.conv2d(x, w, spec, bias=bias, activation="relu")
    rconv.conv2d_backward_data(x, w, spec, (2, 9, 9, 16))
    assert rn._C.graph_num_plans() == 3
    live = rn.live_descriptors()
    assert live.get("backend.EXECUTION_PLAN", 0) == baseline.get("backend.EXECUTION_PLAN", 0) + 3
    assert live.get("backend.OPERATIONGRAPH", 0) == baseline.get("backend.OPERATIONGRAPH", 0) + 3
    # Each plan keeps the variant pack of its last execution (reused while the pointers stay the same).
    assert live.get("backend.VARIANT_PACK", 0) == baseline.get("backend.VARIANT_PACK", 0) + 3
    rn._drop_cached_descriptors()
    assert rn._C.graph_num_plans() == 0
    after = {k: v for k, v in rn.live_descriptors().items() if k.startswith("backend.")}
    assert {k: v for k, v in after.items() if v != baseline.get(k, 0)} == {}
    # Plans come back on demand from the cached choices.
    rconv.conv2d(x, w, spec)
    assert rn._C.graph_num_plans() == 1


def backend_live():
    return {k: v for k, v in rn.live_descriptors().items() if k.startswith("backend.")}


def test_plans_past_the_capacity_are_evicted_destroyed_and_rebuilt_without_a_search(rng):
    fresh_cache()
    capacity = rconv.plan_cache_capacity()
    baseline = backend_live()
    spec = rconv.ConvSpec(padding=1, layout="NHWC", precision="fp16", algo="find", engine="graph")
    w, w64 = random_device(rng, (16, 16, 3, 3), "fp16", "NHWC")
    problems = {}  # batch size -> (x, expected): one distinct problem, hence plan, each
    for n in (1, 2, 3, 4, 5):
        x, x64 = random_device(rng, (n, 16, 9, 9), "fp16", "NHWC")
        problems[n] = (x, ref.conv2d(x64, w64, (1, 1), (1, 1)))
    try:
        rconv.set_plan_cache_capacity(2)
        evictions = rconv.plan_cache_stats()["evictions"]
        for n, (x, expected) in problems.items():
            check_close(rconv.conv2d(x, w, spec), expected, "fp16", f"batch {n}", "NHWC")
        stats = rconv.plan_cache_stats()
        assert (stats["plans"], stats["evictions"], stats["pinned"]) == (2, evictions + 3, 0)
        assert rn._C.graph_num_plans() == 2
        # Evicted plans were destroyed with their descriptors: two plans' worth stay alive.
        live = backend_live()
        for kind in ("backend.EXECUTION_PLAN", "backend.OPERATIONGRAPH", "backend.VARIANT_PACK"):
            assert live.get(kind, 0) == baseline.get(kind, 0) + 2, kind
        # The first problem's plan is gone, its choice is not: the plan is rebuilt from it, without a search.
        finds = rconv.algorithm_cache_stats()["finds"]
        x, expected = problems[1]
        check_close(rconv.conv2d(x, w, spec), expected, "fp16", "batch 1 after its eviction", "NHWC")
        assert rconv.algorithm_cache_stats()["finds"] == finds
        assert rconv.plan_cache_stats()["plans"] == 2
        assert rconv.plan_cache_stats()["evictions"] == evictions + 4
    finally:
        rconv.set_plan_cache_capacity(capacity)
    rn._drop_cached_descriptors()
    assert {k: v for k, v in backend_live().items() if v != baseline.get(k, 0)} == {}


def test_a_plan_run_during_capture_is_pinned_and_its_graph_replays_after_evictions(rng):
    fresh_cache()
    capacity = rconv.plan_cache_capacity()
    spec = rconv.ConvSpec(padding=1, layout="NHWC", precision="fp16", algo="heuristic", engine="graph")
    x, x64 = random_device(rng, (2, 16, 9, 9), "fp16", "NHWC")
    w, w64 = random_device(rng, (16, 16, 3, 3), "fp16", "NHWC")
    expected = ref.conv2d(x64, w64, (1, 1), (1, 1))
    out = poisoned((2, 16, 9, 9), "fp16", "NHWC")
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        rconv.set_plan_cache_capacity(1)
        with stream:
            rconv.conv2d(x, w, spec, out=out)  # choice and plan made outside the capture
            stream.synchronize()
            assert rconv.plan_cache_stats()["pinned"] == 0
            stream.begin_capture()
            try:
                rconv.conv2d(x, w, spec, out=out)
            finally:
                graph = stream.end_capture()
            assert rconv.plan_cache_stats()["pinned"] == 1
            for n in (3, 4, 5):  # other problems, run eagerly, fill the cache past its capacity of 1
                other, other64 = random_device(rng, (n, 16, 9, 9), "fp16", "NHWC")
                check_close(rconv.conv2d(other, w, spec), ref.conv2d(other64, w64, (1, 1), (1, 1)), "fp16",
                            f"batch {n}", "NHWC")
            stats = rconv.plan_cache_stats()
            assert stats["pinned"] == 1 and stats["plans"] == 2  # the pinned plan and the most recent one
            assert stats["evictions"] >= 2
            out[...] = poisoned((2, 16, 9, 9), "fp16", "NHWC")
            graph.launch(stream)
            stream.synchronize()
            check_close(out, expected, "fp16", "replay after evictions", "NHWC")
        del graph
    finally:
        rconv.set_plan_cache_capacity(capacity)


def test_unknown_engine_id_is_a_clear_error(rng):
    spec = rconv.ConvSpec(padding=1, layout="NHWC", precision="fp16", algo="ENGINE_99999", engine="graph")
    x, _ = random_device(rng, (2, 16, 9, 9), "fp16", "NHWC")
    w, _ = random_device(rng, (16, 16, 3, 3), "fp16", "NHWC")
    with pytest.raises(rn.CudnnError) as info:
        rconv.conv2d(x, w, spec)
    message = str(info.value)
    assert "engine 99999 does not support" in message
    assert "x=(2, 16, 9, 9) w=(16, 16, 3, 3)" in message and "fp16 NHWC" in message


def test_shape_no_engine_supports_is_a_clear_error(rng):
    # Strict fp32 NCHW with every fused epilogue, dilation and groups: no graph engine is expected to take it.
    # Either it truly runs (and must then be right) or the error names the shape and says why.
    spec = rconv.ConvSpec(
        padding=2, dilation=2, groups=2, layout="NCHW", precision="fp32", algo="heuristic", engine="graph"
    )
    x_shape, w_shape = (1, 6, 7, 7), (4, 3, 3, 3)
    x, x64 = random_device(rng, x_shape, "fp32", "NCHW")
    w, w64 = random_device(rng, w_shape, "fp32", "NCHW")
    z, z64 = random_device(rng, (1, 4, 7, 7), "fp32", "NCHW")
    bias, bias64 = random_device(rng, (4,), "fp32")
    try:
        y = rconv.conv2d(x, w, spec, bias=bias, z=z, activation="relu")
    except rn.CudnnError as e:
        message = str(e)
        assert "graph engine" in message
        assert "x=(1, 6, 7, 7) w=(4, 3, 3, 3)" in message and "groups=2" in message
        assert "epilogue=bias+residual+relu" in message
        assert "no cuDNN engine supports" in message or "rejects the operation graph" in message
        return
    expected = ref.conv2d(x64, w64, (1, 1), (2, 2), (2, 2), 2, bias=bias64, z=z64, activation="relu")
    check_close(y, expected, "fp32", "fused strict fp32 grouped dilated")
