"""Choosing a calibration by measured accuracy: each observer method calibrates on one slice of the training set,
and the one whose fake-quant forward is most accurate on a second, held-out slice wins (the test set is never
looked at). What a release with --int8 / --fp8 carries (release/build.py), with the figures of every method.
"""

from __future__ import annotations

import numpy as np

from .._core.names import choice
from ..quantization.calibration import METHODS, QUANT_DTYPES
from .simulate import calibrate_many, float_logits, simulate_logits


def choose_calibration(state: dict, calibration_images, holdout_images, holdout_labels, *, dtype: str = "int8",
                       methods=METHODS, stem: str = "cifar", percentile: float = 99.99, batch_size: int = 16):
    """(Calibration, report) for the network `state`: the method of `methods` whose calibration on
    calibration_images gives the highest top-1 accuracy on holdout_images (normalised NCHW float batches) against
    holdout_labels; ties go to the higher agreement with the float forward's predictions, then to the smaller
    logit error (|quantised - float logits| / |float logits| over the held-out images: a well-trained network
    classifies its own training images almost perfectly under every method, so the continuous figure decides),
    then to the order of `methods`. report: {"dtype", "method", "calibration_images", "holdout_images", "device",
    "float_accuracy", "methods": {method: {"accuracy", "agreement", "logit_error"}}}."""
    return choose_calibrations(state, calibration_images, holdout_images, holdout_labels, dtypes=(dtype,),
                               methods=methods, stem=stem, percentile=percentile, batch_size=batch_size)[dtype]


def choose_calibrations(state: dict, calibration_images, holdout_images, holdout_labels, *, dtypes=QUANT_DTYPES,
                        methods=METHODS, stem: str = "cifar", percentile: float = 99.99, batch_size: int = 16,
                        device: str = "host"):
    """{dtype: (Calibration, report)}: choose_calibration for each of `dtypes`, sharing the float forwards (one
    over the calibration images for every method and dtype, one over the held-out images). device: where the
    forwards run (simulate.DEVICES: 'gpu' is fp32 cuDNN, minutes faster than the float64 host)."""
    dtypes, methods = tuple(dtypes), tuple(methods)
    if not dtypes:
        raise ValueError("dtypes: expected at least one of " + ", ".join(QUANT_DTYPES))
    for d in dtypes:
        choice("dtype", d, QUANT_DTYPES)
    if not methods:
        raise ValueError("methods: expected at least one of " + ", ".join(METHODS))
    for m in methods:
        choice("methods", m, METHODS)
    labels = np.asarray(holdout_labels)
    if labels.ndim != 1 or len(labels) != len(holdout_images) or len(labels) == 0:
        raise ValueError(f"holdout_labels: expected one label per held-out image ({len(holdout_images)}), got shape "
                         f"{labels.shape}")
    float_out = float_logits(state, holdout_images, stem=stem, batch_size=batch_size, device=device)
    reference = float_out.argmax(axis=1)
    calibrations = calibrate_many(state, calibration_images, methods, dtypes, stem=stem, percentile=percentile,
                                  batch_size=batch_size, device=device)
    chosen = {}
    for dtype in dtypes:
        report = {"dtype": dtype, "calibration_images": len(calibration_images), "holdout_images": len(labels),
                  "device": device, "float_accuracy": float(np.mean(reference == labels)), "methods": {}}
        best = None
        for m in methods:
            cal = calibrations[m, dtype]
            logits = simulate_logits(state, holdout_images, cal, stem=stem, batch_size=batch_size, device=device)
            predicted = logits.argmax(axis=1)
            figures = {"accuracy": float(np.mean(predicted == labels)),
                       "agreement": float(np.mean(predicted == reference)),
                       "logit_error": float(np.linalg.norm(logits - float_out) / np.linalg.norm(float_out))}
            report["methods"][m] = figures
            rank = (figures["accuracy"], figures["agreement"], -figures["logit_error"])
            if best is None or rank > best[0]:
                best = (rank, m, cal)
        report["method"] = best[1]
        chosen[dtype] = (best[2], report)
    return chosen
