"""ONNX export of a ResNet, from its weights alone: a standard graph for onnxruntime, TensorRT and other runtimes.

    import resnet_native as rn
    proto = rn.export_onnx("cifar10_models/version_A", "resnet18.onnx")     # a release, or a ResNet object
    # onnxruntime.InferenceSession("resnet18.onnx").run(["logits"], {"input": x})   x: (N, 3, 32, 32) float32

The graph is the inference plan (inference/plan.py) written out in plain operators, so the engine and the export
cannot disagree about the network, and the graph needs no GPU and no custom op: Conv (BatchNorm folded in float64,
inference/fold.py), Add, Relu, MaxPool, GlobalAveragePool, Flatten, Gemm, every initializer rounded once to float32.
Input 'input' is the normalised image, float32 NCHW, what a release's preprocess.py returns with layout='NCHW';
output 'logits' is (N, num_classes) float32 before the softmax. The metadata (model.metadata_props) carry the
model's name, stem, classes and, from a release, its version, class names and normalisation.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from .._core.files import atomic_write_bytes
from .._core.names import flag, whole_number
from .._core.version import __version__
from ..inference.fold import BN_EPS, conv_step_params
from ..inference.plan import build_plan
from ..inference.source import model_source

INSTALL_HINT = 'pip install "resnet_native[onnx]"'
INPUT, OUTPUT, BATCH = "input", "logits", "batch"
DEFAULT_OPSET = 17
# Every operator used here computes the same on float32 from opset 13 on (Flatten-13 and Gemm-13 are the newest
# definitions that matter; later versions add input types or training outputs). Later opsets add nothing this graph
# needs, and a runtime refuses an opset newer than its own, so the newest offered is 21 (onnxruntime 1.18 and
# later), or the installed onnx's newest if that is older. The default, 17, loads in every onnxruntime >= 1.17.
MIN_OPSET, MAX_OPSET = 13, 21
PRODUCER = "resnet_native"


def import_onnx():
    """The onnx module, or an ImportError that says how to install it."""
    try:
        import onnx
    except ImportError as e:
        raise ImportError(f"ONNX export needs the onnx package, which is not installed: {INSTALL_HINT}") from e
    return onnx


def import_onnxruntime():
    """The onnxruntime module, or an ImportError that says how to install it."""
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(f"running an ONNX model needs onnxruntime, which is not installed: {INSTALL_HINT}") from e
    return onnxruntime


def supported_opsets() -> range:
    """The opsets export_onnx writes: MIN_OPSET up to MAX_OPSET or the installed onnx's newest, if older."""
    onnx = import_onnx()
    return range(MIN_OPSET, min(MAX_OPSET, onnx.defs.onnx_opset_version()) + 1)


def _check_opset(opset) -> int:
    opsets = supported_opsets()
    opset = whole_number("opset", opset)
    if opset not in opsets:
        raise ValueError(f"opset: expected {opsets.start}..{opsets.stop - 1}, got {opset}")
    return opset


def _check_path(path) -> pathlib.Path | None:
    if path is None:
        return None
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path: expected a str or os.PathLike (the .onnx file to write) or None, got "
                        f"{type(path).__name__}")
    text = os.fsdecode(os.fspath(path))
    if not text:
        raise ValueError("path: expected a file name, got an empty string")
    p = pathlib.Path(text)
    if p.is_dir():
        raise ValueError(f"path: {p} is a folder; expected the .onnx file to write")
    return p


class _GraphBuilder:
    """Nodes and float32 initializers of the plan, each node named after the plan step (or BN) it comes from."""

    def __init__(self, onnx, plan, state: dict, fold_bn: bool):
        self.helper, self.numpy_helper = onnx.helper, onnx.numpy_helper
        self.plan, self.state, self.fold_bn = plan, state, fold_bn
        self.nodes, self.initializers = [], []
        # A value's tensor is named after the step that produces it; the input and the logits by the graph's names.
        self.value_names = {s.out: s.name for s in plan.steps}
        self.value_names[plan.input], self.value_names[plan.output] = INPUT, OUTPUT

    def initializer(self, name: str, array) -> str:
        # Folded in float64 (or read from the state's float32 masters), rounded to float32 once here.
        self.initializers.append(self.numpy_helper.from_array(np.ascontiguousarray(array, np.float32), name))
        return name

    def node(self, op: str, inputs: list, output: str, name: str, **attrs) -> str:
        self.nodes.append(self.helper.make_node(op, inputs, [output], name=name, **attrs))
        return output

    def build(self):
        for step in self.plan.steps:
            if step.kind == "conv":
                (self.classifier if step.bn is None else self.conv)(step)
            elif step.kind == "maxpool":
                k, s, p = step.kernel, step.stride, step.padding
                self.node("MaxPool", [self.value_names[step.x]], self.value_names[step.out], step.name,
                          kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])
            elif step.kind == "avgpool":
                self.node("GlobalAveragePool", [self.value_names[step.x]], self.value_names[step.out], step.name)
            else:  # a fp32 plan casts nothing (plan.CastStep only bridges a low-precision network to its classifier)
                raise AssertionError(f"{step.name}: unexpected {step.kind!r} step in a fp32 plan")
        return self.nodes, self.initializers

    def conv(self, step) -> None:
        x, out = self.value_names[step.x], self.value_names[step.out]
        k, s, p = step.kernel, step.stride, step.padding
        geometry = dict(kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p], dilations=[1, 1], group=1)
        # The Conv's own output tensor is `out` unless the BN, the residual or the ReLU still follow it.
        chain = ["conv", *(op for op, on in (("bn", not self.fold_bn), ("add", step.z is not None),
                                            ("relu", step.relu)) if on)]
        names = {op: f"{step.name}.{op}" for op in chain}
        names[chain[-1]] = out
        if self.fold_bn:
            w, b = conv_step_params(step, self.state, "NCHW")
            inputs = [x, self.initializer(f"{step.name}.weight_folded", w),
                      self.initializer(f"{step.name}.bias_folded", b)]
            y = self.node("Conv", inputs, names["conv"], step.name, **geometry)
        else:
            y = self.node("Conv", [x, self.initializer(step.weight, self.state[step.weight])], names["conv"],
                          step.name, **geometry)
            stats = [self.initializer(f"{step.bn}.{f}", self.state[f"{step.bn}.{f}"])
                     for f in ("weight", "bias", "running_mean", "running_var")]
            y = self.node("BatchNormalization", [y, *stats], names["bn"], step.bn, epsilon=BN_EPS)
        if step.z is not None:
            y = self.node("Add", [y, self.value_names[step.z]], names["add"], f"{step.name}.add")
        if step.relu:
            self.node("Relu", [y], names["relu"], f"{step.name}.relu")

    def classifier(self, step) -> None:
        flat = self.node("Flatten", [self.value_names[step.x]], f"{step.name}.flatten", f"{step.name}.flatten",
                         axis=1)
        # Gemm's transB reads the (classes, C) weight as torch stores it: logits = flat @ weight.T + bias.
        weight = self.initializer(step.weight, self.state[step.weight])
        bias = self.initializer(step.bias, self.state[step.bias])
        self.node("Gemm", [flat, weight, bias], self.value_names[step.out], step.name, transB=1)


def _metadata(source, plan, image_size: tuple, fold_bn: bool) -> dict:
    props = {"model": source.name, "stem": source.stem, "num_classes": str(plan.num_classes),
             "image_size": f"{image_size[0]}x{image_size[1]}", "fold_bn": str(fold_bn).lower(),
             "input_layout": "NCHW",
             "input": "normalised RGB image, float32 NCHW: (pixel / 255 - mean) / std per channel"}
    config = source.config
    if config is not None:
        props["version"] = str(config.get("version", ""))
        if "classes" in config:
            props["classes"] = json.dumps([str(c) for c in config["classes"]])
        normalisation = config.get("input") or {}
        for key in ("mean", "std"):
            if key in normalisation:
                props[key] = json.dumps([float(v) for v in normalisation[key]])
    return props


def export_onnx(model_or_release, path=None, *, opset: int = DEFAULT_OPSET, dynamic_batch: bool = True,
                fold_bn: bool = True, models_dir=None, image_size=32):
    """The ONNX model (onnx.ModelProto) of a resnet_native ResNet, a release folder, or a release version name
    ('A', looked up in models_dir like CIFAR10Classifier does), checked by onnx.checker; written atomically to
    `path` when given.

    opset: MIN_OPSET..MAX_OPSET (supported_opsets()). dynamic_batch: the batch dimension is the symbolic 'batch'
    (else 1). fold_bn: BatchNorm folded into the convolutions (else Conv then BatchNormalization with the running
    statistics). image_size: the input's height and width, an int or a pair (32 for CIFAR-10). ONNX convolutions
    are NCHW, so the input is NCHW whatever layout the model was trained in.
    """
    onnx = import_onnx()
    opset = _check_opset(opset)
    dynamic_batch = flag("dynamic_batch", dynamic_batch)
    fold_bn = flag("fold_bn", fold_bn)
    target = _check_path(path)
    source = model_source(model_or_release, models_dir)
    plan = build_plan(source.state, source.stem, precision="fp32", image_size=image_size)
    height, width = plan.values[plan.input].shape[1:]
    nodes, initializers = _GraphBuilder(onnx, plan, source.state, fold_bn).build()

    helper, f32 = onnx.helper, onnx.TensorProto.FLOAT
    batch = BATCH if dynamic_batch else 1
    graph = helper.make_graph(
        nodes, source.name,
        [helper.make_tensor_value_info(INPUT, f32, [batch, 3, height, width],
                                       doc_string="normalised RGB image, (pixel / 255 - mean) / std, NCHW")],
        [helper.make_tensor_value_info(OUTPUT, f32, [batch, plan.num_classes], doc_string="class logits")],
        initializer=initializers,
        doc_string=f"{source.description}: {source.stem} stem, {plan.num_classes} classes, "
                   f"{'BN folded into the convolutions' if fold_bn else 'BatchNormalization in eval mode'}")
    # The IR version follows the opset (the oldest IR that carries it), so runtimes older than this onnx read it.
    model = helper.make_model_gen_version(graph, producer_name=PRODUCER, producer_version=__version__,
                                          opset_imports=[helper.make_opsetid("", opset)],
                                          doc_string="resnet_native ResNet; input: the normalised image in NCHW")
    helper.set_model_props(model, _metadata(source, plan, (height, width), fold_bn))
    onnx.checker.check_model(model, full_check=True)  # shape inference too: a wrong graph never reaches the disk
    if target is not None:
        data = model.SerializeToString()
        atomic_write_bytes(target, lambda f: f.write(data))
    return model
