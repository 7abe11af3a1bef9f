"""The NCCL gradient all-reduce on one GPU (a one-rank communicator: the code path of a job's ranks).

- NcclAllReduce against a float64 NumPy mean, over several buckets, fp32 and fp16, poisoned buffers, plan reuse.
- TrainStep with the all-reduce, eager and captured in the step's CUDA graph: the same losses and weights, bit for
  bit, as the single-process step (deterministic algorithms; a one-rank sum is exact).
- The Trainer, world size 1 with an NCCL all-reduce, against the single-process Trainer: the same history and
  weights. And the rank's GPU choice (distributed.rank.use_local_gpu).
"""

import cupy as cp
import numpy as np
import pytest
from cpu_stand_ins import tiny_cifar

from resnet_native.distributed import World, rendezvous
from resnet_native.distributed.launch import free_port
from resnet_native.distributed.rank import use_local_gpu
from resnet_native.formats import checkpoint
from resnet_native.nn.models import ResNet18
from resnet_native.optim import SGD, GradScaler
from resnet_native.optim.step import TrainStep
from resnet_native.train import make_deterministic
from resnet_native.training import cli, loop

pytestmark = pytest.mark.gpu

nccl = pytest.importorskip("cupy.cuda.nccl", reason="cupy has no NCCL bindings here")
if not getattr(nccl, "available", True):
    pytest.skip("cupy's NCCL library is not available (install the multigpu extra)", allow_module_level=True)

from resnet_native.distributed.allreduce import NcclAllReduce  # noqa: E402 (after the skip)


@pytest.fixture
def one_rank():
    world = World(master_port=free_port())
    with rendezvous(world, 30.0) as store:
        yield world, store


def _grads(rng, dtype, sizes):
    return [cp.asarray(rng.standard_normal(s).astype(dtype)) for s in sizes]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_buckets_average_like_numpy(one_rank, rng, dtype):
    world, store = one_rank
    # 11 gradients of mixed shapes, a zero-size one among them, in 1 KiB buckets: several buckets, some with one
    # gradient larger than the bucket.
    sizes = [(3, 3, 3, 16), (16,), (700,), (0,), (5, 7), (1,), (64, 64), (33,), (2, 2, 2, 2), (300,), (17, 3)]
    ar = NcclAllReduce(store, world, bucket_bytes=1024)
    try:
        grads = _grads(rng, dtype, sizes)
        want = [g.get().astype(np.float64) / world.world_size for g in grads]
        ar.average(grads)
        cp.cuda.get_current_stream().synchronize()
        assert len(ar._plan.buckets) >= 5, ar._plan.buckets
        for g, w in zip(grads, want, strict=True):
            assert g.dtype == dtype and g.shape == w.shape
            np.testing.assert_array_equal(g.get().astype(np.float64), w)
        # The same layout again: the plan and its buffers are kept; poisoned buffers do not leak into the result.
        plan, buffers = ar._plan, list(ar._buffers)
        for b in buffers:
            b.fill(np.nan)
        grads = _grads(rng, dtype, sizes)
        want = [g.get() for g in grads]
        ar.average(grads)
        assert ar._plan is plan and all(a is b for a, b in zip(ar._buffers, buffers, strict=True))
        for g, w in zip(grads, want, strict=True):
            np.testing.assert_array_equal(g.get(), w)
        ar.average(grads[:3])  # another layout: a new plan
        assert ar._plan is not plan
        with pytest.raises(TypeError, match="grads: expected one dtype of"):
            ar.average([cp.zeros(3, np.float32), cp.zeros(3, np.float16)])
        with pytest.raises(ValueError, match=r"grads\[0\]: expected a C-contiguous array"):
            ar.average([cp.zeros((4, 4), np.float32)[:, ::2]])
        with pytest.raises(TypeError, match=r"grads\[0\]: expected a cupy array"):
            ar.average([np.zeros(3, np.float32)])
    finally:
        ar.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_bf16_wire_rounds_each_gradient_to_bf16_once(one_rank, rng, dtype):
    """At world size 1 the bf16 sum is one value: each gradient comes back as itself rounded to bf16 (to nearest
    even, the cast kernel's rounding, checked against the NumPy reference cast)."""
    from resnet_native import reference

    world, store = one_rank
    sizes = [(3, 3, 3, 16), (16,), (700,), (0,), (5, 7), (64, 64)]
    ar = NcclAllReduce(store, world, bucket_bytes=1024, wire="bf16")
    try:
        grads = _grads(rng, dtype, sizes)
        want = []
        for g in grads:
            host = g.get().astype(np.float32)
            bits = reference.kernels.cast(host, np.empty(host.shape, np.uint16))
            want.append(reference.kernels.cast(bits, np.empty(host.shape, np.float32)).astype(dtype))
        ar.average(grads)
        assert len(ar._plan.buckets) >= 4 and all(b.dtype == np.uint16 for b in ar._buffers)
        for g, w in zip(grads, want, strict=True):
            assert g.dtype == dtype
            np.testing.assert_array_equal(g.get(), w)
    finally:
        ar.close()


def _train(batches, allreduce=None, cuda_graph=False, overlap=False):
    model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=5)
    make_deterministic(model)
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    step = TrainStep(model, opt, scaler=GradScaler(init_scale=2.0**10), cuda_graph=cuda_graph, allreduce=allreduce,
                     overlap_allreduce=overlap)
    losses = [float(step(x, y)[0]) for x, y in batches]
    state = model.state_dict()
    graphs, error = step.num_graphs, step.capture_error
    step.reset_graphs()
    return losses, state, graphs, error


@pytest.mark.parametrize("overlap", [False, True], ids=["after", "overlapped"])
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "captured"])
def test_train_step_with_the_all_reduce_matches_the_single_process_step(one_rank, rng, cuda_graph, overlap):
    """The all-reduce after backward, or overlapped with it (buckets on a communication stream, forked and joined
    by events, inside the captured graph too): at world size 1 the step is the single-process step, bit for bit."""
    world, store = one_rank
    batches = [(cp.asarray(rng.standard_normal((32, 16, 16, 3)).astype(np.float16)),
                cp.asarray(rng.integers(0, 10, 32).astype(np.int32))) for _ in range(6)]
    single = _train(batches, cuda_graph=cuda_graph)
    ar = NcclAllReduce(store, world, bucket_bytes=1 << 20)  # ResNet-18's 44 MiB of fp32 gradients: ~45 buckets
    try:
        ranked = _train(batches, allreduce=ar, cuda_graph=cuda_graph, overlap=overlap)
        assert len(ar._plan.buckets) > 10
    finally:
        ar.close()
    assert ranked[3] is None, ranked[3]  # no capture error: the NCCL calls are in the graph
    assert ranked[2] == single[2] == (1 if cuda_graph else 0)
    assert ranked[0] == single[0] and all(np.isfinite(ranked[0]))
    for name, want in single[1].items():
        assert ranked[1][name].tobytes() == want.tobytes(), name


def test_store_all_reduce_is_refused_in_a_captured_step(one_rank):
    from resnet_native.distributed.allreduce import StoreAllReduce

    world, store = one_rank
    model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=5)
    opt = SGD(model.parameters(), lr=0.05)
    with pytest.raises(ValueError, match="cuda_graph: StoreAllReduce cannot be captured"):
        TrainStep(model, opt, cuda_graph=True, allreduce=StoreAllReduce(store, world))


def test_trainer_world_size_one_over_nccl_matches_the_single_process_trainer(one_rank, tmp_path):
    world, store = one_rank
    cfg = cli.resolve_config(cli.build_parser().parse_args(
        ["--recipe", "A", "--epochs", "2", "--batch-size", "16", "--eval-batch-size", "8", "--eval-every", "1",
         "--seed", "2", "--cutout", "0", "--deterministic", "--warmup-epochs", "0"]))
    data = tiny_cifar(np.random.default_rng(7))

    def run(out, **kw):
        trainer = loop.Trainer(cfg, out, data=data, progress=False, tensorboard=False, **kw)
        summary = trainer.run()
        summary["history"] = checkpoint.load_checkpoint(out / "last.npz")["metrics"]["history"]
        return summary, trainer.model.state_dict()

    single, w_single = run(tmp_path / "single")
    ar = NcclAllReduce(store, world)
    try:
        ranked, w_ranked = run(tmp_path / "ranked", world=world, store=store, allreduce=ar)
        assert ar._plan is not None  # it ran
    finally:
        ar.close()
    assert ranked["completed"] and ranked["epochs_done"] == single["epochs_done"] == 2
    assert ranked["test_acc"] == single["test_acc"]
    for got, want in zip(ranked["history"], single["history"], strict=True):
        for key in ("train_loss", "train_acc", "test_loss", "test_acc"):
            assert got[key] == want[key], (got["epoch"], key)
    for name, want in w_single.items():
        assert w_ranked[name].tobytes() == want.tobytes(), name


def test_use_local_gpu_takes_the_local_rank_and_names_a_missing_gpu():
    count = cp.cuda.runtime.getDeviceCount()
    assert use_local_gpu(World()) == 0 and cp.cuda.Device().id == 0
    far = World(rank=count, world_size=count + 1, local_rank=count)
    with pytest.raises(RuntimeError, match=f"LOCAL_RANK {count} needs GPU {count}, but this host has {count}"):
        use_local_gpu(far)
