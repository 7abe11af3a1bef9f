"""One training step: zero_grad, forward, softmax cross-entropy, backward, (loss scaling,) optimizer step.

    step = TrainStep(model, optimizer, label_smoothing=0.1, scaler=GradScaler())   # scaler: fp16 only
    loss, correct = step(x, labels)      # device scalars; nothing is read back to the host

Everything runs on cupy's current stream on preallocated buffers; the only per-call allocations are the two
returned scalars (copies, so a caller may keep them across steps).
"""

from .losses import SoftmaxCrossEntropy


class TrainStep:
    def __init__(self, model, optimizer, *, label_smoothing=0.0, scaler=None):
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.loss_fn = SoftmaxCrossEntropy(label_smoothing)
        model.cuda()

    def __call__(self, x, labels):
        """(loss, correct): 0-d device arrays, the batch's mean loss (fp32) and number of correct predictions
        (int32), from the forward pass before this step's update."""
        model, optimizer, scaler = self.model, self.optimizer, self.scaler
        optimizer.zero_grad()
        logits = model._forward(x, train=True)
        loss, correct = self.loss_fn.forward(logits, labels, train=True)
        scale = scaler.scale_array if scaler is not None and scaler.enabled else None
        model.backward(self.loss_fn.backward(scale))
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        return loss.copy(), correct.copy()

    step = __call__
