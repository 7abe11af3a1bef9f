"""Fuzzed shapes on the GPU against the float64 references: a few hundred random convolutions (sizes, strides,
pads, dilations, groups, both layouts, every precision, the legacy and graph engines and `auto`, every algorithm
mode; forward, backward-data and backward-filter), training batch norm (shapes, layouts, dtypes, ReLU, residual)
and max pooling, each into NaN-poisoned outputs.

Cases come from one seed: RESNET_NATIVE_FUZZ_SEED (a random one otherwise), written at the end of the run with the
cases run, those cuDNN does not support (its NOT_SUPPORTED / BAD_PARAM statuses, counted per kind and allowed only
outside the standard shapes), and every failure with what repeats it. RESNET_NATIVE_GPU_FUZZ_CASES sets the number
of convolutions (default 300; batch norm and pooling get a third of that each).
"""

import collections
import contextlib
import hashlib
import os
import random

import numpy as np
import pytest
from device_values import check_close, host_values, poisoned, random_device, to_device
from legacy_conv_problems import Problem, no_workspace_cap  # noqa: F401 (autouse)
from test_norm_gpu import Problem as NormProblem
from test_norm_gpu import check_training_step
from test_pool_gpu import distinct_planes

import resnet_native as rn
from resnet_native import reference
from resnet_native.ops import pool
from resnet_native.ops.conv import ConvSpec
from resnet_native.reference.layout import shape_to_nchw

pytestmark = pytest.mark.gpu


def _seed() -> int:
    """RESNET_NATIVE_FUZZ_SEED, else one random seed per run: under pytest-xdist every worker derives it from the
    run's shared id, so all workers draw the same cases (as collection requires) and a failure names the seed."""
    if os.environ.get("RESNET_NATIVE_FUZZ_SEED"):
        return int(os.environ["RESNET_NATIVE_FUZZ_SEED"])
    if os.environ.get("PYTEST_XDIST_TESTRUNUID"):
        return int(hashlib.sha256(os.environ["PYTEST_XDIST_TESTRUNUID"].encode()).hexdigest()[:8], 16)
    return random.SystemRandom().getrandbits(32)


SEED = _seed()
CONV_CASES = int(os.environ.get("RESNET_NATIVE_GPU_FUZZ_CASES", "300"))
UNSUPPORTED = collections.Counter()  # kind -> cases cuDNN refused
RAN = collections.Counter()


def conv_case(rng: np.random.Generator) -> dict:
    """One random convolution whose output is at least 1x1; about a third of them standard()."""
    if rng.random() < 0.35:
        r = int(rng.choice([1, 3]))
        stride = int(rng.choice([1, 2]))
        return dict(n=int(rng.integers(1, 5)), c=8 * int(rng.integers(1, 9)), h=int(rng.integers(r, 18)),
                    w=int(rng.integers(r, 18)), k=8 * int(rng.integers(1, 9)), r=r, s=r, stride=(stride, stride),
                    pad=(r // 2, r // 2), dil=(1, 1), groups=1, **_settings(rng))
    while True:
        groups = int(rng.choice([1, 1, 1, 2, 4, 0]))  # 0: depthwise
        cpg = int(rng.integers(1, 9))
        c = cpg * (groups or 1) if groups else int(rng.integers(1, 17))
        groups = groups or c
        k = groups * int(rng.integers(1, 5)) if groups > 1 else int(rng.integers(1, 33))
        r, s = (int(v) for v in rng.choice([1, 2, 3, 3, 5], 2))
        stride = tuple(int(v) for v in rng.choice([1, 1, 2, 3], 2))
        pad = tuple(int(rng.integers(0, min(3, d) + 1)) for d in (r, s))
        dil = tuple(int(v) for v in rng.choice([1, 1, 1, 2], 2))
        h, w = (int(v) for v in rng.integers(1, 18, 2))
        out = [(size + 2 * p - d * (f - 1) - 1) // st + 1 for size, p, d, f, st in zip((h, w), pad, dil, (r, s), stride,
                                                                                      strict=True)]
        if min(out) >= 1:
            break
    return dict(n=int(rng.integers(1, 5)), c=c, h=h, w=w, k=k, r=r, s=s, stride=stride, pad=pad, dil=dil,
                groups=groups, **_settings(rng))


def _settings(rng: np.random.Generator) -> dict:
    return dict(layout=str(rng.choice(["NCHW", "NHWC"])), precision=str(rng.choice(["fp32", "tf32", "fp16", "bf16"])),
                engine=str(rng.choice(["legacy", "graph", "auto"])), algo=str(rng.choice(["find", "heuristic"])))


def standard(case: dict) -> bool:
    """The shapes every engine must take: channels multiple of 8, square 1x1 or 3x3, no dilation or groups."""
    return (case["c"] % 8 == 0 and case["k"] % 8 == 0 and case["groups"] == 1 and case["r"] == case["s"] in (1, 3)
            and case["dil"] == (1, 1) and case["stride"][0] == case["stride"][1])


def kind(case: dict) -> str:
    return (f"{case['engine']} {case['layout']} {case['precision']} groups={'>1' if case['groups'] > 1 else 1} "
            f"dil={max(case['dil'])}")


@contextlib.contextmanager
def refusals_counted(case_kind: str, strict: bool):
    """cuDNN's NOT_SUPPORTED / BAD_PARAM for a non-standard case is counted, not failed."""
    try:
        yield
    except rn.CudnnError as e:
        if strict or getattr(e, "code", 0) // 1000 not in (2, 3):
            raise
        UNSUPPORTED[case_kind] += 1
        pytest.skip(f"cuDNN does not support this case: {str(e)[:160]}")


rng0 = np.random.default_rng(SEED)
CONVS = [conv_case(rng0) for _ in range(CONV_CASES)]
NORMS = [dict(nchw=tuple(int(v) for v in (rng0.integers(1, 9), rng0.integers(1, 70), rng0.integers(1, 12),
                                          rng0.integers(1, 12))),
              layout=str(rng0.choice(["NCHW", "NHWC"])), dtype=str(rng0.choice(["fp32", "fp16", "bf16"])),
              relu=bool(rng0.integers(0, 2)), residual=bool(rng0.integers(0, 2))) for _ in range(CONV_CASES // 3)]
POOLS = []
for _ in range(CONV_CASES // 3):
    kernel = int(rng0.integers(1, 4))
    padding = int(rng0.integers(0, kernel // 2 + 1))
    side = [int(v) for v in rng0.integers(kernel, 13, 2)]
    POOLS.append(dict(nchw=(int(rng0.integers(1, 4)), int(rng0.integers(1, 9)), *side), kernel=kernel,
                      stride=int(rng0.integers(1, 4)), padding=padding, layout=str(rng0.choice(["NCHW", "NHWC"])),
                      dtype=str(rng0.choice(["fp32", "fp16", "bf16"]))))


@pytest.fixture(scope="module", autouse=True)
def fuzz_report(request):
    yield
    lines = [f"GPU shape fuzz: seed {SEED} (set RESNET_NATIVE_FUZZ_SEED={SEED} to repeat): ran "
             + ", ".join(f"{k} {v}" for k, v in sorted(RAN.items())),
             "not supported by cuDNN: " + (", ".join(f"{k}: {v}" for k, v in sorted(UNSUPPORTED.items())) or "none")]
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + "\n".join(lines))


class FuzzProblem(Problem):
    """A problem whose reference may be all zeros (every tap of every output in the padding): then the result
    must be exactly zero."""

    def check(self, got, expected, what):
        if np.any(expected):
            return super().check(got, expected, what)
        values = host_values(got, self.layout)
        assert np.isfinite(values).all(), f"{what}: {np.count_nonzero(~np.isfinite(values))} elements not written"
        assert not np.any(values), f"{what}: the reference is all zeros, the result has {np.count_nonzero(values)} " \
                                   f"nonzero elements"
        RAN["all-zero results"] += 1
        return 0.0


@pytest.mark.parametrize("index", range(len(CONVS)))
def test_random_convolution_matches_reference(index):
    case = CONVS[index]
    rng = np.random.default_rng([SEED, index])
    p = FuzzProblem(rng, case["precision"], case["layout"], case["n"], case["c"], case["h"], case["w"], case["k"],
                case["r"], case["s"], case["stride"], case["pad"], case["dil"], case["groups"])
    p.spec = ConvSpec(stride=p.stride, padding=p.pad, dilation=p.dil, groups=p.groups, layout=p.layout,
                      precision=p.precision, algo=case["algo"], engine=case["engine"])
    with refusals_counted(kind(case), standard(case)):
        p.check_all(f"seed {SEED} case {index}: {case}")
    RAN["convolutions"] += 1


@pytest.mark.parametrize("index", range(len(NORMS)))
def test_random_batch_norm_matches_reference(index):
    case = NORMS[index]
    p = NormProblem(np.random.default_rng([SEED, 10**6 + index]), case["nchw"], case["layout"], case["dtype"],
                    case["residual"])
    n, _, h, w = case["nchw"]
    if n * h * w == 1:  # one value per channel: training batch norm is undefined there and refused
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            check_training_step(p, relu=case["relu"])
        return
    result = check_training_step(p, relu=case["relu"])
    assert result["forward_path"]["ex"] == (case["layout"] == "NHWC") or "refused" in result["forward_path"]["detail"]
    RAN["batch norms"] += 1


@pytest.mark.parametrize("index", range(len(POOLS)))
def test_random_max_pool_matches_reference(index):
    case = POOLS[index]
    rng = np.random.default_rng([SEED, 2 * 10**6 + index])
    window = dict(kernel=case["kernel"], stride=case["stride"], padding=case["padding"])
    n, c, h, w = case["nchw"]
    nchw = (n, c, min(h, 16), min(w, 16))  # distinct_planes needs h * w <= 256
    x, hx = to_device(distinct_planes(rng, nchw), case["dtype"], case["layout"])
    y_shape = pool.max_pool2d_output_shape(x.shape, **window, layout=case["layout"])
    y = poisoned(y_shape, case["dtype"])
    pool.max_pool2d(x, **window, layout=case["layout"], out=y, dtype=case["dtype"])
    y_ref = reference.pool.max_pool2d(hx, **window, layout="NCHW")
    assert np.array_equal(host_values(y, case["layout"]), y_ref), f"seed {SEED} case {index}: {case}"
    dy, hdy = random_device(rng, shape_to_nchw(y_shape, case["layout"]), case["dtype"], case["layout"])
    dx = poisoned(x.shape, case["dtype"])
    pool.max_pool2d_backward(dy, x, y, **window, layout=case["layout"], out=dx, dtype=case["dtype"])
    check_close(dx, reference.pool.max_pool2d_backward(hdy, hx, y_ref, **window, layout="NCHW"), case["dtype"],
                f"seed {SEED} case {index}: dx", case["layout"])
    RAN["max pools"] += 1
