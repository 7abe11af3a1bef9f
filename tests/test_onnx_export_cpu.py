"""ONNX export without a GPU: the exported graph, run by onnxruntime's CPU provider, against the float64 host
forward of the same weights (non-trivial BatchNorms), for ResNet-18/50, both stems, BN folded or not, a dynamic
and a fixed batch; the operators and names it is made of; its metadata (from a model and from a release);
argument validation; and the atomic write."""

import functools
import json
import os
import sys

import numpy as np
import pytest
from test_inference_plan_cpu import randomized_state
from test_release_cpu import make_fake_run

import resnet_native as rn
from resnet_native.formats.release_folder import load_release_config, load_weights
from resnet_native.inference import build_plan
from resnet_native.inference.fold import conv_step_params
from resnet_native.release import build as release
from resnet_native.release import onnx_export
from resnet_native.release.classifier import CLASSES

onnx = pytest.importorskip("onnx", reason='needs the onnx package (pip install "resnet_native[onnx]")')
ort = pytest.importorskip("onnxruntime", reason='needs onnxruntime (pip install "resnet_native[onnx]")')

# Max |onnxruntime - float64| over max |float64 logit|. The graph computes in float32 (unit roundoff 6e-8) from
# weights rounded once to float32; measured at most 1.2e-6 over ResNet-18/50, both stems, BN folded or not, two
# seeds (logits of magnitude 2 to 50). 2e-5 leaves a margin of 16 and still catches small mistakes: a BN eps of
# 1e-4 instead of 1e-5 moves the logits by 5e-4 to 1e-3 of their size (a wrong stride or residual, by far more).
RTOL = 2e-5

CASES = [(18, "cifar", 32), (18, "imagenet", 64), (50, "cifar", 32), (50, "imagenet", 64)]


def session(model):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the tests share the machine
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def relative_error(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@functools.cache
def host_reference(depth, stem, size):
    """(host float64 model in eval mode with randomized BN statistics, its state, a (3, 3, size, size) float32
    batch, its float64 logits), built once per network."""
    rng = np.random.default_rng(depth * 1000 + size)
    model = rn.ResNet(depth, 10, stem=stem, layout="NCHW", seed=depth).to_host(np.float64)
    state = randomized_state(model, rng)
    model.load_state_dict(state)
    model.eval()
    x = rng.standard_normal((3, 3, size, size)).astype(np.float32)
    logits = model.forward(x.astype(np.float64))  # the float32 input exactly: only the network's error is measured
    assert np.std(logits) > 0.1  # a non-trivial network (the BatchNorms neither vanish nor saturate it)
    return model, state, x, logits


@pytest.fixture(params=CASES, ids=[f"resnet{d}-{s}-{n}" for d, s, n in CASES])
def reference(request):
    return host_reference(*request.param)


def expected_ops(stem, fold_bn):
    ops = {"Conv", "Relu", "Add", "GlobalAveragePool", "Flatten", "Gemm"}
    return ops | ({"MaxPool"} if stem == "imagenet" else set()) | (set() if fold_bn else {"BatchNormalization"})


@pytest.mark.parametrize("fold_bn", [True, False], ids=["folded", "batchnorm"])
def test_onnxruntime_matches_the_float64_forward(reference, fold_bn):
    model, state, x, want = reference
    size = x.shape[-1]
    m = rn.export_onnx(model, fold_bn=fold_bn, image_size=size)
    onnx.checker.check_model(m, full_check=True)
    assert m.opset_import[0].version == onnx_export.DEFAULT_OPSET
    (inp,), (out,) = m.graph.input, m.graph.output
    assert (inp.name, out.name) == ("input", "logits")
    assert inp.type.tensor_type.elem_type == out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim] == ["batch", 3, size, size]
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["batch", 10]

    ops = [n.op_type for n in m.graph.node]
    assert set(ops) == expected_ops(model.stem, fold_bn)
    plan = build_plan(state, model.stem, "fp32", size)
    convs = [s for s in plan.conv_steps() if s.bn is not None]
    assert ops.count("Conv") == len(convs) and ops.count("Gemm") == 1
    assert ops.count("BatchNormalization") == (0 if fold_bn else len(convs))
    assert ops.count("Add") == sum(s.z is not None for s in convs) == sum(map(len, model.stages))
    assert ops.count("Relu") == sum(s.relu for s in convs)
    assert all(i.data_type == onnx.TensorProto.FLOAT for i in m.graph.initializer)

    run = session(m)
    got3 = run.run(["logits"], {"input": x})[0]
    got1 = run.run(["logits"], {"input": x[:1]})[0]  # the same dynamic model, another batch size
    assert got3.shape == (3, 10) and got1.shape == (1, 10) and got3.dtype == np.float32
    assert relative_error(got3, want) <= RTOL, relative_error(got3, want)
    assert relative_error(got1, want[:1]) <= RTOL, relative_error(got1, want[:1])
    np.testing.assert_array_equal(np.argmax(got3, axis=1), np.argmax(want, axis=1))


def test_nodes_and_initializers_are_named_after_the_plan(reference):
    model, state, x, _ = reference
    plan = build_plan(state, model.stem, "fp32", x.shape[-1])
    folded = rn.export_onnx(model, image_size=x.shape[-1])
    convs = {n.name: n for n in folded.graph.node if n.op_type == "Conv"}
    assert list(convs) == [s.name for s in plan.conv_steps() if s.bn is not None]
    assert [n.name for n in folded.graph.node if n.op_type == "Gemm"] == ["fc"]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in folded.graph.initializer}
    step = plan.conv_steps()[3]
    w, b = conv_step_params(step, state, "NCHW")  # folded in float64, rounded once to float32
    np.testing.assert_array_equal(inits[f"{step.name}.weight_folded"], w.astype(np.float32))
    np.testing.assert_array_equal(inits[f"{step.name}.bias_folded"], b.astype(np.float32))
    assert list(convs[step.name].input) == [convs[step.name].input[0], f"{step.name}.weight_folded",
                                            f"{step.name}.bias_folded"]
    np.testing.assert_array_equal(inits["fc.weight"], state["fc.weight"].astype(np.float32))

    plain = rn.export_onnx(model, fold_bn=False, image_size=x.shape[-1])
    bns = [n for n in plain.graph.node if n.op_type == "BatchNormalization"]
    assert [n.name for n in bns] == [s.bn for s in plan.conv_steps() if s.bn is not None]
    eps = [a.f for n in bns for a in n.attribute if a.name == "epsilon"]
    assert len(eps) == len(bns) and eps == pytest.approx([1e-5] * len(bns), rel=1e-6)  # a float32 attribute
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in plain.graph.initializer}
    for field in ("weight", "bias", "running_mean", "running_var"):
        np.testing.assert_array_equal(inits[f"layer1.0.bn2.{field}"],
                                      state[f"layer1.0.bn2.{field}"].astype(np.float32))


def test_every_supported_opset_runs_the_same():
    # The unfolded graph of the imagenet stem holds every operator the exporter writes.
    model, _, x, want = host_reference(18, "imagenet", 64)
    opsets = onnx_export.supported_opsets()
    assert opsets.start == 13 and opsets.stop - 1 == min(21, onnx.defs.onnx_opset_version())
    for opset in opsets:
        m = rn.export_onnx(model, opset=opset, fold_bn=False, image_size=64)
        assert m.opset_import[0].version == opset and len({n.op_type for n in m.graph.node}) == 8
        # The IR version is the oldest that carries the opset, so older runtimes read it.
        assert m.ir_version == onnx.helper.find_min_ir_version_for(m.opset_import)
        got = session(m).run(["logits"], {"input": x})[0]
        assert relative_error(got, want) <= RTOL, (opset, relative_error(got, want))


def test_a_fixed_batch():
    model, _, x, want = host_reference(18, "cifar", 32)
    m = rn.export_onnx(model, dynamic_batch=False, image_size=x.shape[-1])
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, x.shape[-1], x.shape[-1]] and not any(d.dim_param for d in
                                                                m.graph.input[0].type.tensor_type.shape.dim)
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == [1, 10]
    run = session(m)
    assert relative_error(run.run(["logits"], {"input": x[:1]})[0], want[:1]) <= RTOL
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        run.run(["logits"], {"input": x})


def test_metadata_of_a_model():
    m = rn.export_onnx(rn.ResNet18(num_classes=7, stem="imagenet", seed=0), image_size=(48, 40))
    props = {p.key: p.value for p in m.metadata_props}
    assert m.producer_name == "resnet_native" and m.producer_version == rn.__version__
    assert props["model"] == "resnet18" and props["stem"] == "imagenet" and props["num_classes"] == "7"
    assert props["image_size"] == "48x40" and props["fold_bn"] == "true" and props["input_layout"] == "NCHW"
    assert "classes" not in props and "mean" not in props  # a model does not know its normalisation
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim][1:] == [3, 48, 40]


def test_export_from_a_release_reads_its_metadata(tmp_path):
    make_fake_run(tmp_path / "run", layout="NHWC", precision="fp16")
    path = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    out = tmp_path / "out" / "r18.onnx"
    m = rn.export_onnx(path, out, fold_bn=False)
    by_name = rn.export_onnx("A", models_dir=tmp_path / "models", fold_bn=False)
    assert by_name.SerializeToString() == m.SerializeToString() == out.read_bytes()
    props = {p.key: p.value for p in m.metadata_props}
    config = load_release_config(path)
    assert props["model"] == "resnet18" and props["version"] == "A" and props["stem"] == "cifar"
    assert json.loads(props["classes"]) == config["classes"] == list(CLASSES)
    assert json.loads(props["mean"]) == config["input"]["mean"] and json.loads(props["std"]) == config["input"]["std"]
    # The weights are the release's whatever layout and precision it was trained in: NCHW float32 in and out.
    host = rn.ResNet18(num_classes=10, layout="NCHW").to_host(np.float64)
    host.load_state_dict(load_weights(path))
    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    want = host.eval().forward(x.astype(np.float64))
    assert relative_error(session(m).run(["logits"], {"input": x})[0], want) <= RTOL


def test_arguments_are_validated(tmp_path):
    model = rn.ResNet18(num_classes=10, seed=0)
    for bad, error in [("17", TypeError), (True, TypeError), (17.0, TypeError), (12, ValueError),
                       (onnx_export.supported_opsets().stop, ValueError)]:
        with pytest.raises(error, match="opset"):
            rn.export_onnx(model, opset=bad)
    for name in ("dynamic_batch", "fold_bn"):
        with pytest.raises(TypeError, match=name):
            rn.export_onnx(model, **{name: 1})
    with pytest.raises(TypeError, match="path"):
        rn.export_onnx(model, 3)
    with pytest.raises(ValueError, match="path"):
        rn.export_onnx(model, "")
    with pytest.raises(ValueError, match="path: .* is a folder"):
        rn.export_onnx(model, tmp_path)
    with pytest.raises(TypeError, match="model_or_release"):
        rn.export_onnx(3.0)
    with pytest.raises(TypeError, match="model_or_release"):
        rn.export_onnx(model.state_dict())
    with pytest.raises(FileNotFoundError, match="version_Z"):
        rn.export_onnx("Z", models_dir=tmp_path)
    with pytest.raises(ValueError, match="image_size"):
        rn.export_onnx(model, image_size=0)
    assert list(tmp_path.iterdir()) == []  # nothing was written by any of them


def test_the_write_is_atomic(tmp_path, monkeypatch):
    model = rn.ResNet18(num_classes=10, seed=0)
    target = tmp_path / "m.onnx"
    written = rn.export_onnx(model, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    assert onnx.load(str(target)) == written
    before = target.read_bytes()

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)  # after the bytes are in the temporary file
    with pytest.raises(OSError, match="disk full"):
        rn.export_onnx(rn.ResNet18(num_classes=10, seed=1), target)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"] and target.read_bytes() == before

    def invalid(*args, **kwargs):
        raise onnx.checker.ValidationError("broken graph")

    monkeypatch.setattr(onnx.checker, "check_model", invalid)  # a graph that fails the checker is never written
    with pytest.raises(onnx.checker.ValidationError):
        rn.export_onnx(model, tmp_path / "other.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_without_onnx_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    with pytest.raises(ImportError, match=r'pip install "resnet_native\[onnx\]"'):
        rn.export_onnx(rn.ResNet18(num_classes=10))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r'onnxruntime.*pip install "resnet_native\[onnx\]"'):
        onnx_export.import_onnxruntime()


def test_importing_the_package_imports_neither_onnx_nor_onnxruntime(tmp_path):
    from conftest import run_child

    script = "import sys, resnet_native\nprint(sorted(m for m in ('onnx', 'onnxruntime') if m in sys.modules))"
    stdout = run_child(script, tmp_path)
    assert stdout.strip() == "[]"
