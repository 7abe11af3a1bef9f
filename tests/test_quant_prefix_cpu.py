"""A float prefix before the 8-bit part (quantize_from, quantization/prefix.py) on a tiny random ResNet-18: the
engine's plan (which steps run quantised, the values' dtypes, where the quantise step sits, the input stage's kind,
the buffers) and the host simulation (float up to the boundary, the boundary quantised once, the suffix quantised;
'stem' as before)."""

import dataclasses

import numpy as np
import pytest
from quant_helpers import tiny_resnet18_state

from resnet_native.inference import build_plan, simulate
from resnet_native.inference.buffers import plan_buffers
from resnet_native.inference.quantized import (
    INPUT_CHANNELS,
    PREFIX_PRECISION,
    boundary_quantize,
    quantized_convs,
    quantized_plan,
    residual_scratch_elements,
)
from resnet_native.inference.simulate import (
    calibrate,
    fake_quantize,
    float_logits,
    quantized_steps,
    simulate_logits,
    value_names,
)
from resnet_native.quantization.prefix import (
    FLOAT,
    MIN_GAIN_OVER_FLOAT,
    QUANTIZE_FROM,
    boundary_value,
    fastest,
    first_quantized_step,
)

PREFIXED = QUANTIZE_FROM[1:]  # 'layer1' ... 'layer4'


@pytest.fixture(scope="module")
def problem():
    state = tiny_resnet18_state()
    images = np.random.default_rng(1).standard_normal((3, 3, 32, 32))
    return state, images, calibrate(state, images, "max", dtype="int8", batch_size=3)


def test_the_boundary_is_the_input_of_the_first_quantised_stage(problem):
    state, _, _ = problem
    plan = build_plan(state, "cifar", "fp32")
    names = value_names(plan)
    assert boundary_value(plan, "stem") == plan.input and first_quantized_step(plan, "stem") == 0
    assert names[boundary_value(plan, "layer1")] == "conv1"  # the stem's output
    for stage in (2, 3, 4):
        assert names[boundary_value(plan, f"layer{stage}")] == f"layer{stage - 1}.1.conv2"
        assert plan.steps[first_quantized_step(plan, f"layer{stage}")].name.startswith(f"layer{stage}.0.")
    with pytest.raises(ValueError, match="quantize_from"):
        first_quantized_step(plan, "layer5")


@pytest.mark.parametrize("quantize_from", PREFIXED)
def test_a_prefixed_plan_runs_fp16_then_quantises_once(problem, quantize_from):
    state, _, calibration = problem
    plan = build_plan(state, "cifar", "fp32")
    qplan = quantized_plan(plan, "int8", quantize_from)
    start, boundary = first_quantized_step(plan, quantize_from), boundary_value(plan, quantize_from)
    assert len(qplan.steps) == len(plan.steps) + 1 and len(qplan.values) == len(plan.values) + 1
    quantize = qplan.steps[start]
    assert (quantize.kind, quantize.x, quantize.out) == ("quantize", boundary, boundary + 1)
    assert [s.kind for s in qplan.steps].count("quantize") == 1
    # The prefix: the fp16 engine's convolutions and values, the fp16 input (the float input stage's).
    assert all(s.precision == PREFIX_PRECISION for s in qplan.steps[:start] if s.kind == "conv")
    assert all(v.dtype == "fp16" for v in qplan.values[:boundary + 1])
    assert qplan.values[qplan.input].shape == (3, 32, 32)
    # The suffix: every convolution but the classifier reads 8-bit values, the boundary's copy first.
    suffix = qplan.steps[start + 1:]
    assert [s.name for s in suffix] == [s.name for s in plan.steps[start:]]
    for s in suffix:
        if s.kind == "conv" and s.bn is not None:
            assert all(qplan.values[v].dtype == "int8" for v in s.inputs), s.name
    assert any(s.x == boundary + 1 for s in suffix) and not any(boundary in s.inputs for s in suffix)
    assert qplan.values[qplan.output].dtype == "fp32" and qplan.values[qplan.output - 1].dtype == "fp32"
    # The engine's operands: the suffix's convolutions, and the quantise step at the boundary's scale.
    convs = quantized_convs(plan, state, calibration, "int8", np.asarray, quantize_from)
    assert set(convs) == {s.name for s in quantized_steps(plan, quantize_from)}
    assert "conv1" not in convs
    q = boundary_quantize(plan, calibration, "int8", quantize_from, 2, np.zeros)
    assert q.zeros.dtype == np.int8 and q.zeros.size == 2 * np.prod(plan.values[boundary].shape) and not q.zeros.any()
    assert q.inv_scale == pytest.approx(1 / calibration.activation_scales[value_names(plan)[boundary]])
    assert residual_scratch_elements(plan, quantize_from) <= residual_scratch_elements(plan, "stem")
    buffers = plan_buffers(qplan)  # the new value's life is checked like any other's
    assert buffers.buffer_of[boundary] != buffers.buffer_of[boundary + 1]


def test_quantize_from_stem_is_the_plan_of_before(problem):
    state, _, _ = problem
    plan = build_plan(state, "cifar", "fp32")
    qplan = quantized_plan(plan, "fp8", "stem")
    assert qplan == quantized_plan(plan, "fp8") and qplan.steps == plan.steps
    assert qplan.values[qplan.input] == dataclasses.replace(plan.values[0], shape=(INPUT_CHANNELS, 32, 32),
                                                            dtype="fp8")
    assert not any(s.kind == "quantize" for s in qplan.steps)


def test_the_imagenet_stem_is_quantised_only_after_a_prefix():
    state = tiny_resnet18_state()
    state["conv1.weight"] = np.zeros((8, 3, 7, 7), np.float32)
    plan = build_plan(state, "imagenet", "fp32", 64)
    with pytest.raises(ValueError, match="quantize_from='layer1'"):
        quantized_plan(plan, "int8")
    qplan = quantized_plan(plan, "int8", "layer1")
    assert qplan.steps[1].kind == "maxpool" and qplan.values[qplan.steps[1].out].dtype == "fp16"


def _recorded(monkeypatch, run):
    """run() with every value simulate._run produces recorded (after on_value changed it): {value: array}."""
    seen, original = {}, simulate._run

    def recording(plan, images, weights, on_value, batch_size, device="host"):
        def record(v, array):
            on_value(v, array)
            seen[v] = np.array(array)

        return original(plan, images, weights, record, batch_size, device)

    monkeypatch.setattr(simulate, "_run", recording)
    logits = run()
    monkeypatch.setattr(simulate, "_run", original)
    return logits, seen


def test_the_simulated_prefix_is_the_float_forward_up_to_the_boundary(problem, monkeypatch):
    state, images, calibration = problem
    plan = build_plan(state, "cifar", "fp32")
    boundary = boundary_value(plan, "layer4")
    f, floats = _recorded(monkeypatch, lambda: float_logits(state, images, batch_size=3))
    q, quants = _recorded(monkeypatch, lambda: simulate_logits(state, images, calibration, batch_size=3,
                                                               quantize_from="layer4"))
    for v in range(boundary):
        assert np.array_equal(quants[v], floats[v]), value_names(plan)[v]
    scale = calibration.activation_scales[value_names(plan)[boundary]]
    assert np.array_equal(quants[boundary], fake_quantize(floats[boundary], scale, "int8"))
    assert not np.array_equal(quants[boundary], floats[boundary])
    assert not np.array_equal(q, f)  # the suffix is quantised
    everything = simulate_logits(state, images, calibration, batch_size=3)
    print(f"relative logits error: stem {np.linalg.norm(everything - f) / np.linalg.norm(f):.4f}, "
          f"layer4 {np.linalg.norm(q - f) / np.linalg.norm(f):.4f}")


def test_quantize_from_stem_simulates_as_before(problem):
    """The function of before, spelled out: every quantised convolution's weight and every value it reads."""
    state, images, calibration = problem
    plan = simulate._plan(state, "cifar", images)
    scales = simulate.activation_scales(plan, calibration)
    weights = simulate._float_weights(plan, state)
    for s in plan.conv_steps()[:-1]:
        w, b = weights[s.name]
        weights[s.name] = (fake_quantize(w, np.asarray(calibration.weight_scales[s.name]), "int8", axis=0), b)

    def quantize(v, array):
        if v in scales:
            array[...] = fake_quantize(array, scales[v], "int8")

    before = simulate._run(plan, images, weights, quantize, 3)
    assert len(scales) == len({v for s in plan.conv_steps()[:-1] for v in s.inputs})
    assert np.array_equal(simulate_logits(state, images, calibration, batch_size=3, quantize_from="stem"), before)


def test_auto_keeps_the_fp16_plan_unless_an_8bit_candidate_is_clearly_faster():
    edge = 1.0 - MIN_GAIN_OVER_FLOAT
    assert fastest({"stem": 0.99, "layer1": 0.98, FLOAT: 1.0}) == FLOAT  # within the noise: fp16 kept
    assert fastest({"stem": 0.99, "layer1": edge - 1e-6, FLOAT: 1.0}) == "layer1"
    assert fastest({"stem": 1.2, FLOAT: 1.0}) == FLOAT
    assert fastest({"stem": 0.5, "layer1": 0.6}) == "stem"  # no fp16 plan timed: the fastest
