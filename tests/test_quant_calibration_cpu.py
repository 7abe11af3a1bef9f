"""Activation observers on known distributions, their bounded memory, and the calibration file's round trip and
schema checks."""

import json
from statistics import NormalDist

import numpy as np
import pytest

from resnet_native.quantization import Calibration, load_calibration, save_calibration
from resnet_native.quantization.calibration import EntropyObserver, MaxAbsObserver, PercentileObserver, make_observer


def _feed(observer, x, batches=4):
    for part in np.array_split(x, batches):
        observer.observe(part)
    return observer


def test_max_abs_is_exact(rng):
    x = rng.standard_normal(10_000) * 3
    o = _feed(MaxAbsObserver(), x)
    assert o.threshold() == np.abs(x).max()
    assert o.scale("int8") == np.abs(x).max() / 127 and o.scale("fp8") == np.abs(x).max() / 448


@pytest.mark.parametrize("p", [99.9, 99.99])
def test_percentile_matches_the_exact_and_the_analytical_one(rng, p):
    x = rng.standard_normal(1_000_000)
    o = _feed(PercentileObserver(p), x * np.linspace(0.5, 1, 4).repeat(250_000))  # growing batches: rebinning
    y = x * np.linspace(0.5, 1, 4).repeat(250_000)
    assert abs(o.threshold() - np.percentile(np.abs(y), p)) <= 2 * o.width
    o = _feed(PercentileObserver(p), x)
    analytical = NormalDist().inv_cdf((1 + p / 100) / 2)  # |x| of a standard normal: two-sided
    assert o.threshold() == pytest.approx(analytical, rel=0.03)


def test_entropy_clips_a_heavy_tail_and_keeps_a_uniform_range(rng):
    heavy = rng.standard_t(3, 200_000)
    assert _feed(EntropyObserver(), heavy).threshold() < 0.6 * np.abs(heavy).max()
    uniform = rng.uniform(-1, 1, 200_000)
    assert _feed(EntropyObserver(), uniform).threshold() == pytest.approx(np.abs(uniform).max(), rel=0.02)


def test_memory_is_bounded_histograms_only(rng):
    for o in (EntropyObserver(), PercentileObserver()):
        for i in range(30):
            o.observe(rng.standard_normal(5000) * (1 + i))
        arrays = [v for v in vars(o).values() if isinstance(v, np.ndarray)]
        assert [a.shape for a in arrays] == [(o.bins,)] and o.total == 150_000


def test_observer_arguments():
    with pytest.raises(ValueError, match="method"):
        make_observer("kl")
    with pytest.raises(ValueError, match="percentile"):
        PercentileObserver(0)
    with pytest.raises(ValueError, match="no batch observed"):
        EntropyObserver().threshold()
    with pytest.raises(ValueError, match="x: expected finite"):
        MaxAbsObserver().observe(np.array([np.inf]))
    with pytest.raises(ValueError, match="dtype"):
        o = MaxAbsObserver()
        o.observe(np.ones(2))
        o.scale("int4")
    zero = EntropyObserver()
    zero.observe(np.zeros(10))
    assert zero.threshold() == 0.0 and zero.scale() == 1.0


# ------------------------------------------------------------------------------------------------------------
# The calibration file

CAL = Calibration("int8", "percentile", 99.99, ("input", "conv1", "fc"), {"input": 0.03, "conv1": 0.1},
                  {"conv1": (0.01, 0.02)})


def test_calibration_file_round_trip(tmp_path):
    path = save_calibration(CAL, tmp_path / "sub" / "calibration.json")
    assert load_calibration(path) == CAL
    assert not [p for p in path.parent.iterdir() if p.name != "calibration.json"]  # no temporary left


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d.update(version=True), "version"),
    (lambda d: d.update(dtype="int4"), "dtype"),
    (lambda d: d.update(method="kl"), "method"),
    (lambda d: d.update(percentile=101), "percentile"),
    (lambda d: d.update(method="max"), "percentile"),
    (lambda d: d.update(values=["a", "a"]), "values"),
    (lambda d: d["activation_scales"].update(other=1.0), "activation_scales"),
    (lambda d: d["activation_scales"].update(conv1=-1), "activation_scales.conv1"),
    (lambda d: d["activation_scales"].update(conv1="1"), "activation_scales.conv1"),
    (lambda d: d["weight_scales"].update(conv1=[]), "weight_scales.conv1"),
    (lambda d: d["weight_scales"].update(conv1=[0.1, True]), r"weight_scales.conv1\[1\]"),
])
def test_malformed_files_name_the_file_and_the_field(tmp_path, change, field):
    data = CAL.to_json()
    change(data)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"c\.json: field '{field}'"):
        load_calibration(path)


@pytest.mark.parametrize("text", ["[1]", "{", '{"format": NaN}', '{"a": 1, "a": 2}', "{}"])
def test_unreadable_files_name_the_file(tmp_path, text):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"c\.json"):
        load_calibration(path)
