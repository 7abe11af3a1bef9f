"""An exponential moving average of a model's weights and batch-norm running statistics, kept in a second model of
the same architecture (the shadow), which is evaluated and released in the trained model's place.

    average = WeightAverage(model, shadow, decay=0.999, every=1, start_step=0)
    average.after_step(optimizer.step_count)     # after each optimizer step: shadow = d * shadow + (1 - d) * model

An update is one multi-tensor launch over the parameters (rewriting the shadow's low-precision copies in the same
pass, as the optimizer's update does) and one over the running statistics, on the current stream: nothing is
allocated and nothing waits for the host, so it runs right after a captured step. It is SGD's fused update used as
a lerp: with the model's weights as the gradients, the gradient scale -1 (a device scalar, since numbers must be
>= 0), weight decay 1 and lr = 1 - decay, p -= lr * (p - w) is p = decay * p + (1 - decay) * w.

The running statistics are averaged as the weights are: averaged weights evaluated with the last statistics would
pair weights with statistics of other weights, while with the same decay both describe the same stretch of training
(recomputing them over the training set would match the averaged weights exactly, at the cost of a pass). Until
start_step the shadow is not updated; it is made a copy of the model at start_step (and before an evaluation
that comes earlier), so the average covers only the steps after it.
"""

from __future__ import annotations

import numpy as np

from .. import reference
from .._core.names import finite_number, whole_number
from .._core.placement import native_dtype
from ..nn.layers import BatchNorm2d
from ..ops import kernels, multi_tensor


def running_statistics(model) -> list:
    """Every batch-norm running mean and variance of a model, in module order."""
    return [a for _, m in model.named_modules() if isinstance(m, BatchNorm2d) for a in (m.running_mean, m.running_var)]


class WeightAverage:
    """The average of `model` kept in `shadow` (same architecture, placement and precision; both placed here if
    unplaced). decay: per update, in [0, 1); every: optimizer steps between updates; start_step: the step count at
    which the average starts (see the module docstring). The shadow starts as a copy of the model."""

    def __init__(self, model, shadow, decay: float, *, every: int = 1, start_step: int = 0):
        self.decay = finite_number("decay", decay, 0.0)
        if not self.decay < 1.0:
            raise ValueError(f"decay: expected a value in [0, 1), got {self.decay!r}")
        self.every = whole_number("every", every, 1)
        self.start_step = whole_number("start_step", start_step, 0)
        where = model.ensure_placed()
        if shadow.placement is None:
            shadow.place(where)
        if shadow.placement != where:
            raise ValueError(f"shadow: placed on {shadow.placement}, the model on {where}")
        ours, theirs = model.named_parameters(), shadow.named_parameters()
        if [(n, p.shape) for n, p in ours] != [(n, p.shape) for n, p in theirs]:
            raise ValueError("shadow: not the model's architecture (its parameters' names or shapes differ)")
        self.model, self.shadow = model, shadow
        lists = multi_tensor.TensorList if where.on_gpu else reference.multi_tensor.TensorList
        low = [p.low for _, p in theirs]
        copies = None if low[0] is None else lists(low, dtype=native_dtype(low[0]))
        self._groups = [(lists([p.data for _, p in theirs]), lists([p.data for _, p in ours]), copies)]
        stats = running_statistics(shadow)
        if stats:
            self._groups.append((lists(stats), lists(running_statistics(model)), None))
        self._minus_one = where.array(np.array([-1.0]), where.master_dtype)
        self.copy_model()

    def update(self, decay: float | None = None) -> None:
        """shadow = decay * shadow + (1 - decay) * model (weights and running statistics), queued now."""
        rate = 1.0 - (self.decay if decay is None else finite_number("decay", decay, 0.0))
        for average, source, copies in self._groups:
            multi_tensor.sgd_step(average, source, None, lr=rate, momentum=0.0, weight_decay=1.0,
                                  inv_scale=self._minus_one, model_copies=copies)

    def copy_model(self) -> None:
        """shadow = model exactly (weights, their low-precision copies and the running statistics)."""
        _copy(self.shadow, self.model)

    def restore_model(self) -> None:
        """model = shadow exactly: the reverse of copy_model (Lookahead's reset of the trained weights)."""
        _copy(self.model, self.shadow)

    def after_step(self, step: int) -> None:
        """What is due after optimizer step number `step` (counted from 1): the copy at start_step, an update every
        `every` steps after it."""
        if step == self.start_step:
            self.copy_model()
        elif step > self.start_step and (step - self.start_step) % self.every == 0:
            self.update()

    def before_evaluation(self, step: int) -> None:
        """Before the shadow is evaluated after `step` steps: while the average has not started, the model's
        weights stand in for it."""
        if step < self.start_step:
            self.copy_model()

    def __repr__(self):
        return f"WeightAverage(decay={self.decay}, every={self.every}, start_step={self.start_step})"


def _copy(dst, src) -> None:
    """dst's weights, low-precision copies and running statistics = src's (the same architecture and placement):
    one copy of the parameter arena when each model keeps its parameters in one (the same offsets), else one per
    array."""
    xp = dst.placement.xp
    mine, theirs = {p.arena for p in dst.parameters()}, {p.arena for p in src.parameters()}
    one_each = len(mine) == len(theirs) == 1 and None not in mine | theirs
    arena, source = (mine.pop(), theirs.pop()) if one_each else (None, None)
    if arena is not None and arena.master.shape == source.master.shape:
        xp.copyto(arena.master, source.master)
        arena.refresh_low()
    else:
        for d, s in zip(dst.parameters(), src.parameters(), strict=True):
            xp.copyto(d.data, s.data)
            if d.low is not None:
                kernels.cast(d.data, d.low)
    for d, s in zip(running_statistics(dst), running_statistics(src), strict=True):
        xp.copyto(d, s)
