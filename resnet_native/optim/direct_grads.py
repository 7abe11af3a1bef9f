"""A training step's low-precision weight gradients, read by the optimizer where the layers wrote them.

In an fp16/bf16 model a convolution writes its filter gradient in the low precision, and accumulate_grad then adds
it into the fp32 `grad` the optimizer reads: per step a zeroing of every gradient, one conversion kernel per weight
and twice the bytes for the finite check and the update to read. A step with one backward pass needs none of it:

    direct = DirectGradients(optimizer)
    direct.zero()                            # before backward: zero only the gradients that are added into
    with gradients_into(direct):             # nn.params: each accumulate_grad comes here
        model.backward(dlogits)
    direct.finish()                          # the optimizer's gradient lists now point at the layers' buffers

The first low-precision gradient of each of the optimizer's parameters is kept where the layer wrote it (the layer
reuses that buffer every step); a parameter's second gradient in the same pass, a master-dtype one, or one of a
parameter the optimizer does not hold goes into `grad` as before, so every value the optimizer reads is the sum
accumulate_grad would have made, bit for bit. The `grad` of a parameter taken directly is left as it was. Lists are
built outside any CUDA-graph capture (in the first, eager step) and reused while the buffers stay the same, so a
captured step replays with their tables; they live as long as this object.
"""

from __future__ import annotations

import numpy as np

from .. import reference
from ..ops import multi_tensor


class DirectGradients:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._ids = frozenset(id(p) for p in optimizer.params)  # the parameters whose gradients may be taken
        self._direct = frozenset()  # parameters (ids) whose gradient the last pass left in a layer's buffer
        self._taken = {}  # this pass: id -> the layer's low-precision gradient
        self._added = set()  # this pass: ids whose grad has been written (added into, or overwritten)
        self._lists = {}  # (array addresses) -> TensorList, built once per set of arrays

    # -- one backward pass -----------------------------------------------------------------------------------
    def zero(self) -> None:
        """Zero the gradients this pass adds into: all but those the last pass took directly (one launch)."""
        self._taken, self._added = {}, set()
        zeroing = self._zeroing_list()
        if zeroing is not None:
            multi_tensor.zero_(zeroing)

    def accumulate(self, param, g) -> None:
        """Parameter.accumulate_grad(g) while this sink is active."""
        key = id(param)
        low = param.grad is not None and np.dtype(g.dtype) != np.dtype(param.grad.dtype)
        if low and key in self._ids and key not in self._taken and key not in self._added:
            self._taken[key] = g
            return
        if key in self._taken:  # a second gradient: the first goes into grad after all
            self._write(param, self._taken.pop(key))
        self._write(param, g)

    def finish(self) -> None:
        """After the backward pass: the optimizer reads the gradients taken here from the layers' buffers."""
        for p in self._params():  # taken last pass, given nothing now: its gradient is zero
            if id(p) in self._direct and id(p) not in self._taken and id(p) not in self._added:
                multi_tensor.zero_(self._list([p.grad]))
                self._added.add(id(p))
        self._direct = frozenset(self._taken)
        self.optimizer.use_gradients([self._list([self._taken.get(id(p), p.grad) for p in params])
                                      for params in self.optimizer.group_params()])
        self._zeroing_list()  # the next pass's, made now: a capture must find it built

    def release(self) -> None:
        """The optimizer reads the parameters' own gradients again."""
        self.optimizer.use_gradients(None)

    @property
    def num_direct(self) -> int:
        """Parameters whose gradient the last pass left in a layer's buffer."""
        return len(self._direct)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _write(self, param, g) -> None:
        """Add g into param.grad; the first write of a parameter not zeroed this pass overwrites it."""
        key = id(param)
        param.add_to_grad(g, overwrite=key in self._direct and key not in self._added)
        self._added.add(key)

    def _zeroing_list(self):
        """The list of the gradients a pass adds into (all but those the last pass took directly), or None."""
        grads = [p.grad for p in self._params() if id(p) not in self._direct]
        return self._list(grads) if grads else None

    def _params(self) -> list:
        return self.optimizer.params

    def _list(self, arrays: list):
        key = tuple((id(a), _address(a)) for a in arrays)
        found = self._lists.get(key)
        if found is None:
            on_gpu = self.optimizer.params[0].placement.on_gpu  # placed: the step placed its model
            found = self._lists[key] = (multi_tensor.TensorList if on_gpu else reference.multi_tensor.TensorList)(
                arrays, dtype=[_dtype_name(a) for a in arrays])
        return found


def _address(array) -> int:
    if isinstance(array, np.ndarray):
        return array.__array_interface__["data"][0]
    return array.data.ptr


def _dtype_name(array) -> str:
    """The list's name of an array's dtype (bf16 travels in uint16 arrays; fp32 covers a host model's float64)."""
    dtype = np.dtype(array.dtype)
    return {np.dtype(np.uint16): "bf16", np.dtype(np.float16): "fp16"}.get(dtype, "fp32")
