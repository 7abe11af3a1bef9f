"""AdamW (PyTorch semantics: decoupled weight decay, bias correction), one fused multi-tensor launch per step.

    p *= 1 - lr * weight_decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

t counts step() calls on the host, including steps the kernels skipped for inf/nan gradients (GradScaler),
which keeps the step free of host synchronisation; PyTorch does not count skipped steps.
"""

from ..layers._backend import ops
from .optimizer import Optimizer, _non_negative


class AdamW(Optimizer):
    state_names = ("exp_avg", "exp_avg_sq")
    hyperparameters = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr)
        betas = tuple(float(b) for b in betas)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas: expected two floats in [0, 1), got {betas!r}")
        self.betas = betas
        self.eps = _non_negative(eps, "eps")
        self.weight_decay = _non_negative(weight_decay, "weight_decay")

    def _launch(self, group, found_inf):
        beta1, beta2 = self.betas
        ops.multi_tensor.adamw_step(
            group.params,
            group.grads,
            group.state["exp_avg"],
            group.state["exp_avg_sq"],
            lr=self.lr,
            beta1=beta1,
            beta2=beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            step=self.step_count,
            inv_scale=1.0,
            found_inf=found_inf,
            model_copies=group.copies,
        )

    def set_momentum(self, value: float) -> None:
        self.betas = (float(value), self.betas[1])
