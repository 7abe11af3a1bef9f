"""Where an int8 / FP8 network's 8-bit part begins: a float prefix, then the quantised suffix.

quantize_from names the first part that runs quantised: 'stem' (every convolution but the classifier), or
'layer1' ... 'layer4' (the stem and the stages before that one run in float, as the float engine runs them). The
boundary value is the input of that first quantised part: the model input for 'stem', else the input of the
stage's first block (the stem's output for 'layer1', the previous stage's output otherwise). It is the one value
both parts touch: the prefix writes it in float and it is quantised once, at its calibrated scale, for the suffix.

One Calibration serves every quantize_from: calibration observes every value a 'stem' network quantises, which
includes every suffix's values (the boundary among them: it is read by the suffix's first convolutions).
"""

from __future__ import annotations

from .._core.names import choice

QUANTIZE_FROM = ("stem", "layer1", "layer2", "layer3", "layer4")
AUTO = "auto"  # the engine's choice: every candidate timed, the fastest kept
# 'auto''s one more candidate: no 8-bit part at all (the fp16 engine's plan), so that no batch size an engine
# serves is slower than the fp16 engine; never a value a caller passes.
FLOAT = "float"
# An 8-bit candidate replaces the fp16 plan only when it is at least this much faster: it costs some accuracy, and a
# smaller difference is within the timing's noise at small batches, where the two run about alike.
MIN_GAIN_OVER_FLOAT = 0.03


def fastest(times: dict) -> str:
    """'auto''s choice among {candidate: median ms}: the fastest, but the fp16 plan (FLOAT, when timed) unless that
    candidate is at least MIN_GAIN_OVER_FLOAT faster."""
    best = min(times, key=times.get)
    if FLOAT in times and best != FLOAT and times[best] > times[FLOAT] * (1 - MIN_GAIN_OVER_FLOAT):
        return FLOAT
    return best


def quantize_from_choices(plan) -> tuple:
    """The quantize_from values `plan` has: 'stem' and one per stage it has."""
    return tuple(q for q in QUANTIZE_FROM if q == "stem" or any(s.name.startswith(f"{q}.") for s in plan.steps))


def first_quantized_step(plan, quantize_from: str = "stem") -> int:
    """Index in plan.steps of the first step of the quantised suffix; ValueError for a stage the plan lacks."""
    choice("quantize_from", quantize_from, QUANTIZE_FROM)
    if quantize_from == "stem":
        return 0
    for i, s in enumerate(plan.steps):
        if s.name.startswith(f"{quantize_from}."):
            return i
    raise ValueError(f"quantize_from: the network has no {quantize_from!r} (it has "
                     f"{', '.join(map(repr, quantize_from_choices(plan)))})")


def boundary_value(plan, quantize_from: str = "stem") -> int:
    """The value the quantised suffix starts from: the plan's input for 'stem', else the value the prefix's last
    step writes (the stage's first block reads nothing else from the prefix: checked)."""
    start = first_quantized_step(plan, quantize_from)
    if start == 0:
        return plan.input
    boundary = plan.steps[start - 1].out
    for s in plan.steps[start:]:
        early = [v for v in s.inputs if v < boundary]
        if early:
            raise ValueError(f"plan: step {s.name} of the quantised suffix reads value {early[0]}, written before "
                             f"the boundary value {boundary} ({quantize_from!r})")
    return boundary


__all__ = ["AUTO", "FLOAT", "MIN_GAIN_OVER_FLOAT", "QUANTIZE_FROM", "boundary_value", "fastest", "first_quantized_step",
           "quantize_from_choices"]
