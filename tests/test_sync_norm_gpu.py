"""Synchronized batch norm's kernels on a GPU (csrc/norm/sync_batch_norm.cu) against the float64 reference: a batch
split between two ranks simulated in one process (their sums added as the all-reduce adds them) gives the ordinary
batch norm of the whole batch, in both layouts, every dtype, with and without ReLU and residual, into poisoned
outputs. Then the layer with a one-rank NCCL all-reduce, eager and in a captured training step."""

import numpy as np
import pytest
from device_values import check_close, host_values, poisoned, random_device, to_device
from test_norm_gpu import f32 as _f32

from resnet_native import reference
from resnet_native.ops import norm

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

EPS = 1e-5


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("relu, residual", [(False, False), (True, False), (True, True)])
def test_two_simulated_ranks_match_the_whole_batch(layout, dtype, relu, residual, rng):
    nchw, c = (8, 24, 5, 7), 24
    x_full = rng.standard_normal(nchw) * 2 + 1
    halves = [x_full[:4], x_full[4:]]
    xs = [to_device(h, dtype, layout) for h in halves]
    zs = [random_device(rng, (4, *nchw[1:]), dtype, layout) for _ in range(2)] if residual else [(None, None)] * 2
    dys = [random_device(rng, (4, *nchw[1:]), dtype, layout) for _ in range(2)]
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = (rng.standard_normal(c) * 0.3).astype(np.float32)
    rm0 = (rng.standard_normal(c) * 0.1).astype(np.float32)
    rv0 = rng.uniform(0.5, 2.0, c).astype(np.float32)
    count = 8 * 5 * 7

    # The float64 reference of the whole batch (NCHW), on the values the device holds.
    hx = np.concatenate([h for _, h in xs])
    hz = np.concatenate([h for _, h in zs]) if residual else None
    hdy = np.concatenate([h for _, h in dys])
    rm_ref, rv_ref = rm0.astype(np.float64), rv0.astype(np.float64)
    y_ref, mean_ref, invstd_ref, _ = reference.norm.batch_norm_train(hx, gamma, beta, rm_ref, rv_ref, layout="NCHW",
                                                                     eps=EPS, z=hz, relu=relu)

    sums = [norm.sync_bn_sums(x, _f32(rm0), layout=layout, sums=poisoned((2, c), "fp32"), dtype=dtype)
            for x, _ in xs]
    total = sums[0] + sums[1]
    outs = []
    for (x, _), (z, _) in zip(xs, zs, strict=True):
        rm, rv = _f32(rm0), _f32(rv0)
        y, mean, invstd = norm.sync_bn_forward(
            x, total, _f32(gamma), _f32(beta), rm, rv, count=count, layout=layout, eps=EPS, z=z, relu=relu,
            out=poisoned((4, *nchw[1:]), dtype, layout), save_mean=poisoned((c,), "fp32"),
            save_invstd=poisoned((c,), "fp32"), dtype=dtype)
        outs.append((y, mean, invstd, rm, rv))
    got_y = np.concatenate([host_values(y, layout) for y, *_ in outs])
    check_close(got_y, y_ref, dtype, "y")
    for _, mean, invstd, rm, rv in outs:
        check_close(mean, mean_ref, 1e-5, "save_mean")
        check_close(invstd, invstd_ref, 1e-5, "save_invstd")
        check_close(rm, rm_ref, 1e-5, "running_mean")
        check_close(rv, rv_ref, 1e-5, "running_var")

    # Backward: the reference's ReLU mask is the device's own y.
    dx_ref, dgamma_ref, dbeta_ref, dz_ref = reference.norm.batch_norm_backward(
        hx, hdy, gamma, beta, mean_ref, invstd_ref, layout="NCHW", eps=EPS, y=got_y if relu else None, relu=relu,
        has_z=residual)
    grads = []
    for (x, _), (dy, _), (y, mean, invstd, _, _) in zip(xs, dys, outs, strict=True):
        grads.append(norm.sync_bn_grad_sums(
            x, dy, mean, invstd, layout=layout, y=y if relu else None, relu=relu, has_z=residual,
            sums=poisoned((2, c), "fp32"), dgamma=poisoned((c,), "fp32"), dbeta=poisoned((c,), "fp32"),
            dz=poisoned((4, *nchw[1:]), dtype, layout) if residual else None, dtype=dtype))
    grad_total = grads[0][0] + grads[1][0]
    dxs = [norm.sync_bn_backward(x, dy, _f32(gamma), mean, invstd, grad_total, count=count, layout=layout,
                                 y=y if relu else None, relu=relu, dx=poisoned((4, *nchw[1:]), dtype, layout),
                                 dtype=dtype)
           for (x, _), (dy, _), (y, mean, invstd, _, _) in zip(xs, dys, outs, strict=True)]
    check_close(np.concatenate([host_values(d, layout) for d in dxs]), dx_ref, dtype, "dx")
    check_close(grads[0][1] + grads[1][1], dgamma_ref, dtype, "dgamma (the ranks' shares added)")
    check_close(grads[0][2] + grads[1][2], dbeta_ref, dtype, "dbeta (the ranks' shares added)")
    if residual:
        check_close(np.concatenate([host_values(g[3], layout) for g in grads]), dz_ref, dtype, "dz")


def test_the_layer_with_a_one_rank_nccl_all_reduce_trains_like_per_gpu_batch_norm(rng):
    """At world size 1 the statistics of all ranks are this rank's: synchronized and ordinary batch norm train
    alike (up to rounding: other kernels), eager and captured in a CUDA graph (the NCCL sums recorded in it)."""
    nccl = pytest.importorskip("cupy.cuda.nccl")
    if not getattr(nccl, "available", True):
        pytest.skip("cupy's NCCL library is not available")
    from resnet_native.distributed import World, rendezvous
    from resnet_native.distributed.allreduce import NcclAllReduce
    from resnet_native.distributed.launch import free_port
    from resnet_native.nn.layers import synchronize_batch_norms
    from resnet_native.nn.models import ResNet18
    from resnet_native.optim import SGD
    from resnet_native.optim.step import TrainStep

    batches = [(cp.asarray(rng.standard_normal((32, 16, 16, 3)).astype(np.float32)),
                cp.asarray(rng.integers(0, 10, 32).astype(np.int32))) for _ in range(4)]
    world = World(master_port=free_port())

    def train(sync, cuda_graph, lr):
        model = ResNet18(num_classes=10, layout="NHWC", precision="fp32", seed=3)
        opt = SGD(model.parameters(), lr=lr, momentum=0.9)
        step = TrainStep(model, opt, cuda_graph=cuda_graph)
        if sync is not None:
            assert synchronize_batch_norms(model, sync) == 20
        losses = [float(step(x, y)[0]) for x, y in batches]
        assert step.capture_error is None, step.capture_error
        grads = {name: p.grad.get() for name, p in model.named_parameters()}  # the last step's
        state = model.state_dict()
        step.reset_graphs()
        return losses, grads, state

    # The last step's gradients in float64 on the host (lr 0: the weights of every step are the initial ones; in
    # training mode the running statistics do not enter), the mean cross-entropy's gradient as TrainStep takes it.
    exact_model = ResNet18(num_classes=10, layout="NHWC", precision="fp32", seed=3).to_host()
    x_last, y_last = batches[-1][0].get().astype(np.float64), batches[-1][1].get()
    logits = exact_model.forward(x_last, train=True)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y_last)), y_last] -= 1.0
    exact_model.backward(p / len(y_last))
    exact = {name: np.asarray(q.grad, np.float64) for name, q in exact_model.named_parameters()}

    with rendezvous(world, 30.0) as store:
        ar = NcclAllReduce(store, world)
        try:
            for cuda_graph in (False, True):
                # lr 0: every step sees the same weights, so the two kinds of batch norm must agree to rounding
                # in loss, gradients and running statistics (training amplifies rounding from step to step).
                # This network amplifies rounding in its gradients (an input perturbation of 1e-6 moves most of
                # them by ~1e-2), so a fixed bound says little: each gradient of the synchronized network must be
                # as close to float64 as cuDNN's batch norm brings the ordinary one, or as its own rerun moves it
                # (its fp32 atomics add in another order; amplified alike), within 3x, floor 1e-4.
                plain, synced = train(None, cuda_graph, 0.0), train(ar, cuda_graph, 0.0)
                again = train(ar, cuda_graph, 0.0)  # its fp32 atomics make a rerun differ: by how much, here
                np.testing.assert_allclose(synced[0], plain[0], rtol=1e-5)
                # Both against the float64 network: the judge of which batch norm is off where they differ.
                table, failed = [], []
                for name, want in exact.items():
                    err = reference.relative_error(np.asarray(synced[1][name], np.float64), want)
                    base = reference.relative_error(np.asarray(plain[1][name], np.float64), want)
                    rerun = reference.relative_error(np.asarray(again[1][name], np.float64),
                                                     np.asarray(synced[1][name], np.float64))
                    table.append(f"{name:32s} synchronized {err:.2e}  cuDNN {base:.2e}  synchronized rerun {rerun:.2e}")
                    if not err <= max(1e-4, 3 * base, 3 * rerun):
                        failed.append(f"{name}: {err:.3g} (cuDNN's batch norm: {base:.3g}, rerun {rerun:.3g})")
                print(f"cuda_graph={cuda_graph}: gradients against float64\n" + "\n".join(table))
                assert not failed, f"cuda_graph={cuda_graph}: " + "; ".join(failed)
                for name, want in plain[2].items():
                    if name.endswith("num_batches_tracked") or not np.any(want):  # counts; biases still at 0 (lr 0)
                        assert np.array_equal(np.asarray(synced[2][name]), np.asarray(want)), name
                    else:
                        check_close(synced[2][name], np.asarray(want, np.float64), 1e-4, name)
                # Training: the same curve, within what 4 steps of lr 0.05 make of rounding differences.
                plain, synced = train(None, cuda_graph, 0.05), train(ar, cuda_graph, 0.05)
                np.testing.assert_allclose(synced[0], plain[0], rtol=2e-2)
        finally:
            ar.close()
