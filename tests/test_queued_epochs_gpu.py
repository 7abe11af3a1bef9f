"""The trainer queues epoch k+1 before it reads epoch k (training/queued_epoch.py), on random images (no data
set needed): the GPU does not wait for a slow host between epochs, and a checkpoint after epoch k holds epoch k's
state, none of epoch k+1's updates."""

import time

import numpy as np
import pytest

from resnet_native.data.cifar10 import CIFAR10Data
from resnet_native.training import checkpoint_writer, cli, loop
from resnet_native.training.metrics_log import MetricsLog, read_metrics_csv
from resnet_native.training.queued_epoch import SNAPSHOTS_IN_FLIGHT, QueuedEpoch
from resnet_native.training.snapshot import HostSnapshot

pytestmark = pytest.mark.gpu

LOG_SECONDS = 0.05  # what the slowed log costs the host per epoch


def random_cifar(n_train: int, n_test: int = 1000) -> CIFAR10Data:
    rng = np.random.default_rng(0)

    def split(n):
        return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int32)

    return CIFAR10Data(*split(n_train), *split(n_test), source="random")


def cfg_from(*argv):
    return cli.resolve_config(cli.build_parser().parse_args(list(argv)))


def test_the_gpu_does_not_wait_for_a_slow_host_between_epochs(tmp_path, monkeypatch):
    log_epoch, seconds_before = MetricsLog.log_epoch, QueuedEpoch.seconds_before
    gaps = []

    def slow_log(self, row):
        time.sleep(LOG_SECONDS)
        log_epoch(self, row)

    def recorded(self):
        gaps.append(seconds_before(self))
        return gaps[-1]

    allocations = []
    allocate = HostSnapshot._allocate
    counted = staticmethod(lambda *a, **k: allocations.append(1) or allocate(*a, **k))
    monkeypatch.setattr(HostSnapshot, "_allocate", counted)
    monkeypatch.setattr(MetricsLog, "log_epoch", slow_log)
    monkeypatch.setattr(QueuedEpoch, "seconds_before", recorded)
    # 80 steps of ResNet-18 at batch 512 per epoch (about 0.5 s): far more GPU time than the host's work between
    # epochs, the slowed log and the checkpoint writer's share of the interpreter included.
    epochs = 6
    cfg = cfg_from("--recipe", "A", "--epochs", str(epochs), "--batch-size", "512", "--eval-every", "100")
    summary = loop.Trainer(cfg, tmp_path, data=random_cifar(40960), progress=False, tensorboard=False).run()
    assert summary["completed"] and summary["seconds"]["log"] >= epochs * LOG_SECONDS
    # Read one epoch behind, the log overlaps the next epoch's steps; read in step, the GPU would idle through it.
    # The first epoch's queue ends with its searches and capture: from the third epoch on, the host is ahead.
    times = [round(r["epoch_time_s"], 4) for r in read_metrics_csv(tmp_path / "metrics.csv")]
    assert len(gaps) == epochs and sum(gaps) == pytest.approx(summary["gpu_between_epochs_s"], abs=2e-3)
    # The median: a one-off host pause longer than an epoch (the matplotlib import on its thread holds the GIL
    # for about as long as one of these short epochs) may show once; a loop that read in step would show every time.
    steady = sorted(gaps[2:])
    assert steady[len(steady) // 2] < 0.5 * LOG_SECONDS, f"GPU seconds between epochs {gaps}, epoch seconds {times}"
    assert len(allocations) == SNAPSHOTS_IN_FLIGHT  # every checkpoint's buffers reserved before the loop


def test_a_checkpoint_holds_its_epoch_and_none_of_the_next(tmp_path, monkeypatch):
    """Three epochs, every checkpoint kept as written; then a run of the same seed stopped after the first: its
    last checkpoint, written with nothing queued behind, must equal the first run's first, bit for bit (with
    deterministic algorithms). Recipe B: AdamW's step and the loss scale live on the device."""
    written = {}
    save = checkpoint_writer.save_checkpoint

    def keep(path, state):
        written.setdefault(state["epoch"], state)
        save(path, state)

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", keep)
    cfg = cfg_from("--recipe", "B", "--epochs", "3", "--eval-every", "1", "--deterministic")
    data = random_cifar(10240)
    loop.Trainer(cfg, tmp_path / "three", data=data, progress=False, tensorboard=False, aa_workers=4).run()
    assert sorted(written) == [0, 1, 2]
    written_three, written = written, {}
    loop.Trainer(cfg, tmp_path / "one", data=data, progress=False, tensorboard=False, aa_workers=4).run(stop_after=1)
    ahead, alone = written_three[0], written[0]
    for group in ("model", "optimizer"):
        assert ahead[group].keys() == alone[group].keys()
        for k, v in alone[group].items():
            np.testing.assert_array_equal(ahead[group][k], v, err_msg=f"{group} {k}")
    assert ahead["scaler"] == alone["scaler"] and ahead["schedule"] == alone["schedule"]
    # AdamW's step counts the updates applied: at most the steps taken, fewer by those the loss scale skipped.
    steps = ahead["schedule"]["last_step"]
    assert 0 < ahead["optimizer"]["step"] <= steps and ahead["scaler"]["scale"] > 0
    assert ahead["metrics"]["history"][0]["train_loss"] == alone["metrics"]["history"][0]["train_loss"]
