"""AdamW (PyTorch semantics: decoupled weight decay, bias correction), one fused multi-tensor launch per step.

    p *= 1 - lr * weight_decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

t counts the updates applied, as PyTorch's does: a device counter advanced by launch_step unless GradScaler's
found_inf says the update is skipped, so the step needs no host synchronisation. lr and beta1 are read from the
device (Optimizer.prepare_step), so a one-cycle schedule can move both under a captured graph.
"""

from collections.abc import Sequence

import numpy as np

from .._core.names import finite_number
from .._core.placement import host_copy
from ..ops import multi_tensor
from .optimizer import Optimizer, _non_negative


class AdamW(Optimizer):
    state_names = ("exp_avg", "exp_avg_sq")
    hyperparameters = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr)
        if isinstance(betas, str | bytes) or not isinstance(betas, Sequence | np.ndarray) or len(betas) != 2:
            raise ValueError(f"betas: expected two floats in [0, 1), got {betas!r}")
        betas = tuple(finite_number(f"betas[{i}]", b) for i, b in enumerate(betas))
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas: expected two floats in [0, 1), got {betas!r}")
        self.betas = betas
        self.eps = _non_negative(eps, "eps")
        self.weight_decay = _non_negative(weight_decay, "weight_decay")
        self._applied = 0  # updates applied, until the device counter exists
        self._device_step = None

    def device_hyperparameters(self) -> tuple:
        return (self.lr, self.betas[0])

    def _device_state_ready(self) -> None:
        self._device_step = self.placement.array([self._applied], self.placement.master_dtype)

    @property
    def applied_steps(self) -> int:
        """Updates applied so far (skipped ones not counted); reads the device (synchronises)."""
        if self._device_step is None:
            return self._applied
        return int(host_copy(self._device_step)[0])

    def launch_step(self, found_inf=None, inv_scale=None) -> None:
        self._require_ready()
        multi_tensor.advance_step(self._device_step, found_inf)
        super().launch_step(found_inf, inv_scale)

    def _launch(self, group, grads, shared):
        multi_tensor.adamw_step(group.params, grads, group.state["exp_avg"], group.state["exp_avg_sq"],
                                beta1=self.hyperparameter_on_device(1), beta2=self.betas[1], eps=self.eps,
                                weight_decay=self.group_weight_decay(group), step=self._device_step, **shared)

    def set_momentum(self, value: float) -> None:
        self.betas = (float(value), self.betas[1])

    def state_sources(self) -> dict:
        """Optimizer.state_sources(), and 'step': the updates applied (the device counter, uncopied), which
        replaces the header's count of steps taken (skipped ones included) in state_dict() and checkpoints."""
        step = self._device_step if self._device_step is not None else np.full((1,), self._applied, np.float32)
        return {**super().state_sources(), "step": (step, _first_int)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._applied = self.step_count
        if self._device_step is not None:
            self._device_step.fill(self._applied)


def _first_int(a) -> int:
    return int(a[0])
