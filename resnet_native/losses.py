"""Softmax cross-entropy with label smoothing, in fp32, on preallocated buffers (no allocation per call).

    target = (1 - s) * onehot(label) + s / C
    loss   = mean_i( logsumexp(z_i) - sum_j target_ij z_ij )
    dz     = (softmax(z) - target) / N

forward() computes the loss, the number of correct predictions (argmax == label) and the gradient
together, all as device arrays (nothing is read back to the host). Each step is one cupy ufunc or reduction
with out=, so the same code runs on NumPy for models on the host: the logits' array module is the one used,
and one loss object serves logits of one kind (device or NumPy).
"""

import numpy as np

from .layers.buffers import BufferCache
from .layers.placement import array_module
from .names import MASTER_DTYPE


class SoftmaxCrossEntropy:
    def __init__(self, label_smoothing: float = 0.0):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing: expected a float in [0, 1), got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)
        self._buffers = BufferCache()
        self._grad = None

    def forward(self, logits, labels, train: bool = True):
        """(loss, correct): 0-d device arrays, fp32 mean loss and int32 count of argmax hits. These are this
        object's buffers, rewritten by the next call. With train, the gradient is kept for backward()."""
        if getattr(logits, "ndim", None) != 2:
            raise ValueError(f"logits: expected shape (N, C), got {tuple(getattr(logits, 'shape', ()))}")
        xp = self._array_module(logits)
        # The master dtype: fp32, or float64 for a model on the host (model.to_host()).
        if logits.dtype != MASTER_DTYPE and not (xp is np and logits.dtype == np.float64):
            raise TypeError(f"logits: expected {MASTER_DTYPE.name} (or float64 NumPy logits), got {logits.dtype}")
        n, c = logits.shape
        if getattr(labels, "shape", None) != (n,) or np.dtype(labels.dtype).kind not in "iu":
            raise ValueError(
                f"labels: expected integer labels of shape ({n},), got "
                f"{getattr(labels, 'dtype', type(labels).__name__)} {tuple(getattr(labels, 'shape', ()))}"
            )
        dt, buf = logits.dtype, self._buffers.get
        s = self.label_smoothing
        row_max, row_sum, row_dot = buf("max", (n,), dt), buf("sum", (n,), dt), buf("dot", (n,), dt)
        prob, target, scratch = (
            buf("prob", (n, c), dt),
            buf("target", (n, c), dt),
            buf("scratch", (n, c), dt),
        )
        onehot, hit = buf("onehot", (n, c), np.bool_), buf("hit", (n,), np.bool_)
        pred = buf("pred", (n,), np.int64)
        loss, correct = buf("loss", (), dt), buf("correct", (), np.int32)
        classes = self._classes(c)

        xp.max(logits, axis=1, out=row_max)
        xp.subtract(logits, row_max[:, None], out=prob)
        xp.exp(prob, out=prob)
        xp.sum(prob, axis=1, out=row_sum)
        xp.divide(prob, row_sum[:, None], out=prob)  # softmax
        xp.log(row_sum, out=row_sum)
        xp.add(row_sum, row_max, out=row_sum)  # logsumexp
        xp.equal(labels[:, None], classes[None, :], out=onehot)
        xp.multiply(onehot, 1.0 - s, out=target)
        xp.add(target, s / c, out=target)
        xp.multiply(target, logits, out=scratch)
        xp.sum(scratch, axis=1, out=row_dot)
        xp.subtract(row_sum, row_dot, out=row_sum)  # per-sample loss
        xp.sum(row_sum, out=loss)
        xp.multiply(loss, 1.0 / n, out=loss)

        xp.argmax(logits, axis=1, out=pred)
        xp.equal(pred, labels, out=hit)
        xp.sum(hit, dtype=np.int32, out=correct)

        if train:
            grad = buf("grad", (n, c), dt)
            xp.subtract(prob, target, out=grad)
            xp.multiply(grad, 1.0 / n, out=grad)
            self._grad = grad
        else:
            self._grad = None
        return loss, correct

    def backward(self, scale=None):
        """d(loss)/d(logits) (N, C) fp32, multiplied in place by `scale` (a float or a device array of shape
        (1,), e.g. the loss scale of mixed-precision training) when given. One call per forward."""
        grad = self._grad
        if grad is None:
            raise RuntimeError("SoftmaxCrossEntropy.backward: call forward(logits, labels, train=True) first")
        self._grad = None
        if scale is not None:
            self._buffers.xp.multiply(grad, scale, out=grad)
        return grad

    def _array_module(self, logits):
        """numpy or cupy, as the logits are; fixed by the first call."""
        xp = self._buffers.xp
        if xp is None:
            xp = self._buffers.xp = array_module(logits)
        elif isinstance(logits, np.ndarray) != (xp is np):
            raise TypeError(f"logits: this loss ran on {xp.__name__} arrays, got a {type(logits).__module__} array "
                            "(use one loss object per placement)")
        return xp

    def _classes(self, c):
        classes = self._buffers.find("classes", (c,))
        if classes is None:
            classes = self._buffers.xp.arange(c, dtype=np.int32)
            self._buffers.store("classes", (c,), classes)
        return classes
