"""The legacy engine's algorithm choice across calls on the GPU: cache hits that never search again, the cache file
(saved, reloaded, ignored when from another GPU), workspace caps, deterministic mode, cupy's current stream,
descriptor lifetimes and shape errors. Every result is checked against the float64 reference, as in
test_conv_gpu.py.
"""

import json

import numpy as np
import pytest
from device_values import host_values
from legacy_conv_problems import EPILOGUES, Problem, no_workspace_cap, problem, run_epilogue  # noqa: F401 (autouse)

import resnet_native as rn
from resnet_native.ops import conv

pytestmark = pytest.mark.gpu

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


# ------------------------------------------------------------------------------------------------------------------
# The algorithm cache


def test_cache_hits_do_not_rerun_find(rng, tmp_path):
    conv.clear_algorithm_cache()
    p = Problem(rng, "fp16", "NHWC", 4, 16, 12, 12, 24, 3, 3, 1, 1, algo="find")
    s0 = conv.algorithm_cache_stats()
    p.check_all("first")  # one search per direction
    s1 = conv.algorithm_cache_stats()
    assert s1["finds"] - s0["finds"] == 3 and s1["misses"] - s0["misses"] == 3
    for _ in range(3):
        q = Problem(rng, "fp16", "NHWC", 4, 16, 12, 12, 24, 3, 3, 1, 1, algo="find")  # same shapes, new data
        q.check_all("again")
    s2 = conv.algorithm_cache_stats()
    assert s2["finds"] == s1["finds"], "a cache hit ran Find again"
    assert s2["hits"] - s1["hits"] == 9

    # A fused forward of the same problem reuses the plain forward's search.
    conv.conv2d(p.dev(p.x), p.dev(p.w), p.spec, bias=p.dev(p.values((24,))), activation="relu")
    assert conv.algorithm_cache_stats()["finds"] == s2["finds"]

    # Saved, cleared and loaded: still no search, and the same choices.
    saved = {e["key"]: e for e in conv.algorithm_cache_entries()}
    path = tmp_path / "algos.json"
    assert conv.save_algorithm_cache(path) == len(saved)
    conv.clear_algorithm_cache()
    assert conv.load_algorithm_cache(path) == len(saved)
    p.check_all("after reload")
    s3 = conv.algorithm_cache_stats()
    assert s3["finds"] == s2["finds"]
    for direction in conv.DIRECTIONS:
        entry = conv.last_algorithm(p.x_shape, p.w_shape, p.spec, direction)
        assert entry["algo"] == saved[entry["key"]]["algo"]
        assert entry["math_type"] == saved[entry["key"]]["math_type"]


def test_loading_a_cache_from_another_gpu_is_ignored(rng, tmp_path):
    conv.clear_algorithm_cache()
    p = problem(rng, "3x3", "fp32", "NCHW", algo="heuristic")
    p.check_all("populate")
    path = tmp_path / "algos.json"
    conv.save_algorithm_cache(path)
    payload = json.loads(path.read_text())
    payload["gpu"] = "Some Other GPU"
    path.write_text(json.dumps(payload))
    conv.clear_algorithm_cache()
    with pytest.warns(UserWarning, match="ignored"):
        assert conv.load_algorithm_cache(path) == 0
    assert conv.algorithm_cache_entries() == []


# ------------------------------------------------------------------------------------------------------------------
# Workspace caps


def test_workspace_cap_forces_algorithms_without_workspace(rng):
    conv.clear_algorithm_cache()
    try:
        rn.set_workspace_limit(0)
        for algo in ("find", "heuristic"):
            p = problem(rng, "3x3", "fp32", "NCHW", algo=algo)
            p.check_all(f"cap 0 {algo}")
            for direction in conv.DIRECTIONS:
                chosen = conv.last_algorithm(p.x_shape, p.w_shape, p.spec, direction)
                assert chosen["workspace"] == 0 and " ws=0" in chosen["key"], chosen
    finally:
        rn.set_workspace_limit(None)


def test_fixed_algorithm_falls_back_when_its_workspace_is_capped(rng):
    conv.clear_algorithm_cache()
    p = None
    for name in ("FFT_TILING", "FFT", "GEMM", "WINOGRAD_NONFUSED", "IMPLICIT_PRECOMP_GEMM"):
        candidate = problem(rng, "3x3", "fp32", "NCHW", algo=name)
        try:
            candidate.check(candidate.run_forward(), candidate.forward_ref(), f"fixed {name}")
        except ValueError as e:
            if "does not support" in str(e):
                continue
            raise
        except rn.CudnnError as e:
            if getattr(e, "code", 0) // 1000 in (2, 3):  # refused when run: try the next one
                continue
            raise
        chosen = conv.last_algorithm(candidate.x_shape, candidate.w_shape, candidate.spec)
        assert chosen["mode"] == "fixed" and chosen["algo_name"] == name
        if chosen["workspace"] > 0:
            p = candidate
            break
    if p is None:
        pytest.skip("no fixed forward algorithm needs workspace for this problem")
    try:
        rn.set_workspace_limit(0)
        p.check(p.run_forward(), p.forward_ref(), "fixed algorithm under a zero workspace cap")
        chosen = conv.last_algorithm(p.x_shape, p.w_shape, p.spec)
        assert chosen["workspace"] == 0 and chosen["mode"] == "heuristic" and chosen["algo_name"] != name, chosen
    finally:
        rn.set_workspace_limit(None)


# ------------------------------------------------------------------------------------------------------------------
# Determinism, streams, descriptor counts, errors


@pytest.mark.parametrize("algo", ["find", "heuristic"])
@pytest.mark.parametrize("precision,layout", [("fp32", "NCHW"), ("fp16", "NHWC")])
def test_deterministic_mode(rng, algo, precision, layout):
    conv.clear_algorithm_cache()
    p = Problem(rng, precision, layout, 8, 32, 16, 16, 32, 3, 3, 1, 1, algo=algo, deterministic=True)
    results = []
    for _ in range(2):
        dx, dw = p.run_backward_data(), p.run_backward_filter()
        results.append((host_values(dx), host_values(dw)))
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])
    p.check(dw, p.backward_filter_ref(), "deterministic backward-filter")
    for direction in ("backward_data", "backward_filter"):
        chosen = conv.last_algorithm(p.x_shape, p.w_shape, p.spec, direction)
        assert " det=1 " in chosen["key"]
        assert rn._C.conv_algo_is_deterministic(getattr(rn._C.Direction, direction), chosen["algo"]), chosen


def test_deterministic_mode_refuses_a_non_deterministic_fixed_algorithm(rng):
    p = Problem(rng, "fp32", "NCHW", 2, 8, 8, 8, 8, 3, 3, 1, 1, algo="bwd_filter=ALGO_0", deterministic=True)
    with pytest.raises(ValueError, match="non-deterministic"):
        p.run_backward_filter()


def test_ops_run_on_cupys_current_stream(rng):
    import cupy as cp

    p = problem(rng, "3x3", "fp32", "NCHW")
    x = cp.full(p.x_shape, np.nan, dtype=cp.float32)
    w, dy = p.dev(p.w), p.dev(p.dy)
    new_x = p.dev(p.x)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        big = cp.ones((4096, 4096), dtype=cp.float32)
        for _ in range(3):
            big = big @ big * (1.0 / 4096)  # keeps the stream busy for a few milliseconds
        x[...] = new_x * big[0, 0]  # big[0, 0] == 1: x becomes valid only after the busy work, in stream order
        y = p.poisoned(p.dy.shape)
        conv.conv2d(x, w, p.spec, out=y)
        dw = p.poisoned(p.w.shape)
        conv.conv2d_backward_filter(x, dy, p.spec, p.w_shape, out=dw)
        assert rn._C._testing.handle_stream(stream.ptr) == stream.ptr
    stream.synchronize()
    p.check(y, p.forward_ref(), "forward on a side stream")
    p.check(dw, p.backward_filter_ref(), "backward-filter on a side stream")


def test_descriptor_counts_return_to_baseline(rng):
    def live():
        return {k: v for k, v in rn.live_descriptors().items() if k != "handle" and v != 0}

    rn._drop_cached_descriptors()
    before = live()
    for precision in PRECISIONS:
        p = problem(rng, "stride2", precision, "NHWC")
        p.check_all(precision)
        if precision in ("fp32", "fp16"):
            run_epilogue(rng, precision, "NCHW", EPILOGUES[1])
    assert live() != before  # descriptor groups are cached...
    rn._drop_cached_descriptors()
    assert live() == before  # ...and all of them are released


def test_shape_errors_name_the_problem(rng):
    p = problem(rng, "3x3", "fp32", "NCHW")
    with pytest.raises(ValueError, match="dy"):
        conv.conv2d_backward_data(p.dev(p.x), p.dev(p.w), p.spec, p.x_shape)  # x where dy belongs
    with pytest.raises(TypeError, match="x"):
        conv.conv2d(p.dev(p.x).astype("float16"), p.dev(p.w), p.spec)
