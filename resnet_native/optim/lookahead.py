"""Lookahead (Zhang et al., 2019) in the form fast CIFAR-10 trainers use: a slow copy of the weights, kept in a
second model of the same architecture, that every few steps moves toward the trained (fast) weights, which are
then reset to it.

    lookahead = Lookahead(model, slow, decay=0.77, every=5, total_steps=steps)
    lookahead.after_step(optimizer.step_count)    # after each optimizer step (before the weights' average)

At step t an update is slow = d * slow + (1 - d) * fast, then fast = slow, with d = decay * (t / total_steps)^3:
near zero early, when the slow copy just follows the weights, and `decay` at the end. The last step always
updates, so the run ends on the slow weights. Running statistics move with the weights, as in WeightAverage,
whose fused lerp and copies this reuses; the optimizer's momentum is left as it is.
"""

from __future__ import annotations

from .._core.names import whole_number
from .ema import WeightAverage


class Lookahead:
    """The slow weights of `model` kept in `slow` (see the module docstring). decay: the per-update decay reached
    at the last step, in [0, 1); every: optimizer steps between updates; total_steps: the run's steps."""

    def __init__(self, model, slow, decay: float, *, every: int = 5, total_steps: int):
        self.every = whole_number("every", every, 1)
        self.total_steps = whole_number("total_steps", total_steps, 1)
        self._average = WeightAverage(model, slow, decay)  # which checks the decay
        self.decay = self._average.decay

    @property
    def slow(self):
        """The model holding the slow weights (checkpointed beside the trained ones)."""
        return self._average.shadow

    def decay_at(self, step: int) -> float:
        return self.decay * min(step / self.total_steps, 1.0) ** 3

    def after_step(self, step: int) -> None:
        """What is due after optimizer step number `step` (counted from 1): every `every` steps and at the last,
        the slow weights' update and the trained weights' reset to them, queued on the current stream."""
        if step % self.every == 0 or step == self.total_steps:
            self._average.update(self.decay_at(step))
            self._average.restore_model()

    def __repr__(self):
        return f"Lookahead(decay={self.decay}, every={self.every}, total_steps={self.total_steps})"
