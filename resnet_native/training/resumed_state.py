"""The check of a training state read for --resume: its progress fields consistent with each other and with the
run's length, before any of it is loaded into the run's objects."""

from __future__ import annotations

import math
import sys

import numpy as np


def check_resumed_state(state: dict, path, epochs: int) -> dict:
    """A training state read for --resume, if its progress is consistent: 'epoch' (the last completed epoch, from
    0) an int below `epochs`, 'metrics.history' one row per completed epoch numbered 1, 2, ..., 'metrics.best' and
    'metrics.train_time_s' present, and the loss scaler's 'scale' (with mixed precision) finite and > 0. Else a
    ValueError naming the file and the field."""

    def bad(field: str, expected: str, got):
        return ValueError(f"{path}: field {field!r}: expected {expected}, got {got!r}"[:1000])

    epoch = state.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or not 0 <= epoch < epochs:
        raise bad("epoch", f"an int in [0, {epochs}) (the last completed epoch of a {epochs}-epoch run)", epoch)
    metrics = state.get("metrics")
    if not isinstance(metrics, dict):
        raise bad("metrics", "a mapping with 'history', 'best' and 'train_time_s'", metrics)
    history = metrics.get("history")
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        raise bad("metrics.history", "a list of epoch rows", type(history).__name__)
    numbers = [r.get("epoch") for r in history]
    # Only ints compared: a list holding an array would make the comparison itself raise.
    if not all(type(n) is int for n in numbers) or numbers != list(range(1, int(epoch) + 2)):
        raise bad("metrics.history", f"rows for epochs 1 to {int(epoch) + 1} ('epoch' is {int(epoch)}, counted "
                                     "from 0)", f"{len(numbers)} rows numbered {numbers[:3]}...{numbers[-3:]}")
    if not isinstance(metrics.get("best"), dict):
        raise bad("metrics.best", "a mapping", metrics.get("best"))
    t = metrics.get("train_time_s")
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= sys.float_info.max:
        raise bad("metrics.train_time_s", "a finite number >= 0", t)
    scaler = state.get("scaler")
    if scaler is not None:
        scale = scaler.get("scale") if isinstance(scaler, dict) else None
        try:
            value = np.asarray(scale, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
            value = np.asarray(np.nan)
        if value.size != 1 or not math.isfinite(float(value.reshape(-1)[0])) or float(value.reshape(-1)[0]) <= 0:
            raise bad("scaler.scale", "a finite number > 0", scale)
    return state
