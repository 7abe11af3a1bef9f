"""The fake-quant forward of a tiny random ResNet-18 (CIFAR stem) on a few 32x32 images, int8 and FP8, against the
float64 forward of the same plan.

Tolerance: let d be half a quantisation step at the largest float logit (int8: max|f| / 254; E4M3, 3 mantissa
bits: max|f| * 2**-4). Each of the L quantised values (and its weights) perturbs the logits by about one such
step, independently, so the RMS error should stay below sqrt(L) * d and the largest below twice that. Top-1
agreement on random images is printed, not asserted: random logits are close together, so one step flips some.
"""

import numpy as np
import pytest
from quant_helpers import assert_fp32_simulation_agrees, tiny_resnet18_state

from resnet_native.inference import build_plan
from resnet_native.inference.simulate import calibrate, float_logits, quantized_values, simulate_logits, value_names
from resnet_native.quantization import load_calibration, save_calibration

HALF_STEP = {"int8": 1 / 254, "fp8": 2.0**-4}


@pytest.fixture(scope="module")
def problem():
    state = tiny_resnet18_state()
    images = np.random.default_rng(1).standard_normal((6, 3, 32, 32))
    return state, images, float_logits(state, images, batch_size=4)


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
@pytest.mark.parametrize("method", ["max", "percentile", "entropy"])
def test_fake_quant_logits_within_the_derived_tolerance(problem, dtype, method):
    state, images, f = problem
    cal = calibrate(state, images, method, dtype=dtype, batch_size=4)
    q = simulate_logits(state, images, cal, batch_size=4)
    plan = build_plan(state, "cifar", "fp32")
    d = HALF_STEP[dtype] * np.abs(f).max()
    bound = np.sqrt(len(quantized_values(plan))) * d
    rms, worst = np.sqrt(np.mean((q - f) ** 2)), np.abs(q - f).max()
    print(f"{dtype} {method}: rms {rms:.3g} max {worst:.3g} (bound {bound:.3g}), top-1 agreement "
          f"{np.mean(q.argmax(1) == f.argmax(1)):.2f}")
    assert rms <= bound and worst <= 2 * bound
    assert not np.array_equal(q, f)  # quantisation did happen


def test_calibration_names_the_plan_values_and_survives_a_file(problem, tmp_path):
    state, images, _ = problem
    cal = calibrate(state, images[:2], "max")
    plan = build_plan(state, "cifar", "fp32")
    assert cal.values == value_names(plan) and cal.values[0] == "input"
    assert set(cal.activation_scales) == {value_names(plan)[v] for v in quantized_values(plan)}
    assert "fc" not in cal.weight_scales and len(cal.weight_scales["conv1"]) == 8
    loaded = load_calibration(save_calibration(cal, tmp_path / "cal.json"))
    assert np.array_equal(simulate_logits(state, images[:2], loaded), simulate_logits(state, images[:2], cal))


def test_a_calibration_of_another_network_is_refused(problem):
    state, images, _ = problem
    cal = calibrate(state, images[:1], "max")
    other = tiny_resnet18_state()
    del other["layer4.1.conv1.weight"]
    with pytest.raises(ValueError, match="plan|state"):
        simulate_logits(other, images[:1], cal)
    with pytest.raises(ValueError, match="images"):
        calibrate(state, images[:, :2], "max")


def test_one_shared_pass_calibrates_every_method_and_dtype_as_separate_passes_do(problem):
    """calibrate_many (one float forward watched by every method's observers) gives each (method, dtype) exactly
    the calibration of its own pass; choose_calibrations picks per dtype what choose_calibration picks alone."""
    from resnet_native.inference.calibration_choice import choose_calibration, choose_calibrations
    from resnet_native.inference.simulate import calibrate_many

    state, images, _ = problem
    methods, dtypes = ("max", "percentile", "entropy"), ("int8", "fp8")
    many = calibrate_many(state, images[:4], methods, dtypes, batch_size=4)
    assert set(many) == {(m, d) for m in methods for d in dtypes}
    for (m, d), cal in many.items():
        assert cal == calibrate(state, images[:4], m, dtype=d, batch_size=4), (m, d)
    labels = np.array([0, 1])
    both = choose_calibrations(state, images[:4], images[4:], labels, dtypes=dtypes, batch_size=4)
    for d in dtypes:
        alone = choose_calibration(state, images[:4], images[4:], labels, dtype=d, batch_size=4)
        assert both[d][0] == alone[0] and both[d][1] == alone[1], d
        assert set(both[d][1]["methods"]) == set(methods)
    with pytest.raises(ValueError, match="dtypes"):
        choose_calibrations(state, images[:4], images[4:], labels, dtypes=())
    with pytest.raises(ValueError, match="dtype"):
        calibrate_many(state, images[:4], ("max",), ("int4",))


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_in_place_fake_quantisation_is_fake_quantize(rng, dtype):
    """The ufunc-only rounding the fp32 / GPU forward uses equals the float64 one on float64 values (ties, values
    past the saturation point and exact zeros included)."""
    from resnet_native.inference.simulate import fake_quantize, fake_quantize_in_place

    scale = 0.037
    x = np.concatenate([rng.standard_normal(5000) * 3, (np.arange(-300, 300) + 0.5) * scale, [0.0, -0.0, 1e6, -1e6]])
    got = x.copy()
    fake_quantize_in_place(got, scale, dtype)
    np.testing.assert_array_equal(got, fake_quantize(x, scale, dtype))


def test_the_fp32_forward_agrees_with_float64(problem):
    """device='host-fp32' (the GPU path's code and arithmetic, on the host): float logits, every calibration's
    scales and the fake-quant logits within fp32 rounding of the float64 forward."""
    from resnet_native.inference.simulate import calibrate_many

    state, images, f = problem
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    assert rel(float_logits(state, images, batch_size=4, device="host-fp32"), f) < 1e-6
    many = calibrate_many(state, images, ("max", "entropy"), ("int8", "fp8"), batch_size=4)
    fp32 = calibrate_many(state, images, ("max", "entropy"), ("int8", "fp8"), batch_size=4, device="host-fp32")
    for key, cal in many.items():
        a, b = (np.array(list(c.activation_scales.values())) for c in (cal, fp32[key]))
        assert np.max(np.abs(a - b) / a) < 1e-6, key
        assert fp32[key].weight_scales == cal.weight_scales, key
        q64 = simulate_logits(state, images, cal, batch_size=4)
        got = simulate_logits(state, images, cal, batch_size=4, device="host-fp32")
        assert_fp32_simulation_agrees(got, q64, key)
    with pytest.raises(ValueError, match="device"):
        float_logits(state, images, device="tpu")
