"""The fake-quant forward on the GPU (device='gpu': fp32 cuDNN convolutions, strict, no TF32) against the float64
host forward of the same tiny ResNet-18: what `release --int8 --fp8 --calibrate-on gpu` chooses its calibration
with. Bounds: fp32 rounding over ~20 layers (1e-7 per op, amplified little by a random network: 1e-5 norm-wise for
float logits and max scales; a histogram method's threshold may move, see below); a fake-quant value within fp32
rounding of a rounding boundary may take the next code, which moves that image's logits
(quant_helpers.assert_fp32_simulation_agrees says how far)."""

import numpy as np
import pytest
from quant_helpers import assert_fp32_simulation_agrees, tiny_resnet18_state

from resnet_native.inference.calibration_choice import choose_calibrations
from resnet_native.inference.simulate import calibrate_many, float_logits, simulate_logits

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_the_gpu_forward_calibrates_and_simulates_like_the_host():
    state = tiny_resnet18_state()
    images = np.random.default_rng(1).standard_normal((24, 3, 32, 32))
    f64 = float_logits(state, images, batch_size=8)
    assert _rel(float_logits(state, images, batch_size=8, device="gpu"), f64) < 1e-5
    methods, dtypes = ("max", "percentile", "entropy"), ("int8", "fp8")
    host = calibrate_many(state, images[:16], methods, dtypes, batch_size=8)
    gpu = calibrate_many(state, images[:16], methods, dtypes, batch_size=8, device="gpu")
    for key, cal in host.items():
        a, b = (np.array(list(c.activation_scales.values())) for c in (cal, gpu[key]))
        rel = np.abs(b - a) / a
        if key[0] == "max":  # the largest |x|: fp32 rounding of the forward
            assert np.max(rel) < 1e-5, (key, rel)
        else:
            # A histogram's threshold: a count that fp32 rounding moves across a bin edge may move a percentile by a
            # bin, and entropy's argmin to a near-tied candidate a few percent away; a wrong observer moves most
            # values.
            assert np.mean(rel < 1e-5) >= 0.9 and np.max(rel) < 0.05, (key, rel)
        assert gpu[key].weight_scales == cal.weight_scales, key
        q64 = simulate_logits(state, images[16:], cal, batch_size=8)
        got = simulate_logits(state, images[16:], cal, batch_size=8, device="gpu")
        assert_fp32_simulation_agrees(got, q64, key)
    labels = f64[16:].argmax(axis=1)
    chosen = choose_calibrations(state, images[:16], images[16:], labels, batch_size=8, device="gpu")
    assert set(chosen) == set(dtypes) and all(r["float_accuracy"] == 1.0 for _, r in chosen.values())
