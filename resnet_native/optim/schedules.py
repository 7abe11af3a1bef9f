"""Learning-rate schedules, stepped once per iteration after optimizer.step() (as PyTorch's):

    CosineSchedule(opt, total_steps, min_lr=0)          PyTorch CosineAnnealingLR (clamped at total_steps)
    LinearSchedule(opt, total_steps, min_lr=0)          a straight line from the lr to min_lr (clamped)
    OneCycleSchedule(opt, total_steps, max_lr=None)     PyTorch OneCycleLR (two phases, momentum cycling)
    WarmupSchedule(opt, warmup_steps, after=None)       linear warmup, then `after` (a schedule) or constant

Composition: WarmupSchedule(opt, 500, after=CosineSchedule(opt, total - 500)). Every schedule is a pure
function of its step count (lr_at(t)), so state_dict() is the count plus the values captured at construction.
"""

import math

from .._core.names import whole_number


class Schedule:
    captured = ()  # values fixed at construction, saved in state_dict so a reload does not re-capture them

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.last_step = 0

    def lr_at(self, t: int) -> float:
        raise NotImplementedError

    def apply(self, t: int) -> None:
        """Set the optimizer's hyperparameters for step t."""
        self.optimizer.lr = self.lr_at(t)

    def step(self) -> None:
        self.last_step += 1
        self.apply(self.last_step)

    def get_lr(self) -> float:
        return self.lr_at(self.last_step)

    def state_dict(self) -> dict:
        out = {"type": type(self).__name__, "last_step": self.last_step}
        out.update({k: getattr(self, k) for k in self.captured})
        return out

    def load_state_dict(self, state: dict) -> None:
        for k in self.captured:
            if k in state:
                setattr(self, k, float(state[k]))
        self.last_step = int(state["last_step"])
        self.apply(self.last_step)


class CosineSchedule(Schedule):
    """lr_t = min_lr + (base_lr - min_lr) * (1 + cos(pi * t / total_steps)) / 2, and min_lr after
    total_steps."""

    captured = ("base_lr",)

    def __init__(self, optimizer, total_steps, *, min_lr=0.0, base_lr=None):
        super().__init__(optimizer)
        self.total_steps = whole_number("total_steps", total_steps, 1)
        self.min_lr = float(min_lr)
        self.base_lr = float(optimizer.lr if base_lr is None else base_lr)
        self.apply(0)

    def lr_at(self, t):
        t = min(max(t, 0), self.total_steps)
        return (
            self.min_lr
            + (self.base_lr - self.min_lr) * (1.0 + math.cos(math.pi * t / self.total_steps)) / 2.0
        )


class LinearSchedule(Schedule):
    """lr_t = base_lr + (min_lr - base_lr) * t / total_steps, and min_lr after total_steps: a decay to zero (by
    default) that keeps the rate high for longer than cosine does in the middle of a run, which short runs
    favour."""

    captured = ("base_lr",)

    def __init__(self, optimizer, total_steps, *, min_lr=0.0, base_lr=None):
        super().__init__(optimizer)
        self.total_steps = whole_number("total_steps", total_steps, 1)
        self.min_lr = float(min_lr)
        self.base_lr = float(optimizer.lr if base_lr is None else base_lr)
        self.apply(0)

    def lr_at(self, t):
        t = min(max(t, 0), self.total_steps)
        return self.base_lr + (self.min_lr - self.base_lr) * t / self.total_steps


class OneCycleSchedule(Schedule):
    """PyTorch's OneCycleLR (three_phase=False): lr rises from max_lr/div_factor to max_lr over pct_start of
    the steps, then falls to max_lr/div_factor/final_div_factor; with cycle_momentum the optimizer's momentum
    (SGD) or beta1 (AdamW) moves the opposite way between max_momentum and base_momentum. Clamped at the last
    step."""

    captured = ("max_lr",)

    def __init__(
        self,
        optimizer,
        total_steps,
        *,
        max_lr=None,
        pct_start=0.3,
        anneal="cos",
        div_factor=25.0,
        final_div_factor=1e4,
        cycle_momentum=True,
        base_momentum=0.85,
        max_momentum=0.95,
    ):
        super().__init__(optimizer)
        self.total_steps = whole_number("total_steps", total_steps, 1)
        if not 0.0 < pct_start < 1.0:
            raise ValueError(f"pct_start: expected a float in (0, 1), got {pct_start!r}")
        if anneal not in ("cos", "linear"):
            raise ValueError(f"anneal: expected 'cos' or 'linear', got {anneal!r}")
        self.max_lr = float(optimizer.lr if max_lr is None else max_lr)
        self.pct_start = float(pct_start)
        self.anneal = anneal
        self.div_factor = float(div_factor)
        self.final_div_factor = float(final_div_factor)
        self.cycle_momentum = bool(cycle_momentum)
        self.base_momentum = float(base_momentum)
        self.max_momentum = float(max_momentum)
        self.apply(0)

    def _interpolate(self, start, end, pct):
        if self.anneal == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)
        return (end - start) * pct + start

    def _phase(self, t):
        """(pct, lr start, lr end, momentum start, momentum end) at step t."""
        initial = self.max_lr / self.div_factor
        final = initial / self.final_div_factor
        t = min(max(t, 0), self.total_steps - 1)
        warm_end = float(self.pct_start * self.total_steps) - 1.0
        if t <= warm_end:
            return (
                (t / warm_end if warm_end > 0 else 1.0),
                initial,
                self.max_lr,
                self.max_momentum,
                self.base_momentum,
            )
        last = self.total_steps - 1.0
        return (t - warm_end) / (last - warm_end), self.max_lr, final, self.base_momentum, self.max_momentum

    def lr_at(self, t):
        pct, start, end, _, _ = self._phase(t)
        return self._interpolate(start, end, pct)

    def momentum_at(self, t):
        pct, _, _, start, end = self._phase(t)
        return self._interpolate(start, end, pct)

    def apply(self, t):
        super().apply(t)
        if self.cycle_momentum:
            self.optimizer.set_momentum(self.momentum_at(t))


class WarmupSchedule(Schedule):
    """Linear warmup over warmup_steps, from start_factor * target to target, then `after` (counted from the
    end of warmup) or the constant target. target = after.lr_at(0), or the optimizer's lr at construction.

    start_factor defaults to 1/3 (PyTorch's LinearLR) and must lie in (0, 1]: with 0, the first step would run at
    lr 0 and not move the weights at all."""

    captured = ("target_lr",)

    def __init__(self, optimizer, warmup_steps, after=None, *, start_factor=1.0 / 3.0):
        super().__init__(optimizer)
        self.warmup_steps = whole_number("warmup_steps", warmup_steps, 1)
        if not 0.0 < start_factor <= 1.0:
            raise ValueError(f"start_factor: expected a float in (0, 1], got {start_factor!r}")
        if after is not None and after.optimizer is not optimizer:
            raise ValueError("after: must schedule the same optimizer")
        self.after = after
        self.start_factor = float(start_factor)
        self.target_lr = float(after.lr_at(0) if after is not None else optimizer.lr)
        self.apply(0)

    def lr_at(self, t):
        if t >= self.warmup_steps:
            return self.after.lr_at(t - self.warmup_steps) if self.after is not None else self.target_lr
        return self.target_lr * (self.start_factor + (1.0 - self.start_factor) * t / self.warmup_steps)

    def apply(self, t):
        if self.after is not None:
            self.after.apply(
                max(t - self.warmup_steps, 0)
            )  # its momentum (OneCycle) and, after warmup, its lr
            self.after.last_step = max(t - self.warmup_steps, 0)
        self.optimizer.lr = self.lr_at(t)

    def state_dict(self):
        out = super().state_dict()
        if self.after is not None:
            out.update({f"after.{k}": v for k, v in self.after.state_dict().items()})
        return out

    def load_state_dict(self, state):
        if self.after is not None:
            for k in self.after.captured:
                if f"after.{k}" in state:
                    setattr(self.after, k, float(state[f"after.{k}"]))
        super().load_state_dict(state)
