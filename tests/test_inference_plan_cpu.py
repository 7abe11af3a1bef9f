"""The inference engine's plan, without a GPU: BatchNorm folding against the float64 reference's convolution then
batch norm, the plan of ResNet-18/50 (which convolutions fuse what, shapes, FLOPs), liveness buffer assignment, and
the plan bound into shared buffers and run on the NumPy references against the model's own eval graph. The engine's
calls and argument validation are in test_inference_cpu.py."""

import numpy as np
import pytest
from device_values import to_layout

import resnet_native as rn
from resnet_native import reference
from resnet_native._core.names import ARRAY_DTYPES, DTYPE_ALIASES
from resnet_native.inference import (
    assign_buffers,
    build_plan,
    filter_in_layout,
    fold_batch_norm,
    live_ranges,
    plan_buffers,
)
from resnet_native.inference.fold import BN_EPS, conv_step_params, fold_from_state
from resnet_native.inference.runner import bind_forward
from resnet_native.ops import conv


def randomized_state(model, rng) -> dict:
    """model.state_dict() with non-trivial BatchNorms: running means and variances far from 0 and 1, random
    gamma and beta (and a num_batches_tracked the folding must ignore)."""
    state = model.state_dict()
    for key in [k for k in state if k.endswith(".running_mean")]:
        bn = key[: -len(".running_mean")]
        c = state[key].shape[0]
        state[f"{bn}.running_mean"] = (rng.choice([-1.0, 1.0], c) * rng.uniform(0.2, 1.0, c)).astype(np.float32)
        state[f"{bn}.running_var"] = rng.uniform(0.3, 3.0, c).astype(np.float32)
        state[f"{bn}.weight"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        state[f"{bn}.bias"] = rng.uniform(-0.3, 0.3, c).astype(np.float32)
        state[f"{bn}.num_batches_tracked"] = np.array(int(rng.integers(1, 10**6)), np.int64)
    return state


# ------------------------------------------------------------------------------------------------------------
# Folding


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("geometry", [(3, 1, 1), (1, 2, 0), (7, 2, 3)], ids=["3x3", "1x1s2", "7x7s2"])
def test_folded_conv_plus_bias_equals_conv_then_batch_norm(rng, layout, geometry):
    r, stride, pad = geometry
    x = rng.standard_normal((2, 5, 9, 9))
    w = rng.standard_normal((6, 5, r, r))
    gamma, beta = rng.uniform(0.5, 1.5, 6), rng.uniform(-1, 1, 6)
    mean, var = rng.uniform(-3, 3, 6), rng.uniform(0.01, 9, 6)
    spec = conv.ConvSpec(stride=stride, padding=pad, layout=layout)
    expected = reference.norm.batch_norm_infer(reference.conv.conv2d(to_layout(x, layout), to_layout(w, layout), spec),
                                               gamma, beta, mean, var, layout=layout, eps=BN_EPS)

    wf, bf = fold_batch_norm(w, gamma, beta, mean, var)
    assert wf.dtype == bf.dtype == np.float64 and wf.shape == w.shape and bf.shape == (6,)
    w_layout = filter_in_layout(wf, layout)
    assert w_layout.flags.c_contiguous
    assert w_layout.shape == ((6, r, r, 5) if layout == "NHWC" else (6, 5, r, r))
    # The folded filter in the layout, as the layout's ops read it, convolved and biased.
    got = reference.conv.conv2d(to_layout(x, layout), w_layout, spec, bias=bf)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_folding_reads_the_state_dict_and_ignores_num_batches_tracked(rng):
    model = rn.ResNet18(num_classes=10, seed=0)
    state = randomized_state(model, rng)
    w, b = fold_from_state(state, "layer2.0.downsample.0.weight", "layer2.0.downsample.1")
    state["layer2.0.downsample.1.num_batches_tracked"] = np.array(0, np.int64)
    w2, b2 = fold_from_state(state, "layer2.0.downsample.0.weight", "layer2.0.downsample.1")
    np.testing.assert_array_equal(w, w2)
    np.testing.assert_array_equal(b, b2)
    bn = {f: state[f"layer2.0.downsample.1.{f}"].astype(np.float64) for f in ("weight", "bias", "running_mean",
                                                                             "running_var")}
    scale = bn["weight"] / np.sqrt(bn["running_var"] + 1e-5)
    np.testing.assert_allclose(w, state["layer2.0.downsample.0.weight"] * scale[:, None, None, None], rtol=1e-15)
    np.testing.assert_allclose(b, bn["bias"] - bn["running_mean"] * scale, rtol=1e-15)


def test_fold_validates_its_arguments():
    w = np.ones((4, 3, 3, 3))
    ok = np.ones(4)
    with pytest.raises(ValueError, match=r"weight: expected a \(K, C, R, S\)"):
        fold_batch_norm(np.ones((4, 3)), ok, ok, ok, ok)
    with pytest.raises(ValueError, match=r"mean: expected shape \(4,\)"):
        fold_batch_norm(w, ok, ok, np.ones(3), ok)
    with pytest.raises(ValueError, match="var: running variances"):
        fold_batch_norm(w, ok, ok, ok, -np.ones(4))
    with pytest.raises(ValueError, match="layout"):
        filter_in_layout(w, "NWHC")


# ------------------------------------------------------------------------------------------------------------
# The plan


def _plan(depth, stem="cifar", precision="fp16", image_size=32, num_classes=10):
    model = rn.ResNet(depth, num_classes, stem=stem, seed=0)
    return build_plan(model.state_dict(), stem, precision, image_size)


@pytest.mark.parametrize("depth", [18, 50])
def test_plan_of_a_resnet_says_which_convolution_fuses_what(depth):
    plan = _plan(depth)
    fused = {name: parts for name, kind, parts in plan.describe() if kind == "conv"}
    blocks = 8 if depth == 18 else 16
    main = 2 if depth == 18 else 3
    assert len(fused) == 1 + blocks * main + (3 if depth == 18 else 4) + 1  # stem, blocks, downsamples, fc
    assert fused["conv1"] == "bias+relu"
    assert fused["fc"] == "bias"
    residual = [n for n, p in fused.items() if p == "bias+residual+relu"]
    assert len(residual) == blocks and all(n.endswith(f".conv{main}") for n in residual)
    downsample = sorted(n for n in fused if "downsample" in n)
    assert all(fused[n] == "bias" for n in downsample)
    assert downsample == ([f"layer{i}.0.downsample.0" for i in (2, 3, 4)] if depth == 18 else
                          [f"layer{i}.0.downsample.0" for i in (1, 2, 3, 4)])
    others = set(fused) - set(residual) - set(downsample) - {"conv1", "fc"}
    assert all(fused[n] == "bias+relu" for n in others)
    # The shortcut of a block with a downsample is that conv's output; of the others, the block input.
    steps = {s.name: s for s in plan.conv_steps()}
    last = steps[f"layer2.0.conv{main}"]
    assert last.z == steps["layer2.0.downsample.0"].out
    assert steps[f"layer2.1.conv{main}"].z == last.out
    kinds = [s.kind for s in plan.steps]
    assert kinds[-3:] == ["avgpool", "cast", "conv"] and "maxpool" not in kinds
    assert plan.values[plan.output].shape == (10, 1, 1) and plan.values[plan.output].dtype == "fp32"
    assert steps["fc"].precision == "fp32" and steps["conv1"].precision == "fp16"


@pytest.mark.parametrize("depth", [18, 50])
@pytest.mark.parametrize("stem", ["cifar", "imagenet"])
def test_plan_shapes_strides_and_flops_follow_torchvision(depth, stem):
    size = 32 if stem == "cifar" else 64
    plan = _plan(depth, stem, "bf16", size)
    steps = {s.name: s for s in plan.conv_steps()}
    mid = "conv1" if depth == 18 else "conv2"
    for stage in (2, 3, 4):
        assert steps[f"layer{stage}.0.{mid}"].stride == 2 and steps[f"layer{stage}.0.downsample.0"].stride == 2
        assert steps[f"layer{stage}.1.{mid}"].stride == 1
    assert steps["layer1.0.conv1"].stride == 1
    first = plan.values[steps["layer1.0.conv1"].x].shape
    assert first == ((64, 32, 32) if stem == "cifar" else (64, 16, 16))
    assert ("maxpool" in [s.kind for s in plan.steps]) == (stem == "imagenet")
    width = 512 * (1 if depth == 18 else 4)
    assert plan.values[steps["fc"].x].shape == (width, 1, 1)
    # Every conv's output shape as cuDNN's shape arithmetic gives it (conv_output_shape needs no GPU).
    for s in plan.conv_steps():
        c, h, w = plan.values[s.x].shape
        k, p, q = plan.values[s.out].shape
        spec = conv.ConvSpec(stride=s.stride, padding=s.padding, layout="NCHW", precision=s.precision,
                             algo="heuristic", engine="legacy")
        assert conv.conv_output_shape((3, c, h, w), (k, c, s.kernel, s.kernel), spec) == (3, k, p, q), s.name
    # ResNet-18 with the CIFAR stem: 0.556 GMAC per image (2 FLOPs per MAC), counted from the shapes.
    if depth == 18 and stem == "cifar":
        assert plan.conv_flops(1) == 1_110_845_440 and plan.conv_flops(8) == 8 * 1_110_845_440


def test_plan_validates_the_state_dict_and_its_arguments():
    state = rn.ResNet18(num_classes=10, seed=0).state_dict()
    with pytest.raises(ValueError, match=r"stem: expected one of"):
        build_plan(state, "tiny")
    with pytest.raises(ValueError, match="precision"):
        build_plan(state, "cifar", "fp8")
    with pytest.raises(ValueError, match="image_size"):
        build_plan(state, "cifar", "fp16", (32,))
    with pytest.raises(ValueError, match=r"the 'imagenet' stem is a 7x7"):
        build_plan(state, "imagenet")
    with pytest.raises(TypeError, match="state: expected a state_dict"):
        build_plan([("conv1.weight", 0)])
    broken = dict(state)
    del broken["layer3.1.bn2.running_var"]
    with pytest.raises(ValueError, match=r"missing 'layer3.1.bn2.running_var'"):
        build_plan(broken)
    broken = dict(state, **{"layer2.0.bn1.bias": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"layer2.0.bn1.bias.*expected shape \(128,\)"):
        build_plan(broken)
    broken = {k: v for k, v in state.items() if not k.startswith("layer2.0.downsample")}
    with pytest.raises(ValueError, match="a downsample is missing|expected a square"):
        build_plan(broken)


# ------------------------------------------------------------------------------------------------------------
# Buffers


@pytest.mark.parametrize("depth", [18, 50])
@pytest.mark.parametrize("stem", ["cifar", "imagenet"])
def test_buffers_never_hold_two_live_values_and_stay_few(depth, stem):
    plan = _plan(depth, stem, "fp16", 32 if stem == "cifar" else 64)
    assignment = plan_buffers(plan)
    ranges = live_ranges(plan)
    assert ranges[plan.input][0] == -1 and ranges[plan.output][1] == len(plan.steps)
    for a in range(len(plan.values)):
        assert assignment.sizes[assignment.buffer_of[a]] >= plan.values[a].bytes_per_sample
        for b in range(a + 1, len(plan.values)):
            if assignment.buffer_of[a] == assignment.buffer_of[b]:
                (fa, la), (fb, lb) = ranges[a], ranges[b]
                assert la < fb or lb < fa, (a, b, ranges[a], ranges[b])
    # A step's output is never in the buffer of one of its inputs (the ops forbid overlap).
    for s in plan.steps:
        assert all(assignment.buffer_of[s.out] != assignment.buffer_of[v] for v in s.inputs), s.name
    assert len(assignment.sizes) <= 4
    largest = max(v.bytes_per_sample for v in plan.values)
    assert assignment.bytes_per_sample <= 3 * largest


def test_assign_buffers_reuses_freed_buffers_best_fit():
    # values: 0 [0, 1], 1 [1, 2], 2 [2, 3] (small), 3 [3, 4] (big)
    got = assign_buffers([100, 100, 10, 300], [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert got.buffer_of[0] != got.buffer_of[1]
    assert got.buffer_of[2] == got.buffer_of[0]  # free from step 2 on
    assert got.buffer_of[3] == got.buffer_of[1] and got.sizes[got.buffer_of[3]] == 300  # grown
    assert len(got.sizes) == 2
    with pytest.raises(ValueError, match="one of each per value"):
        assign_buffers([1, 2], [(0, 1)])


# ------------------------------------------------------------------------------------------------------------
# The plan bound into shared buffers, on the NumPy references


def _host_forward(plan, state, layout, batch, *, storage=False):
    """bind_forward over host buffers shared as plan_buffers assigns them, with the NumPy op references: float64
    values (storage=False), or each value in its storage dtype in byte buffers viewed as the engine views its
    device buffers, with weights rounded to the storage dtype too (fp16 and fp32 plans: NumPy has no bf16)."""
    assignment = plan_buffers(plan)
    if storage:
        arena = [np.zeros(size * batch, np.uint8) for size in assignment.sizes]
    else:
        elements = [0] * len(assignment.sizes)
        for v, value in enumerate(plan.values):
            b = assignment.buffer_of[v]
            elements[b] = max(elements[b], int(np.prod(value.shape)))
        arena = [np.full(batch * n, np.nan) for n in elements]  # NaN: a value read before it is written shows

    def view(v, n):
        value = plan.values[v]
        c, h, w = value.shape
        shape = (n, h, w, c) if layout == "NHWC" else (n, c, h, w)
        if storage:
            return arena[assignment.buffer_of[v]][: n * value.bytes_per_sample].view(ARRAY_DTYPES[value.dtype])\
                .reshape(shape)
        return arena[assignment.buffer_of[v]][: n * c * h * w].reshape(shape)

    weights = {}
    for s in plan.conv_steps():
        w, b = conv_step_params(s, state, layout)
        if storage:  # as the engine uploads them: rounded to float32, then to the storage dtype
            dtype = ARRAY_DTYPES[DTYPE_ALIASES[s.precision]]
            w, b = w.astype(np.float32).astype(dtype), b.astype(np.float32).astype(dtype)
        weights[s.name] = (w, b)
    specs = {s.name: conv.ConvSpec(stride=s.stride, padding=s.padding, layout=layout,
                                   precision=s.precision if storage else "fp32")
             for s in plan.conv_steps()}
    return bind_forward(plan, batch, view, weights, specs, layout)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize(("depth", "stem", "size"), [(18, "cifar", 16), (50, "imagenet", 32)])
def test_bound_plan_equals_the_eval_graph_on_numpy_references(rng, layout, depth, stem, size):
    model = rn.ResNet(depth, 7, stem=stem, layout=layout, seed=1).to_host(np.float64)
    state = randomized_state(model, rng)
    model.load_state_dict(state)
    shape = (3, size, size, 3) if layout == "NHWC" else (3, 3, size, size)
    x = rng.standard_normal(shape)
    expected = model.eval().forward(x)
    plan = build_plan(state, stem, "fp32", size)  # float64 host values: the fp32 plan (the fp16 test runs the cast)
    forward = _host_forward(plan, state, layout, 3)
    forward.input[...] = x
    forward.run()
    assert forward.logits.shape == (3, 7)
    assert np.std(expected) > 1e-3  # the BatchNorms leave a non-trivial network
    np.testing.assert_allclose(forward.logits, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())


def test_bound_plan_in_fp16_storage_stays_close_to_the_fp16_eval_graph(rng):
    # Both round every activation to fp16 (NumPy float16 outputs of float64 references), the plan its folded
    # weights and biases too; the float64 comparison above checks the arithmetic, this one the storage dtypes.
    model = rn.ResNet(18, 10, stem="cifar", layout="NHWC", precision="fp16", seed=2).to_host(np.float64)
    state = randomized_state(model, rng)
    model.load_state_dict(state)
    x = rng.standard_normal((2, 16, 16, 3)).astype(np.float16)
    expected = model.eval().forward(x)
    plan = build_plan(state, "cifar", "fp16", 16)
    forward = _host_forward(plan, state, "NHWC", 2, storage=True)
    assert forward.input.dtype == np.float16 and forward.logits.dtype == np.float32
    forward.input[...] = x
    forward.run()
    error = np.abs(forward.logits - expected).max() / np.abs(expected).max()
    assert error <= 1e-2, error
