"""GPU tests of the CUDA-graph training step (TrainStep(cuda_graph=True)) and of what it relies on: the device
hyperparameters a schedule moves under replay, the workspace pool's hold for captured graphs, and AdamW's
device step counter that skipped (inf/nan) updates do not advance."""

import cupy as cp
import numpy as np
import pytest

import resnet_native as rn
from resnet_native import _C
from resnet_native.nn.models import ResNet18
from resnet_native.optim import SGD, AdamW, GradScaler, OneCycleSchedule
from resnet_native.optim.step import TrainStep
from resnet_native.train import make_deterministic

pytestmark = pytest.mark.gpu


def _batches(rng, count, n, layout, dtype):
    shape = (n, 16, 16, 3) if layout == "NHWC" else (n, 3, 16, 16)
    np_dtype = np.float16 if dtype == "fp16" else np.float32
    return [
        (cp.asarray(rng.standard_normal(shape).astype(np_dtype)), cp.asarray(rng.integers(0, 10, n).astype(np.int32)))
        for _ in range(count)
    ]


def _run(kind, dtype, batches, cuda_graph, direct_gradients=False):
    model = ResNet18(num_classes=10, layout="NHWC", precision=dtype, seed=11)
    # Deterministic algorithms: the eager and the replayed steps then run the very same kernels, and what is
    # compared is the graph's bookkeeping (inputs, hyperparameters, state), not reduction order.
    make_deterministic(model)
    if kind == "sgd":
        opt = SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    else:
        opt = AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    # One-cycle moves lr and momentum/beta1 every step: the graph must read the new values at each replay.
    schedule = OneCycleSchedule(opt, len(batches))
    scaler = GradScaler(init_scale=2.0**12) if dtype == "fp16" else None
    step = TrainStep(model, opt, scaler=scaler, cuda_graph=cuda_graph, direct_gradients=direct_gradients)
    losses = []
    for x, y in batches:
        loss, _ = step(x, y)
        losses.append(float(loss))
        schedule.step()
    totals = step.read_totals()
    graphs, error = step.num_graphs, step.capture_error
    state, opt_state = model.state_dict(), opt.state_dict()
    step.reset_graphs()
    return losses, totals, graphs, error, state, opt_state


@pytest.mark.parametrize("kind,dtype", [("sgd", "fp32"), ("adamw", "fp16"), ("sgd", "fp16")])
def test_captured_steps_follow_the_eager_steps(rng, kind, dtype):
    batches = _batches(rng, 6, 16, "NHWC", dtype)
    eager = _run(kind, dtype, batches, cuda_graph=False)
    graphed = _run(kind, dtype, batches, cuda_graph=True)
    assert graphed[3] is None, graphed[3]
    assert graphed[2] == 1  # step 1 warmed up, step 2 was captured, steps 2-6 replayed it
    assert eager[2] == 0
    tol = 1e-5 if dtype == "fp32" else 1e-3
    np.testing.assert_allclose(graphed[0], eager[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(graphed[1][:2], eager[1][:2], rtol=tol)
    assert graphed[1][2] == eager[1][2] == 6 * 16
    assert abs(graphed[1][0] - sum(16 * v for v in eager[0])) <= tol * abs(graphed[1][0])
    for name, want in eager[4].items():
        got = graphed[4][name]
        if name.endswith("num_batches_tracked"):
            assert int(got) == int(want) == 6, name
            continue
        err = np.linalg.norm(np.asarray(got, np.float64) - want) / max(np.linalg.norm(want), 1e-12)
        assert err <= 10 * tol, (name, err)
    assert int(graphed[5]["step"]) == int(eager[5]["step"])
    # The parameters moved (a graph that never ran would leave them at the initial values).
    initial = ResNet18(num_classes=10, layout="NHWC", precision=dtype, seed=11).state_dict()
    assert not np.allclose(graphed[4]["fc.weight"], initial["fc.weight"])


@pytest.mark.parametrize("kind,dtype", [("sgd", "fp16"), ("adamw", "fp16")])
def test_direct_gradients_replay_the_same_updates(rng, kind, dtype):
    """The optimizer reading the convolutions' low-precision filter gradients in place (two batch shapes, each
    captured) updates every parameter bit for bit as the step through the fp32 gradients does."""
    batches = _batches(rng, 4, 16, "NHWC", dtype) + _batches(rng, 4, 12, "NHWC", dtype)
    plain = _run(kind, dtype, batches, cuda_graph=True)
    direct = _run(kind, dtype, batches, cuda_graph=True, direct_gradients=True)
    assert direct[3] is None and direct[2] == plain[2] == 2, direct[3]
    assert direct[0] == plain[0]
    for name, want in plain[4].items():
        np.testing.assert_array_equal(direct[4][name], want, err_msg=name)
    for name, want in plain[5].items():
        np.testing.assert_array_equal(np.asarray(direct[5][name]), np.asarray(want), err_msg=name)


def test_a_new_input_shape_warms_up_and_gets_its_own_graph(rng):
    model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=3)
    step = TrainStep(model, SGD(model.parameters(), lr=0.01, momentum=0.9), scaler=GradScaler(), cuda_graph=True)
    big, small = _batches(rng, 1, 16, "NHWC", "fp16")[0], _batches(rng, 1, 8, "NHWC", "fp16")[0]
    for x, y in (big, big, small, big, small, small):
        loss, correct = step(x, y)
        assert np.isfinite(float(loss)) and 0 <= int(correct) <= len(y)
    assert step.num_graphs == 2 and step.capture_error is None
    assert step.read_totals()[2] == 3 * 16 + 3 * 8
    assert _C.workspace_stats()["graph_holds"] == 2
    step.reset_graphs()
    assert _C.workspace_stats()["graph_holds"] == 0


def test_the_workspace_retires_buffers_while_a_graph_holds_it():
    stream = rn.current_stream()
    rn.release_workspace()  # also frees what earlier tests' graphs left retired
    _C.reserve_workspace(1 << 20, stream)
    size = _C.workspace_stats()["size"]
    assert _C._workspace_graph_hold(True) == 1
    try:
        _C.reserve_workspace(size + (8 << 20), stream)
        stats = _C.workspace_stats()
        assert stats["retired"] == size and stats["size"] >= size + (8 << 20)
        with pytest.raises(ValueError, match="captured CUDA graph"):
            rn.release_workspace()
    finally:
        assert _C._workspace_graph_hold(False) == 0
    rn.release_workspace()
    stats = _C.workspace_stats()
    assert stats["retired"] == 0 and stats["size"] == 0


def test_adamw_does_not_count_updates_the_scaler_skips(rng):
    model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=4)
    opt = AdamW(model.parameters(), lr=1e-3)
    scaler = GradScaler(init_scale=1024.0)
    step = TrainStep(model, opt, scaler=scaler)
    x = rng.standard_normal((4, 16, 16, 3)).astype(np.float16)
    labels = cp.asarray(rng.integers(0, 10, 4).astype(np.int32))
    x[0, 1, 2, 0] = np.inf
    step(cp.asarray(x), labels)
    assert int(cp.asnumpy(scaler.found_inf)[0]) == 1
    assert opt.step_count == 1 and opt.applied_steps == 0
    x[0, 1, 2, 0] = 0
    step(cp.asarray(x), labels)
    assert opt.step_count == 2 and opt.applied_steps == 1 and opt.state_dict()["step"] == 1
    # The trainer's checkpoints copy the device counter itself, with the scaler's state, beside the arrays.
    from resnet_native.training.snapshot import HostSnapshot

    copies = HostSnapshot().take({"o": opt.state_sources(), "s": scaler.state_sources()}).resolve()
    assert copies["o"]["step"] == 1 and copies["s"] == {"scale": 512.0, "growth_tracker": 1}


def test_write_scalars_and_advance_step_on_the_device():
    from resnet_native.ops import multi_tensor as mt

    dst = cp.full((3,), np.nan, dtype=cp.float32)
    mt.write_scalars(dst, (0.25, -1.5, 7.0))
    np.testing.assert_array_equal(cp.asnumpy(dst), np.float32([0.25, -1.5, 7.0]))
    with pytest.raises(ValueError, match="dst"):
        mt.write_scalars(dst, (1.0, 2.0))
    step, found = cp.zeros((1,), cp.float32), cp.zeros((1,), cp.int32)
    mt.advance_step(step, found)
    mt.advance_step(step)
    found.fill(1)
    mt.advance_step(step, found)
    assert float(step[0]) == 2.0


def test_fused_unscale_equals_a_separate_unscale_pass(rng):
    """GradScaler.step multiplies the gradients by 1/scale inside the optimizer kernel; unscale_() first (a
    separate pass over the gradients) must give the same parameters."""
    from resnet_native.ops.losses import SoftmaxCrossEntropy
    from resnet_native.train import make_deterministic

    batches = _batches(rng, 5, 8, "NHWC", "fp16")
    states, scales = [], []
    # The first run only fills the algorithm cache: both compared runs then take the same deterministic
    # algorithms, so the unscale placement is the only difference (training amplifies any other rounding).
    for separate in (None, False, True):
        model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=21)
        make_deterministic(model)
        model.cuda()
        opt = SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        scaler, loss_fn = GradScaler(init_scale=2.0**10), SoftmaxCrossEntropy()
        for x, y in batches:
            opt.zero_grad()
            loss_fn.forward(model.forward(x, train=True, copy=False), y, train=True)
            model.backward(loss_fn.backward(scaler.scale_array))
            if separate:
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        if separate is not None:
            states.append(model.state_dict())
            scales.append(scaler.get_scale())
    assert scales[0] == scales[1], scales  # the same steps skipped (if any)
    for name, want in states[1].items():
        got = np.asarray(states[0][name], np.float64)
        err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-12)
        assert err <= 1e-3, (name, err)


def test_loss_scale_update_follows_the_numpy_rule(rng):
    """The native update_loss_scale and reciprocal_scale against update_scale on NumPy, over a random sequence of
    good and overflowing steps (growth after 3 good steps, backoff on inf)."""
    from resnet_native import _C
    from resnet_native.optim.grad_scaler import update_scale

    kw = dict(growth_factor=2.0, backoff_factor=0.25, growth_interval=3)
    scale, tracker, found = cp.full((1,), 1024.0, cp.float32), cp.zeros((1,), cp.int32), cp.zeros((1,), cp.int32)
    inv = cp.full((1,), np.nan, cp.float32)
    host = {k: np.empty(1, bool) for k in ("good", "grow", "both")} | {"factor": np.empty(1), "term": np.empty(1)}
    h_scale, h_tracker = np.array([1024.0]), np.zeros(1, np.int32)
    for inf in rng.random(40) < 0.2:
        found.fill(int(inf))
        _C.update_loss_scale(scale, tracker, found, kw["growth_factor"], kw["backoff_factor"], kw["growth_interval"],
                             0)
        update_scale(np, h_scale, h_tracker, np.array([int(inf)], np.int32), scratch=host, **kw)
        assert float(scale[0]) == h_scale[0] and int(tracker[0]) == h_tracker[0]
    _C.reciprocal_scale(scale, inv, 0)
    assert float(inv[0]) == np.float32(1.0) / np.float32(h_scale[0])
    with pytest.raises(ValueError, match="growth_interval"):
        _C.update_loss_scale(scale, tracker, found, 2.0, 0.5, 0, 0)
