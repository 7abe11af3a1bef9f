"""SGD with momentum, Nesterov and weight decay (PyTorch semantics), one fused multi-tensor launch per step.

    g = grad + weight_decay * p;  buf = momentum * buf + (1 - dampening) * g
    p -= lr * (g + momentum * buf if nesterov else buf)

For fp16/bf16 models the same launch rewrites the low-precision copies the ops read. lr and momentum are read
from the device (see Optimizer.prepare_step), so a one-cycle schedule can move both under a captured graph.
"""

from .._core.names import flag
from ..ops import multi_tensor
from .optimizer import Optimizer, _non_negative


class SGD(Optimizer):
    state_names = ("momentum_buffer",)
    hyperparameters = ("lr", "momentum", "dampening", "weight_decay", "nesterov")

    def __init__(self, params, lr, momentum=0.9, nesterov=False, weight_decay=0.0, dampening=0.0):
        super().__init__(params, lr)
        self.momentum = _non_negative(momentum, "momentum")
        self.dampening = _non_negative(dampening, "dampening")
        self.weight_decay = _non_negative(weight_decay, "weight_decay")
        self.nesterov = flag("nesterov", nesterov)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("nesterov: needs momentum > 0 and dampening == 0")

    def device_hyperparameters(self) -> tuple:
        return (self.lr, self.momentum)

    def _launch(self, group, grads, shared):
        # PyTorch starts the momentum buffer at the first gradient, undamped; the kernel needs telling only
        # when dampening makes that differ from updating a zero buffer.
        first = {"first_step": True} if self.dampening and self.step_count == 1 else {}
        # A momentum of 0 stays a host number: the kernel then skips the buffers altogether.
        momentum = self.hyperparameter_on_device(1) if self.momentum else 0.0
        multi_tensor.sgd_step(group.params, grads, group.state["momentum_buffer"], momentum=momentum,
                              weight_decay=self.group_weight_decay(group), nesterov=self.nesterov,
                              dampening=self.dampening, **first, **shared)

    def set_momentum(self, value: float) -> None:
        self.momentum = float(value)
