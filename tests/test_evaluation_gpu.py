"""The per-epoch evaluation captured in a CUDA graph (training/evaluation.py) against the eager one: the same
kernels on the same weights, so equal to the last bit, before and after training steps change the weights and the
batch-norm running statistics in place."""

import numpy as np
import pytest
from algorithm_modes import modes_by_batch

from resnet_native.nn.models import ResNet18
from resnet_native.optim import SGD
from resnet_native.optim.step import TrainStep
from resnet_native.training.evaluation import Evaluation, evaluate

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")


def test_the_captured_evaluation_replays_what_the_eager_one_computes(rng):
    model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=0)
    x_all = cp.asarray(rng.standard_normal((2500, 32, 32, 3)).astype(np.float16))  # batches of 1000, 1000, 500
    y_all = cp.asarray(rng.integers(0, 10, 2500).astype(np.int32))
    captured = Evaluation(model, x_all, y_all, 1000, cuda_graph=True)
    step = TrainStep(model, SGD(model.parameters(), lr=0.05, momentum=0.9), cuda_graph=True)
    batch = (cp.asarray(rng.standard_normal((128, 32, 32, 3)).astype(np.float16)),
             cp.asarray(rng.integers(0, 10, 128).astype(np.int32)))
    for round_ in range(4):  # warm-up, capture, then two replays, each after training steps moved the model
        want = evaluate(model, x_all, y_all, 1000)
        got = captured()
        assert got == want, (round_, got, want)
        assert captured.captured == (round_ >= 1) and captured.capture_error is None
        for _ in range(3):
            step.run(*batch)
        model.train()
    assert captured() != got  # the replays did see the new weights
    captured.reset()
    assert not captured.captured
    step.reset_graphs()


def test_the_last_partial_batch_takes_heuristic_algorithms(rng):
    """Full batches search; the partial one, evaluated once per evaluation, takes cuDNN's heuristic choices."""
    from resnet_native.ops import conv

    model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=0)
    x_all = cp.asarray(rng.standard_normal((70, 32, 32, 3)).astype(np.float16))  # batches of 32, 32, 6
    y_all = cp.asarray(rng.integers(0, 10, 70).astype(np.int32))
    conv.clear_algorithm_cache()
    Evaluation(model, x_all, y_all, 32)()
    assert modes_by_batch() == {32: {"find"}, 6: {"heuristic"}}, modes_by_batch()
