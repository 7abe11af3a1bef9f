"""The trainer's whole loop on the CPU: every native op replaced by its NumPy reference
(test_layers_numpy_ops.numpy_backend), cupy by NumPy, and the augmentation kernel by its NumPy reference.

What this checks without a GPU: the Trainer's wiring to the model, optimizer, schedule, scaler and TrainStep; the
epoch loop and its device-side accumulators; evaluation; checkpoints of the real optimizer/schedule/scaler state;
--resume giving bit-identical results (float64 on the CPU is deterministic); AutoAugment feeding the loop; the
release of such a run. Images are 8x8 to keep ResNet-18 in NumPy fast; the GPU tests run the real thing.
"""

import sys
import types

import numpy as np
import pytest
import test_layers_numpy_ops as ref

import resnet_native as rn
from resnet_native import checkpoint, release, train
from resnet_native.data import augment as aug
from resnet_native.data.cifar10 import CIFAR10Data
from resnet_native.layers._backend import ops


def _numpy_as_cupy():
    """The slice of cupy the trainer and augmenter use, on NumPy."""
    fake = types.ModuleType("cupy")
    for name in ("zeros", "empty", "asarray", "ascontiguousarray", "log", "exp", "arange", "int32", "int64",
                 "float16", "float32", "float64", "uint8", "uint16"):
        setattr(fake, name, getattr(np, name))
    stream = types.SimpleNamespace(synchronize=lambda: None, ptr=0)
    fake.cuda = types.SimpleNamespace(get_current_stream=lambda: stream)
    fake.asnumpy = np.asarray
    return fake


def _launch_on_numpy(images, params, batch_start, batch, lut, out, *, layout="NHWC", crop_padding=4, cutout=0):
    out[...] = aug.apply_reference(np.asarray(images), params[:, batch_start:batch_start + batch], lut,
                                   layout=layout, crop_padding=crop_padding, cutout=cutout)


@pytest.fixture
def cpu_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _numpy_as_cupy())
    monkeypatch.setattr(aug, "launch_augment", _launch_on_numpy)
    monkeypatch.setattr(rn, "require_gpu", lambda: None)
    backend = ref.numpy_backend()
    # float32 masters, as on the GPU (state_dict() stores float32: float64 masters would not round-trip exactly);
    # fp16 stays fp16, so the GradScaler path runs.
    backend.update(master_dtype=np.float32, storage={"fp32": np.float32, "tf32": np.float32, "fp16": np.float16})
    with ops.use(**backend):
        yield


@pytest.fixture
def tiny(rng):
    """8x8 'CIFAR': a bright or dark image per class parity, learnable in a few steps."""
    def split(n):
        labels = (np.arange(n) % 10).astype(np.int32)
        images = rng.integers(0, 120, (n, 8, 8, 3)).astype(np.uint8)
        images[labels % 2 == 1] += 120
        return images, labels

    (tr, trl), (te, tel) = split(32), split(16)
    return CIFAR10Data(tr, trl, te, tel, source="tiny")


def config(*extra):
    return train.resolve_config(train.build_parser().parse_args(
        ["--recipe", "A", "--epochs", "3", "--batch-size", "16", "--eval-batch-size", "8", "--seed", "2",
         *extra]))


def run(cfg, out, data, **kw):
    return train.Trainer(cfg, out, data=data, progress=False, tensorboard=False, **kw)


def test_epochs_checkpoints_and_summary(cpu_backend, tiny, tmp_path):
    summary = run(config(), tmp_path, tiny).run()
    assert summary["completed"] and summary["epochs_done"] == 3 and summary["train_images"] == 32
    assert 0.0 <= summary["test_acc"] <= 1.0 and summary["parameters"] == 11173962
    rows = checkpoint.load_checkpoint(tmp_path / "last.npz")["metrics"]["history"]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["test_loss"]) for r in rows)
    assert rows[0]["lr"] == pytest.approx(0.1) and rows[1]["lr"] < rows[0]["lr"]  # cosine, per step
    state = checkpoint.load_checkpoint(tmp_path / "last.npz")
    assert state["epoch"] == 2 and state["schedule"]["last_step"] == 6
    assert state["optimizer"]["type"] == "SGD" and state["optimizer"]["step"] == 6
    assert state["scaler"]["scale"] > 0  # fp16: the GradScaler's state travels
    assert (tmp_path / "curves.png").is_file() and (tmp_path / "summary.json").is_file()
    best = checkpoint.load_checkpoint(tmp_path / "best.npz")
    assert best["metrics"]["best"]["test_acc"] == max(r["test_acc"] for r in rows)


def test_resume_is_bit_identical(cpu_backend, tiny, tmp_path):
    cfg = config("--warmup-epochs", "0.5", "--epochs", "2")
    full = run(cfg, tmp_path / "full", tiny).run()
    part = run(cfg, tmp_path / "part", tiny).run(stop_after=1)
    assert not part["completed"] and part["epochs_done"] == 1
    again = run(cfg, tmp_path / "part", tiny).run(resume=True)
    assert again["completed"] and again["epochs_done"] == 2
    a = checkpoint.load_checkpoint(tmp_path / "full" / "last.npz")
    b = checkpoint.load_checkpoint(tmp_path / "part" / "last.npz")
    for k in a["model"]:
        np.testing.assert_array_equal(b["model"][k], a["model"][k], err_msg=k)
    for k, v in a["optimizer"].items():
        np.testing.assert_array_equal(np.asarray(b["optimizer"][k]), np.asarray(v), err_msg=k)
    assert b["schedule"] == a["schedule"] and b["scaler"] == a["scaler"]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("epoch_time_s", "images_per_s")}  # noqa: E731
                          for r in rows]
    assert strip(b["metrics"]["history"]) == strip(a["metrics"]["history"])
    assert again["test_acc"] == full["test_acc"]
    # Resuming a finished run does nothing more.
    done = run(cfg, tmp_path / "part", tiny).run(resume=True)
    assert done["epochs_done"] == 2


def test_recipe_b_with_autoaugment_workers(cpu_backend, tiny, tmp_path):
    cfg = train.resolve_config(train.build_parser().parse_args(
        ["--recipe", "B", "--epochs", "2", "--batch-size", "16", "--eval-batch-size", "8", "--label-smoothing",
         "0.1"]))
    summary = run(cfg, tmp_path, tiny, aa_workers=2).run()
    assert summary["completed"] and np.isfinite(summary["test_acc"])
    state = checkpoint.load_checkpoint(tmp_path / "last.npz")
    assert state["optimizer"]["type"] == "AdamW" and state["schedule"]["type"] == "OneCycleSchedule"


def test_fp32_nchw_runs(cpu_backend, tiny, tmp_path):
    summary = run(config("--dtype", "fp32", "--layout", "NCHW", "--epochs", "1"), tmp_path, tiny).run()
    assert summary["completed"] and summary["layout"] == "NCHW"


def test_release_of_a_dry_run(cpu_backend, tiny, tmp_path):
    run(config("--epochs", "1"), tmp_path / "run", tiny).run()
    path = release.release(tmp_path / "run", "D", tmp_path / "models", benchmark=False)
    from resnet_native.classifier import load_weights

    weights = load_weights(path)
    state = checkpoint.load_checkpoint(tmp_path / "run" / "best.npz")
    for k, v in state["model"].items():
        np.testing.assert_array_equal(weights[k], v)
