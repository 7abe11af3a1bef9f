"""Softmax cross-entropy with label smoothing, in fp32, on preallocated buffers (no allocation per call).

    target = (1 - s) * onehot(label) + s / C
    loss   = mean_i( logsumexp(z_i) - sum_j target_ij z_ij )
    dz     = (softmax(z) - target) / N

forward() computes the loss and the number of correct predictions (argmax == label) in one native kernel, as
device arrays (nothing is read back to the host), and can add both to running float64 totals in the same launch;
backward() computes the gradient in another. Both kernels are compiled with the extension, so nothing is compiled
at run time, and both are captured in the training step's and the evaluation's CUDA graphs. NumPy logits (a model
on the host) take the float64 reference (resnet_native.reference.loss); one loss object serves logits of one kind.
"""

import numpy as np

from .. import reference
from .._core.buffers import BufferCache
from .._core.loader import _C
from .._core.names import MASTER_DTYPE
from .._core.placement import array_module
from .._core.runtime import op_stream


class SoftmaxCrossEntropy:
    def __init__(self, label_smoothing: float = 0.0):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing: expected a float in [0, 1), got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)
        self._buffers = BufferCache()
        self._saved = None  # (logits, labels) of the last forward with train=True

    def forward(self, logits, labels, train: bool = True, *, totals=None):
        """(loss, correct): 0-d arrays, the fp32 mean loss and the int32 count of argmax hits. These are views of
        this object's buffers, rewritten by the next call. totals: (loss_sum, correct_sum), float64 arrays of
        shape (1,) to which the batch's summed loss and its hit count are added. With train, backward() may
        follow: it reads these logits and labels, which must be unchanged until then."""
        if getattr(logits, "ndim", None) != 2:
            raise ValueError(f"logits: expected shape (N, C), got {tuple(getattr(logits, 'shape', ()))}")
        xp = self._array_module(logits)
        # The master dtype: fp32, or float64 for a model on the host (model.to_host()).
        if logits.dtype != MASTER_DTYPE and not (xp is np and logits.dtype == np.float64):
            raise TypeError(f"logits: expected {MASTER_DTYPE.name} (or float64 NumPy logits), got {logits.dtype}")
        n = logits.shape[0]
        if getattr(labels, "shape", None) != (n,) or np.dtype(labels.dtype).kind not in "iu":
            raise ValueError(
                f"labels: expected integer labels of shape ({n},), got "
                f"{getattr(labels, 'dtype', type(labels).__name__)} {tuple(getattr(labels, 'shape', ()))}"
            )
        if xp is not np and labels.dtype != np.int32:
            raise TypeError(f"labels: expected int32 device labels, got {labels.dtype}")
        loss_sum, correct_sum = (None, None) if totals is None else totals
        loss = self._buffers.get("loss", (1,), logits.dtype)
        correct = self._buffers.get("correct", (1,), np.int32)
        if xp is np:
            reference.loss.cross_entropy_forward(logits, labels, self.label_smoothing, loss, correct, loss_sum,
                                                 correct_sum)
        else:
            _C.cross_entropy_forward(logits, labels, self.label_smoothing, loss, correct, loss_sum, correct_sum,
                                     op_stream())
        self._saved = (logits, labels) if train else None
        return loss.reshape(()), correct.reshape(())

    def backward(self, scale=None):
        """d(loss)/d(logits) (N, C) fp32, multiplied by `scale` (a float or a device array of shape (1,), e.g. the
        loss scale of mixed-precision training) when given. One call per forward."""
        if self._saved is None:
            raise RuntimeError("SoftmaxCrossEntropy.backward: call forward(logits, labels, train=True) first")
        logits, labels = self._saved
        self._saved = None
        grad = self._buffers.get("grad", logits.shape, logits.dtype)
        if self._buffers.xp is np:
            return reference.loss.cross_entropy_backward(logits, labels, self.label_smoothing, scale, grad)
        return _C.cross_entropy_backward(logits, labels, self.label_smoothing, scale, grad, op_stream())

    def _array_module(self, logits):
        """numpy or cupy, as the logits are; fixed by the first call."""
        xp = self._buffers.xp
        if xp is None:
            xp = self._buffers.xp = array_module(logits)
        elif isinstance(logits, np.ndarray) != (xp is np):
            raise TypeError(f"logits: this loss ran on {xp.__name__} arrays, got a {type(logits).__module__} array "
                            "(use one loss object per placement)")
        return xp
