"""Float64 NumPy version of the softmax cross-entropy kernels, with the signatures of resnet_native._C's
cross_entropy_forward / cross_entropy_backward (resnet_native.ops.losses calls them for host logits).

    target = (1 - s) * onehot(label) + s / C
    loss_i = logsumexp(z_i) - sum_j target_ij z_ij
    dz     = (softmax(z) - target) * scale / N

As the kernels: outputs are given, of shape (1,); `loss` gets the mean, `correct` the argmax hits, `loss_sum` and
`correct_sum` have the sums added; a label outside [0, C) makes its row's loss and gradient NaN.
"""

import numpy as np


def _rows(logits, labels, label_smoothing):
    z = np.asarray(logits, dtype=np.float64)
    n, c = z.shape
    labels = np.asarray(labels)
    valid = (labels >= 0) & (labels < c)
    target = np.full((n, c), label_smoothing / c)
    target[np.flatnonzero(valid), labels[valid]] += 1.0 - label_smoothing
    target[~valid] = np.nan
    row_max = z.max(axis=1, keepdims=True)
    exp = np.exp(z - row_max)
    total = exp.sum(axis=1, keepdims=True)
    return z, target, exp / total, (np.log(total) + row_max)[:, 0]


def cross_entropy_forward(logits, labels, label_smoothing, loss=None, correct=None, loss_sum=None,
                          correct_sum=None):
    z, target, _, logsumexp = _rows(logits, labels, label_smoothing)
    per_row = logsumexp - (target * z).sum(axis=1)
    hits = int((z.argmax(axis=1) == np.asarray(labels)).sum())
    if loss is not None:
        loss[0] = per_row.mean()
    if correct is not None:
        correct[0] = hits
    if loss_sum is not None:
        loss_sum[0] += per_row.sum()
    if correct_sum is not None:
        correct_sum[0] += hits


def cross_entropy_backward(logits, labels, label_smoothing, scale, grad):
    _, target, softmax, _ = _rows(logits, labels, label_smoothing)
    factor = 1.0 if scale is None else float(np.asarray(scale).reshape(-1)[0])
    grad[...] = (softmax - target) * (factor / len(target))
    return grad
