"""Overlapping the gradient all-reduce with backward, on the host: the model reports every parameter once, as its
gradient becomes final; the default session averages once at the end; a TrainStep with overlap_allreduce gives the
same weights as one without."""

import numpy as np
import pytest

from resnet_native.distributed.allreduce import GradientAllReduce
from resnet_native.distributed.overlap import DeferredOverlap
from resnet_native.nn.models import ResNet18
from resnet_native.optim import SGD
from resnet_native.optim.step import TrainStep


class RecordingAllReduce(GradientAllReduce):
    """Halves every gradient (a visible 'average'), recording the calls."""

    def __init__(self):
        self.calls = []

    def average(self, grads) -> None:
        self.calls.append(len(grads))
        for g in grads:
            g *= 0.5


def _batch(rng):
    return rng.standard_normal((4, 8, 8, 3)), rng.integers(0, 10, 4).astype(np.int32)


def test_backward_reports_every_parameter_once_in_the_order_it_is_final(rng):
    model = ResNet18(num_classes=10, layout="NHWC", seed=0).to_host()
    x, y = _batch(rng)
    model.forward(x, train=True)
    groups = []
    model.backward(np.ones((4, 10)) / 40, on_ready=lambda params: groups.append(list(params)))
    reported = [id(p) for g in groups for p in g]
    assert sorted(reported) == sorted(id(p) for p in model.parameters())  # all, each once
    assert groups[0] == model.fc.parameters() and groups[-1][0] is model.conv1.weight
    assert len(groups) == 1 + 8 + 1  # the classifier, ResNet-18's 8 blocks, the stem


def test_the_default_session_averages_once_at_finish():
    ar = RecordingAllReduce()
    grads = [np.ones(3), np.ones(2)]
    session = ar.overlapping(grads)
    assert isinstance(session, DeferredOverlap)
    session.ready([1])
    session.ready([0])
    assert ar.calls == []
    session.finish()
    assert ar.calls == [2] and all(np.all(g == 0.5) for g in grads)
    with pytest.raises(RuntimeError, match="finish\\(\\) called twice"):
        session.finish()
    with pytest.raises(IndexError, match="not a gradient of this session"):
        ar.overlapping(grads).ready([2])


def test_an_overlapped_step_trains_like_the_plain_one(rng):
    batches = [_batch(rng) for _ in range(3)]
    states = []
    for overlap in (False, True):
        model = ResNet18(num_classes=10, layout="NHWC", seed=1).to_host()
        opt = SGD(model.parameters(), lr=0.05, momentum=0.9)
        step = TrainStep(model, opt, allreduce=RecordingAllReduce(), overlap_allreduce=overlap)
        for x, y in batches:
            step(x, y)
        assert step.allreduce.calls == [len(opt.params)] * 3
        states.append(model.state_dict())
    for name, want in states[0].items():
        np.testing.assert_array_equal(states[1][name], want, err_msg=name)


def test_overlap_needs_an_allreduce_and_a_bool():
    model = ResNet18(num_classes=10, seed=0).to_host()
    opt = SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="needs an allreduce"):
        TrainStep(model, opt, overlap_allreduce=True)
    with pytest.raises(TypeError, match="overlap_allreduce: expected True or False"):
        TrainStep(model, opt, allreduce=RecordingAllReduce(), overlap_allreduce=1)


def test_the_trainer_takes_the_flag_and_refuses_it_with_sync_bn():
    from resnet_native.training import cli

    cfg = cli.resolve_config(cli.build_parser().parse_args(["--recipe", "A", "--overlap-allreduce"]))
    assert cfg.overlap_allreduce and not cfg.sync_bn
    with pytest.raises((ValueError, SystemExit), match="overlap_allreduce: not with sync_bn"):
        cli.resolve_config(cli.build_parser().parse_args(["--recipe", "A", "--overlap-allreduce", "--sync-bn"]))


def test_the_session_takes_the_gradients_in_the_model_s_order_whatever_the_optimizer_s_groups(rng):
    """With the batch norms in a parameter group of their own the optimizer lists them last; the overlapped
    all-reduce still plans its buckets in the order backward finishes the gradients, and trains as without it."""

    class OrderRecording(RecordingAllReduce):
        def overlapping(self, grads):
            self.orders = getattr(self, "orders", []) + [[id(g) for g in grads]]
            return super().overlapping(grads)

    from resnet_native.nn.layers import BatchNorm2d

    batches = [_batch(rng) for _ in range(2)]
    states = []
    for overlap in (False, True):
        model = ResNet18(num_classes=10, layout="NHWC", seed=2).to_host()
        norm = {id(p) for _, m in model.named_modules() if isinstance(m, BatchNorm2d) for p in m.parameters()}
        opt = SGD([{"params": [p for p in model.parameters() if id(p) not in norm]},
                   {"params": [p for p in model.parameters() if id(p) in norm], "weight_decay": 0.0}],
                  lr=0.05, momentum=0.9, weight_decay=1e-3)
        assert [id(p) for p in opt.params] != [id(p) for p in model.parameters()]
        step = TrainStep(model, opt, allreduce=OrderRecording(), overlap_allreduce=overlap)
        for x, y in batches:
            step(x, y)
        if overlap:
            assert step.allreduce.orders == [[id(p.grad) for p in model.parameters()]] * 2
        states.append(model.state_dict())
    for name, want in states[0].items():
        np.testing.assert_array_equal(states[1][name], want, err_msg=name)

