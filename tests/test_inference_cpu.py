"""The inference engine's host half, without a GPU: BatchNorm folding against a float64 NumPy conv-then-BN, the
plan of ResNet-18/50 (which convolutions fuse what, shapes, FLOPs), liveness buffer assignment, the plan bound
into shared buffers and run on the NumPy references against the model's own eval graph, batch chunking, input
checks, and the argument validation of InferenceEngine and normalize_u8 (everything is checked before any
device access)."""

import conv_reference as ref
import numpy as np
import pytest
import yaml
from fake_arrays import FakeCudaArray

import resnet_native as rn
from resnet_native import conv
from resnet_native.inference import (
    InferenceEngine,
    assign_buffers,
    build_plan,
    filter_in_layout,
    fold_batch_norm,
    live_ranges,
    model_source,
    normalize_u8,
    plan_buffers,
)
from resnet_native.inference.engine import batch_chunks
from resnet_native.inference.fold import BN_EPS, conv_step_params, fold_from_state
from resnet_native.inference.input_stage import CAST, COPY, NORMALIZE, InputStage
from resnet_native.inference.runner import bind_forward
from resnet_native.names import ARRAY_DTYPES, DTYPE_ALIASES


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


def _bn_reference(y, gamma, beta, mean, var):
    shape = (1, -1, 1, 1)
    return (y - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + BN_EPS) * gamma.reshape(shape) + beta.reshape(
        shape)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("geometry", [(3, 1, 1), (1, 2, 0), (7, 2, 3)], ids=["3x3", "1x1s2", "7x7s2"])
def test_folded_conv_plus_bias_equals_conv_then_batch_norm(rng, layout, geometry):
    r, stride, pad = geometry
    x = rng.standard_normal((2, 5, 9, 9))
    w = rng.standard_normal((6, 5, r, r))
    gamma, beta = rng.uniform(0.5, 1.5, 6), rng.uniform(-1, 1, 6)
    mean, var = rng.uniform(-3, 3, 6), rng.uniform(0.01, 9, 6)
    expected = _bn_reference(ref.conv2d(x, w, (stride, stride), (pad, pad)), gamma, beta, mean, var)

    wf, bf = fold_batch_norm(w, gamma, beta, mean, var)
    assert wf.dtype == bf.dtype == np.float64 and wf.shape == w.shape and bf.shape == (6,)
    w_layout = filter_in_layout(wf, layout)
    assert w_layout.flags.c_contiguous
    assert w_layout.shape == ((6, r, r, 5) if layout == "NHWC" else (6, 5, r, r))
    # The folded filter in the layout, read back as the layout's ops read it, convolved and biased.
    w_kcrs = w_layout.transpose(0, 3, 1, 2) if layout == "NHWC" else w_layout
    got = ref.conv2d(ref.from_layout(ref.to_layout(x, layout), layout), w_kcrs, (stride, stride), (pad, pad))
    got = got + bf.reshape(1, -1, 1, 1)
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


# ------------------------------------------------------------------------------------------------------------
# Calls: chunks and input checks


def test_batches_are_padded_to_a_captured_size_or_split():
    sizes = (4, 8)
    assert batch_chunks(0, sizes, True) == []
    assert batch_chunks(3, sizes, False) == [(0, 3, 4)]
    assert batch_chunks(4, sizes, False) == [(0, 4, 4)]
    assert batch_chunks(5, sizes, False) == [(0, 5, 8)]
    assert batch_chunks(8, sizes, False) == [(0, 8, 8)]
    assert batch_chunks(19, sizes, True) == [(0, 8, 8), (8, 8, 8), (16, 3, 4)]
    assert batch_chunks(21, sizes, True) == [(0, 8, 8), (8, 8, 8), (16, 5, 8)]
    with pytest.raises(ValueError, match=r"batch of 9 is over the largest captured batch size 8 and split=False"):
        batch_chunks(9, sizes, False)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_input_stage_accepts_pixels_and_batches_and_names_what_is_wrong(layout):
    stage = InputStage("bf16", layout, (32, 24), lut=None)
    sample = (32, 24, 3) if layout == "NHWC" else (3, 32, 24)
    assert stage.sample_shape == sample
    assert stage.kind_of(np.zeros((2, 32, 24, 3), np.uint8)) == NORMALIZE  # pixels are HWC in any layout
    assert stage.kind_of(np.zeros((2, *sample), np.uint16)) == COPY
    assert stage.kind_of(np.zeros((2, *sample), np.float16)) == CAST
    assert stage.kind_of(np.zeros((2, *sample), np.float32)) == CAST
    with pytest.raises(ValueError, match=r"x: uint8 images must be \(N, 32, 24, 3\)"):
        stage.kind_of(np.zeros((2, 3, 32, 24), np.uint8))
    with pytest.raises(TypeError, match="x: expected uint8 images or a float32"):
        stage.kind_of(np.zeros((2, *sample), np.int32))
    with pytest.raises(ValueError, match=rf"x: expected a {layout} batch of shape"):
        stage.kind_of(np.zeros((2, 32, 32, 3), np.float32))


class _HostDLPack:
    def __dlpack__(self, *args, **kwargs):
        raise AssertionError("not to be read: it is in host memory")

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def test_inputs_that_are_no_device_arrays_are_named():
    pytest.importorskip("cupy")
    from resnet_native.inference.input_stage import as_device_array

    with pytest.raises(TypeError, match="images: expected a cupy array, any __cuda_array_interface__ or DLPack"):
        as_device_array([[0, 1]], "images")
    with pytest.raises(TypeError, match="x: expected a CUDA array, got a .*_HostDLPack in host memory"):
        as_device_array(_HostDLPack())


# ------------------------------------------------------------------------------------------------------------
# Argument validation (before any device access)


def _release_folder(tmp_path, model):
    folder = tmp_path / "version_T"
    folder.mkdir()
    config = {"version": "T", "model": {"name": "resnet18", "num_classes": model.num_classes, "stem": model.stem,
                                        "layout": "NHWC", "dtype": "fp16"}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    np.savez(folder / "model.npz", **model.state_dict())
    return folder


def test_model_source_reads_a_model_or_a_release(tmp_path):
    model = rn.ResNet18(num_classes=6, stem="imagenet", seed=3)
    from_model = model_source(model)
    assert (from_model.stem, from_model.num_classes) == ("imagenet", 6)
    folder = _release_folder(tmp_path, model)
    for release in (folder, str(folder), "T"):
        source = model_source(release, models_dir=tmp_path)
        assert (source.stem, source.num_classes) == ("imagenet", 6)
        assert sorted(source.state) == sorted(from_model.state)
        np.testing.assert_array_equal(source.state["layer4.1.conv2.weight"], from_model.state["layer4.1.conv2.weight"])
    with pytest.raises(FileNotFoundError, match="version 'Z'"):
        model_source("Z", models_dir=tmp_path)
    with pytest.raises(TypeError, match="model_or_release: expected a resnet_native ResNet"):
        model_source(3.5)


def _expect_device_stage():
    if rn.cuda_available():
        pytest.skip("a GPU is present: the engine builds (tests/test_inference_gpu.py)")
    return pytest.raises(rn.NoGPUError)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_sizes": ()}, ValueError, "batch_sizes: expected a non-empty"),
        ({"batch_sizes": (1, 0)}, ValueError, "batch_sizes"),
        ({"batch_sizes": (1, True)}, ValueError, "batch_sizes"),
        ({"batch_sizes": None}, TypeError, "batch_sizes"),
        ({"dtype": "fp8"}, ValueError, "dtype: expected one of"),
        ({"dtype": "float16"}, ValueError, "dtype: expected one of"),
        ({"layout": "NWHC"}, ValueError, "layout: expected one of"),
        ({"split": 1}, TypeError, "split: expected True or False"),
        ({"cuda_graph": "yes"}, TypeError, "cuda_graph"),
        ({"tune_fusion": None}, TypeError, "tune_fusion"),
        ({"deterministic": 0}, TypeError, "deterministic"),
        ({"conv_engine": "cudnn"}, ValueError, "conv_engine: expected one of"),
        ({"algorithm_cache": 5}, TypeError, "algorithm_cache: expected a file path"),
        ({"image_size": 0}, ValueError, "image_size"),
    ],
)
def test_engine_validates_its_arguments_first(kwargs, error, match):
    with pytest.raises(error, match=match):
        InferenceEngine(rn.ResNet18(num_classes=10, seed=0), **kwargs)


def test_engine_with_valid_arguments_gets_to_the_device(tmp_path):
    model = rn.ResNet18(num_classes=10, seed=0)
    with pytest.raises(TypeError, match="model_or_release"):
        InferenceEngine(object())
    with _expect_device_stage():
        InferenceEngine(model, batch_sizes=(8, 1, 8), dtype="bf16", layout="NCHW")
    with _expect_device_stage():
        InferenceEngine(_release_folder(tmp_path, model), dtype="tf32", algorithm_cache=tmp_path / "algos.json")


def _fake(shape, dtype, ptr):
    return FakeCudaArray(shape, dtype, ptr=ptr)


def test_normalize_u8_validates_images_table_and_output():
    images = _fake((2, 4, 5, 3), "uint8", 0x100000)
    lut = _fake((3, 256), "float16", 0x200000)
    out = _fake((2, 4, 5, 3), "float16", 0x300000)
    with pytest.raises(TypeError, match="images: expected a CUDA array"):
        normalize_u8(np.zeros((2, 4, 5, 3), np.uint8), lut, out, layout="NHWC", dtype="fp16")
    with pytest.raises(TypeError, match="images: expected a uint8 array, got float16"):
        normalize_u8(_fake((2, 4, 5, 3), "float16", 0x100000), lut, out, layout="NHWC", dtype="fp16")
    with pytest.raises(ValueError, match=r"images: expected \(N, H, W, 3\)"):
        normalize_u8(_fake((2, 3, 4, 5), "uint8", 0x100000), lut, out, layout="NHWC", dtype="fp16")
    strided = FakeCudaArray((2, 4, 5, 3), "uint8", strides=(120, 30, 6, 2), ptr=0x100000)
    with pytest.raises(ValueError, match="images: expected a C-contiguous array"):
        normalize_u8(strided, lut, out, layout="NHWC", dtype="fp16")
    with pytest.raises(ValueError, match=r"lut: expected shape \(3, 256\)"):
        normalize_u8(images, _fake((256, 3), "float16", 0x200000), out, layout="NHWC", dtype="fp16")
    with pytest.raises(TypeError, match="lut: expected a bfloat16 array"):
        normalize_u8(images, lut, _fake((2, 4, 5, 3), "uint16", 0x300000), layout="NHWC", dtype="bf16")
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3, 4, 5\)"):
        normalize_u8(images, lut, out, layout="NCHW", dtype="fp16")
    with pytest.raises(ValueError, match="layout"):
        normalize_u8(images, lut, out, layout="HWC", dtype="fp16")
    with pytest.raises(ValueError, match="out must not share memory with images"):
        normalize_u8(images, lut, _fake((2, 4, 5, 3), "float16", 0x100010), layout="NHWC", dtype="fp16")
    with pytest.raises(ValueError, match="out must not share memory with lut"):
        normalize_u8(images, lut, _fake((2, 4, 5, 3), "float16", 0x200100), layout="NHWC", dtype="fp16")
    with pytest.raises(rn.NoGPUError if not rn.cuda_available() else TypeError):
        normalize_u8(images, lut, out, layout="NHWC", dtype="fp16")
    lut32 = _fake((3, 256), "float32", 0x200000)
    with pytest.raises(rn.NoGPUError if not rn.cuda_available() else TypeError):
        normalize_u8(images, lut32, _fake((2, 3, 4, 5), "float32", 0x300000), layout="NCHW", dtype="fp32")

