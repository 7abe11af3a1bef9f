"""Data-parallel training on the CPU: two real ranks (child Pythons on loopback) train the tiny 8x8 set of
test_train_dryrun_cpu.py on the host backend, their gradients averaged by StoreAllReduce; the ranks' weights must
come out bit-identical, only rank 0 writes a run folder. Also the sharded augmenter and the trainer's refusals."""

import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from conftest import child_env
from test_train_dryrun_cpu import config, cpu_backend  # noqa: F401 (a fixture)

from resnet_native.data.augment import GpuAugmenter
from resnet_native.distributed import World
from resnet_native.distributed.launch import free_port
from resnet_native.training import loop

# One rank: the CPU stand-ins of test_train_dryrun_cpu.py's cpu_backend fixture, then a Trainer of that rank.
RANK_SCRIPT = r"""
import json, pathlib, sys
import numpy as np
sys.path.insert(0, sys.argv[6])  # the tests folder: cpu_stand_ins
from cpu_stand_ins import launch_on_numpy, numpy_as_cupy, tiny_cifar
sys.modules["cupy"] = numpy_as_cupy()
import resnet_native as rn
from resnet_native.data import augment as aug
from resnet_native.distributed import World, rendezvous
from resnet_native.nn.layers import Module
from resnet_native.training import cli, loop

aug.launch_augment = launch_on_numpy
rn._core.runtime.require_gpu = lambda: None
rn.conv.save_algorithm_cache = lambda path: pathlib.Path(path).write_text('{"entries": []}') and 0
rn.conv.load_algorithm_cache = lambda path: 0
Module.cuda = lambda self: self.to_host(np.float32)

rank, size, port, out, weights = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
data = tiny_cifar(np.random.default_rng(7))  # the same data on every rank
cfg = cli.resolve_config(cli.build_parser().parse_args(sys.argv[7:]))
world = World(rank, size, rank, "127.0.0.1", port)
with rendezvous(world, 30.0) as store:
    trainer = loop.Trainer(cfg, out, data=data, progress=False, tensorboard=False, world=world, store=store)
    summary = trainer.run()
np.savez(weights, **trainer.model.state_dict())
print(json.dumps({"summary": summary}))
"""

# No Cutout (recipe A's 16-pixel square would blank the 8x8 images), and recipe A's rate scaled to batch 16.
ARGS = ["--recipe", "A", "--epochs", "2", "--batch-size", "16", "--eval-batch-size", "8", "--eval-every", "1",
        "--seed", "2", "--cutout", "0", "--lr", "0.01", "--precision", "fp32", "--layout", "NCHW",
        "--warmup-epochs", "0"]


def _two_ranks(tmp_path, *extra):
    port, size = free_port(), 2
    children = [subprocess.Popen(
        [sys.executable, "-c", RANK_SCRIPT, str(r), str(size), str(port), str(tmp_path / f"run{r}"),
         str(tmp_path / f"weights{r}.npz"), str(pathlib.Path(__file__).parent), *ARGS, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(OPENBLAS_NUM_THREADS="1"),
        cwd=tempfile.gettempdir()) for r in range(size)]  # not the checkout: its source tree would shadow the package
    results = []
    try:
        for child in children:
            stdout, stderr = child.communicate(timeout=120)
            assert child.returncode == 0, stderr
            results.append(json.loads(stdout.strip().splitlines()[-1])["summary"])
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return results, [np.load(tmp_path / f"weights{r}.npz") for r in range(size)]


def _running_statistics(names):
    return [k for k in names if k.endswith(("running_mean", "running_var"))]


def test_two_ranks_train_to_bit_identical_weights_and_only_rank_0_writes(tmp_path):
    results, (w0, w1) = _two_ranks(tmp_path)
    stats = _running_statistics(w0.files)
    assert len(w0.files) == len(w1.files) > 10 and len(stats) > 10
    for k in set(w0.files) - set(stats):
        assert w0[k].tobytes() == w1[k].tobytes(), k  # the same averaged gradients, the same updates
    # Per-rank batch norm: each rank's running statistics are those of its own shard.
    assert any(w0[k].tobytes() != w1[k].tobytes() for k in stats)
    # Rank 0 wrote the whole run folder; rank 1 (given its own folder here) wrote nothing at all.
    names = {p.name for p in (tmp_path / "run0").iterdir()}
    assert {"config.yaml", "metrics.csv", "last.npz", "best.npz", "algos.json", "summary.json"} <= names
    assert not (tmp_path / "run1").exists()
    s0, s1 = results
    assert s0["completed"] and s0["world_size"] == 2 and s0["rank"] == 0 and s1["rank"] == 1
    assert s0["epochs_done"] == 2 and 0.0 <= s0["test_acc"] <= 1.0
    assert np.isnan(s1["test_acc"])  # rank 1 does not evaluate
    from resnet_native.formats import checkpoint

    state = checkpoint.load_checkpoint(tmp_path / "run0" / "last.npz")
    rows = state["metrics"]["history"]
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["test_loss"]) for r in rows)
    # 16 images per rank and epoch in batches of 8: 2 steps per epoch, 4 in all.
    assert state["optimizer"]["step"] == 4 and state["schedule"]["last_step"] == 4
    assert rows[-1]["train_loss"] <= rows[0]["train_loss"] * 1.5  # finite and not diverging


def test_synchronized_batch_norm_keeps_every_rank_on_the_same_statistics(tmp_path):
    results, (w0, w1) = _two_ranks(tmp_path, "--sync-bn")
    assert all(r["completed"] for r in results)
    for k in w0.files:  # the running statistics too: every rank normalised with those of both shards
        assert w0[k].tobytes() == w1[k].tobytes(), k


def test_sharded_augmenter_serves_disjoint_shares(cpu_backend):  # noqa: F811
    images = np.arange(10 * 4 * 4 * 3, dtype=np.uint8).reshape(10, 4, 4, 3)
    labels = np.arange(10, dtype=np.int32)
    shares = []
    for rank in range(2):
        aug = GpuAugmenter(images, labels, batch_size=2, world=World(rank, 2, rank), seed=3)
        assert len(aug) == 2 and aug.epoch_images == 5 and aug.num_images == 10
        shares.append(np.concatenate([y.copy() for _, y in aug.epoch(1)]))
    assert len(shares[0]) == len(shares[1]) == 4  # 5 each, in batches of 2 (drop_last)
    assert not set(shares[0]) & set(shares[1])
    single = GpuAugmenter(images, labels, batch_size=2, world=World(), seed=3)  # world_size 1: the whole set
    assert len(single) == 5 and single.world is None


def test_trainer_refusals(tmp_path):
    two = World(0, 2, 0)
    with pytest.raises(ValueError, match="store: rank 0 of 2 needs the job's Store"):
        loop.Trainer(config(), tmp_path, world=two)
    with pytest.raises(ValueError, match="batch_size: 15 does not divide among world_size 2 ranks"):
        loop.Trainer(config("--batch-size", "15"), tmp_path, world=two, store=object())
    with pytest.raises(TypeError, match="world: expected a resnet_native.distributed World"):
        loop.Trainer(config(), tmp_path, world=2)
