"""The trainer's whole loop on the CPU: the model placed on the host (model.cuda() does to_host(np.float32), so every
op runs its NumPy reference), cupy replaced by NumPy, and the augmentation kernel by its NumPy reference.

What this checks without a GPU: the Trainer's wiring to the model, optimizer, schedule, scaler and TrainStep; the
epoch loop and its device-side accumulators; evaluation; checkpoints of the real optimizer/schedule/scaler state;
--resume giving bit-identical results (float64 on the CPU is deterministic); AutoAugment feeding the loop; the
release of such a run. Images are 8x8 to keep ResNet-18 in NumPy fast; the GPU tests run the real thing.
"""

import pathlib
import sys
import threading
import types

import numpy as np
import pytest
import yaml
from cpu_stand_ins import launch_on_numpy, numpy_as_cupy, tiny_cifar

import resnet_native as rn
import resnet_native._core.runtime
from resnet_native.data import augment as aug
from resnet_native.data.cifar10 import CIFAR10Data
from resnet_native.data.resize import downscale_reference
from resnet_native.formats import checkpoint
from resnet_native.nn.layers import Module
from resnet_native.release import build as release
from resnet_native.training import builders, checkpoint_writer, cli, evaluation, loop
from resnet_native.training.metrics_log import read_metrics_csv


@pytest.fixture
def cpu_backend(monkeypatch):
    """Yields the record of the conv algorithm cache calls: {"save": [paths], "load": [paths]} (the real functions
    need a GPU; the stand-in save writes a small JSON file so that the file's presence can be checked)."""
    monkeypatch.setitem(sys.modules, "cupy", numpy_as_cupy())
    monkeypatch.setattr(aug, "launch_augment", launch_on_numpy)
    monkeypatch.setattr(aug, "downscale_on_gpu", lambda images, size: downscale_reference(images, size))
    monkeypatch.setattr(resnet_native._core.runtime, "require_gpu", lambda: None)
    algo_calls = {"save": [], "load": []}

    def save(path):
        algo_calls["save"].append(path)
        pathlib.Path(path).write_text('{"entries": []}')
        return 0

    monkeypatch.setattr(rn.conv, "save_algorithm_cache", save)
    monkeypatch.setattr(rn.conv, "load_algorithm_cache", lambda path: algo_calls["load"].append(path) or 0)
    # float32 masters, as on the GPU (state_dict() stores float32: float64 masters would not round-trip exactly);
    # fp16 stays fp16, so the GradScaler path runs.
    monkeypatch.setattr(Module, "cuda", lambda self: self.to_host(np.float32))
    yield algo_calls


@pytest.fixture
def tiny(rng):
    return tiny_cifar(rng)


def config(*extra):
    # No Cutout: recipe A's 16-pixel square would blank the 8x8 images; no warm-up in runs this short; recipe A's
    # rate scaled to batch 16; evaluated every epoch.
    return cli.resolve_config(cli.build_parser().parse_args(
        ["--recipe", "A", "--epochs", "3", "--batch-size", "16", "--eval-batch-size", "8", "--seed", "2",
         "--cutout", "0", "--warmup-epochs", "0", "--label-smoothing", "0", "--lr", "0.01", "--eval-every", "1",
         *extra]))


def run(cfg, out, data, **kw):
    return loop.Trainer(cfg, out, data=data, progress=False, tensorboard=False, **kw)


def test_epochs_checkpoints_and_summary(cpu_backend, tiny, tmp_path):
    summary = run(config(), tmp_path, tiny).run()
    assert summary["completed"] and summary["epochs_done"] == 3 and summary["train_images"] == 32
    assert 0.0 <= summary["test_acc"] <= 1.0 and summary["parameters"] == 11173962
    rows = checkpoint.load_checkpoint(tmp_path / "last.npz")["metrics"]["history"]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["test_loss"]) for r in rows)
    assert rows[0]["lr"] == pytest.approx(0.01) and rows[1]["lr"] < rows[0]["lr"]  # cosine, per step
    state = checkpoint.load_checkpoint(tmp_path / "last.npz")
    assert state["epoch"] == 2 and state["schedule"]["last_step"] == 6
    assert state["optimizer"]["type"] == "SGD" and state["optimizer"]["step"] == 6
    assert state["scaler"]["scale"] > 0  # fp16: the GradScaler's state travels
    assert (tmp_path / "curves.png").is_file() and (tmp_path / "summary.json").is_file()
    best = checkpoint.load_checkpoint(tmp_path / "best.npz")
    assert best["metrics"]["best"]["test_acc"] == max(r["test_acc"] for r in rows)
    # The configuration is stored as plain values, the precision under its name.
    assert state["config"] == config().to_dict() and state["config"]["precision"] == "fp16"
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == config().to_dict()
    assert summary["precision"] == "fp16" and "dtype" not in summary


def test_progress_bars_never_wait_for_the_device(cpu_backend, tiny, tmp_path, capsys, monkeypatch):
    # Reading the running totals would wait for every step queued so far, and the GPU would idle while the host
    # queued the next epoch: the bars count queued steps and show the last epoch read back.
    from resnet_native.optim.step import TrainStep

    def refuse(*args, **kwargs):
        raise AssertionError("a progress bar read the running totals")

    monkeypatch.setattr(TrainStep, "read_totals", refuse)
    summary = loop.Trainer(config(), tmp_path, data=tiny, progress=True, tensorboard=False, log_every=1).run()
    assert summary["completed"] and summary["epochs_done"] == 3
    err = capsys.readouterr().err
    assert "epoch 3/3" in err and "last_loss=" in err  # epoch 2 and 3's bars show the epoch before


def test_eval_every_evaluates_those_epochs_and_the_last(cpu_backend, tiny, tmp_path, capsys):
    summary = run(config("--eval-every", "2", "--epochs", "5"), tmp_path, tiny).run()
    rows = checkpoint.load_checkpoint(tmp_path / "last.npz")["metrics"]["history"]
    evaluated = [r["epoch"] for r in rows if r["test_acc"] is not None]
    assert evaluated == [2, 4, 5] and all(r["test_loss"] is None for r in rows if r["epoch"] in (1, 3))
    assert summary["test_acc"] == rows[-1]["test_acc"] and summary["best_epoch"] in evaluated
    assert "epoch 1/5: train loss" in capsys.readouterr().err
    csv_rows = read_metrics_csv(tmp_path / "metrics.csv")
    assert [r["test_acc"] is None for r in csv_rows] == [True, False, True, False, False]


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


def test_progressive_resizing_downscales_the_early_epochs_and_resumes_across_the_switch(cpu_backend, tiny, tmp_path):
    """16x16 images (the tiny set, each pixel doubled), the first epoch downscaled to 8x8 and the second to 12x12: the
    log says which size each epoch trained at, and a run stopped after a small epoch resumes bit for bit."""
    big = CIFAR10Data(*(np.repeat(np.repeat(a, 2, axis=1), 2, axis=2) if a.ndim == 4 else a
                        for a in (tiny.train_images, tiny.train_labels, tiny.test_images, tiny.test_labels)),
                      source="tiny 16x16")
    cfg = config("--epochs", "3", "--progressive-size", "8", "--progressive-until", "0.34",
                 "--progressive-mid-size", "12", "--progressive-mid-until", "0.67")
    full = run(cfg, tmp_path / "full", big).run()
    assert full["progressive"] == {"size": 8, "until": 0.34, "mid_size": 12, "mid_until": 0.67}
    assert [r["image_size"] for r in read_metrics_csv(tmp_path / "full" / "metrics.csv")] == [8, 12, 16]
    run(cfg, tmp_path / "part", big).run(stop_after=1)
    again = run(cfg, tmp_path / "part", big).run(resume=True)
    a = checkpoint.load_checkpoint(tmp_path / "full" / "last.npz")
    b = checkpoint.load_checkpoint(tmp_path / "part" / "last.npz")
    for k in a["model"]:
        np.testing.assert_array_equal(b["model"][k], a["model"][k], err_msg=k)
    assert again["test_acc"] == full["test_acc"]


def test_recipe_b_with_autoaugment_workers(cpu_backend, tiny, tmp_path):
    cfg = cli.resolve_config(cli.build_parser().parse_args(
        ["--recipe", "B", "--epochs", "2", "--batch-size", "16", "--eval-batch-size", "8", "--label-smoothing",
         "0.1"]))
    summary = run(cfg, tmp_path, tiny, aa_workers=2).run()
    assert summary["completed"] and np.isfinite(summary["test_acc"])
    state = checkpoint.load_checkpoint(tmp_path / "last.npz")
    assert state["optimizer"]["type"] == "AdamW" and state["schedule"]["type"] == "OneCycleSchedule"


def test_fp32_nchw_runs(cpu_backend, tiny, tmp_path):
    summary = run(config("--precision", "fp32", "--layout", "NCHW", "--epochs", "1"), tmp_path, tiny).run()
    assert summary["completed"] and summary["layout"] == "NCHW" and summary["precision"] == "fp32"


def test_release_of_a_dry_run(cpu_backend, tiny, tmp_path):
    run(config("--epochs", "1"), tmp_path / "run", tiny).run()
    path = release.release(tmp_path / "run", "D", tmp_path / "models", benchmark=False)
    from resnet_native.formats.release_folder import load_weights

    weights = load_weights(path)
    state = checkpoint.load_checkpoint(tmp_path / "run" / "best.npz")
    for k, v in state["model"].items():
        np.testing.assert_array_equal(weights[k], v)


@pytest.mark.parametrize("engine", ["legacy", "graph"])
def test_the_models_convolutions_take_the_configured_engine(cpu_backend, engine):
    from resnet_native.nn.layers.conv2d import Conv2d

    model = builders.build_model(config("--engine", engine, "--deterministic"))
    convolutions = [m for _, m in model.named_modules() if isinstance(m, Conv2d)]
    assert len(convolutions) == 20  # ResNet-18's (the classifier runs on its own kernels)
    assert all(m.engine == engine and m.deterministic for m in convolutions)
    assert {m.spec().engine for m in convolutions} == {engine}


def test_algorithm_cache_is_saved_with_checkpoints_and_loaded_on_resume(cpu_backend, tiny, tmp_path, monkeypatch):
    events = []
    build_model = builders.build_model

    def recording_build_model(cfg):
        model = build_model(cfg)
        forward = model.forward
        model.forward = lambda *a, **k: events.append("forward") or forward(*a, **k)
        return model

    monkeypatch.setattr(builders, "build_model", recording_build_model)
    load = rn.conv.load_algorithm_cache
    monkeypatch.setattr(rn.conv, "load_algorithm_cache", lambda path: events.append("load") or load(path))
    cfg = config("--epochs", "2")
    algos = tmp_path / "algos.json"
    run(cfg, tmp_path, tiny).run(stop_after=1)
    assert cpu_backend["save"] == [algos] and algos.is_file()  # next to last.npz, written with it
    assert cpu_backend["load"] == []  # a fresh run times its own algorithms
    events.clear()
    run(cfg, tmp_path, tiny).run(resume=True)
    assert cpu_backend["load"] == [algos]
    assert events[0] == "load" and "forward" in events  # loaded before the first forward
    assert cpu_backend["save"] == [algos, algos]


def test_another_runs_algorithms_are_loaded_before_a_fresh_run(cpu_backend, tiny, tmp_path, capsys):
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"entries": []}')
    run(config("--epochs", "1"), tmp_path / "run", tiny, algorithms=theirs).run()
    assert cpu_backend["load"] == [theirs]
    with pytest.raises(SystemExit):
        cli.main(["--algos", str(tmp_path / "missing.json"), "--data", str(tmp_path)])
    assert f"--algos: no file {tmp_path / 'missing.json'}" in capsys.readouterr().err


def test_algorithm_cache_problems_only_warn(tmp_path, monkeypatch):
    # The real conv functions (no GPU needed to reach these failures).
    with pytest.warns(RuntimeWarning, match="no convolution algorithm cache"):
        checkpoint_writer.load_algorithm_cache(tmp_path / "algos.json")
    (tmp_path / "algos.json").write_text("{ not json")
    with pytest.warns(RuntimeWarning, match="could not load"):
        checkpoint_writer.load_algorithm_cache(tmp_path / "algos.json")

    def full_disk(path):
        raise OSError("No space left on device")

    monkeypatch.setattr(rn.conv, "save_algorithm_cache", full_disk)
    with pytest.warns(RuntimeWarning, match="could not write.*No space left"):
        checkpoint_writer.AlgorithmCacheFile(tmp_path / "algos.json").save()


def test_training_error_is_not_hidden_by_a_checkpoint_write_error(cpu_backend, tiny, tmp_path, monkeypatch, capsys):
    def failing_save(path, state):
        raise OSError("No space left on device")

    evaluate = evaluation.Evaluation.queue
    calls = []

    def evaluate_then_fail(self):
        calls.append(1)
        if len(calls) == 2:  # epoch 2, after epoch 1's checkpoint write has failed in the background
            raise RuntimeError("training broke")
        return evaluate(self)

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", failing_save)
    monkeypatch.setattr(evaluation.Evaluation, "queue", evaluate_then_fail)
    threads = threading.active_count()
    with pytest.raises(RuntimeError, match="training broke"):
        run(config("--epochs", "2"), tmp_path, tiny).run()
    assert "No space left on device" in capsys.readouterr().err  # the write error is reported, not lost
    assert threading.active_count() == threads  # the writer thread was stopped


def test_checkpoint_write_error_alone_still_raises(cpu_backend, tiny, tmp_path, monkeypatch):
    def failing_save(path, state):
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", failing_save)
    with pytest.raises(RuntimeError, match="writing a checkpoint failed: No space left"):
        run(config("--epochs", "1"), tmp_path, tiny).run()


def test_a_batch_larger_than_the_training_set_is_rejected_before_training(cpu_backend, tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(builders, "build_model", lambda cfg: pytest.fail("the model was built"))
    with pytest.raises(ValueError, match="batch_size: 64 is larger than the 32 training images"):
        run(config("--batch-size", "64"), tmp_path, tiny).run()


def test_out_of_range_labels_are_rejected_before_training(cpu_backend, tiny, tmp_path):
    test_labels = tiny.test_labels.copy()
    test_labels[3] = 10
    bad = CIFAR10Data(tiny.train_images, tiny.train_labels, tiny.test_images, test_labels, source="bad")
    with pytest.raises(ValueError, match=r"test labels\[3\] = 10"):
        run(config("--epochs", "1"), tmp_path, bad).run()
    train_labels = tiny.train_labels.copy()
    train_labels[7] = -1
    bad = CIFAR10Data(tiny.train_images, train_labels, tiny.test_images, tiny.test_labels, source="bad")
    with pytest.raises(ValueError, match=r"train labels\[7\] = -1"):
        run(config("--epochs", "1"), tmp_path, bad).run()


def test_a_death_between_best_and_last_leaves_them_consistent(cpu_backend, tiny, tmp_path, monkeypatch):
    """A death between the two publications of a new best epoch leaves last.npz one epoch behind best.npz, never
    naming a best epoch that best.npz does not hold; --resume then publishes both again."""
    accuracy = {1: 0.2, 2: 0.5, 3: 0.4}  # by epoch: epoch 2 is the best
    epochs = iter([1, 2, 3])  # the epochs evaluated (the write error surfaces at epoch 3's submit)
    monkeypatch.setattr(evaluation.Evaluation, "queue", lambda self: _ready((1.0, accuracy[next(epochs)])))
    publish = checkpoint_writer._publish_copy
    calls = []

    def die_at_epoch_2(src, dst, state):
        calls.append((src.name, dst.name, state["epoch"]))
        if state["epoch"] == 1:  # epoch 2's publication (0-based epochs): the process dies before the rename
            raise OSError("killed")
        publish(src, dst, state)

    monkeypatch.setattr(checkpoint_writer, "_publish_copy", die_at_epoch_2)
    cfg = config("--precision", "fp32", "--layout", "NCHW", "--epochs", "3")
    with pytest.raises(RuntimeError, match="writing a checkpoint failed: killed"):
        run(cfg, tmp_path, tiny).run()
    assert calls[-1] == ("best.npz", "last.npz", 1)  # best.npz is the file written, last.npz the one linked
    last = checkpoint.load_checkpoint(tmp_path / "last.npz")
    best = checkpoint.load_checkpoint(tmp_path / "best.npz")
    assert last["epoch"] == 0 and last["metrics"]["best"]["epoch"] == 1
    assert best["epoch"] == 1 and best["metrics"]["best"] == {"test_acc": 0.5, "epoch": 2}
    # --resume recomputes epoch 2 from last.npz and publishes both; best.npz always holds the best epoch.
    monkeypatch.setattr(checkpoint_writer, "_publish_copy", publish)
    epochs = iter([2, 3])
    run(cfg, tmp_path, tiny).run(resume=True)
    last = checkpoint.load_checkpoint(tmp_path / "last.npz")
    best = checkpoint.load_checkpoint(tmp_path / "best.npz")
    assert last["epoch"] == 2 and last["metrics"]["best"] == {"test_acc": 0.5, "epoch": 2}
    assert best["epoch"] == 1 and [n for n in tmp_path.iterdir() if n.name.endswith((".tmp", ".link"))] == []


def test_trainer_refuses_bool_step_counts(tiny, tmp_path):
    with pytest.raises(TypeError, match="checkpoint_every: expected an int, got True"):
        run(config(), tmp_path, tiny, checkpoint_every=True)
    with pytest.raises(TypeError, match="log_every: expected an int, got '5'"):
        run(config(), tmp_path, tiny, log_every="5")


def test_a_write_that_would_wait_is_skipped_but_never_the_last(cpu_backend, tiny, tmp_path, monkeypatch):
    """The writer held on epoch 1's write: epoch 2's checkpoint is skipped (not queued behind it), epoch 3's is
    written once the writer is idle again, and the run's last epoch is the one in last.npz."""
    save, busy = checkpoint_writer.save_checkpoint, checkpoint_writer.CheckpointWriter.busy
    gate = threading.Event()
    answers = []

    def held_save(path, state):
        gate.wait(60)
        save(path, state)

    def busy_then_release(self):
        answers.append(busy(self))
        if answers[-1]:  # release the held write and let it finish, so the next epoch finds the writer idle
            gate.set()
            self.flush()
        return answers[-1]

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", held_save)
    monkeypatch.setattr(checkpoint_writer.CheckpointWriter, "busy", busy_then_release)
    summary = run(config("--epochs", "4", "--eval-every", "100"), tmp_path, tiny).run()
    assert answers == [False, True, False]  # asked after epochs 1 to 3; never for the last
    assert summary["checkpoints_skipped"] == 1
    assert int(checkpoint.load_checkpoint(tmp_path / "last.npz")["epoch"]) == 3


def _ready(values):
    """A stand-in for a queued evaluation's DeviceValues."""
    return types.SimpleNamespace(result=lambda: values)
