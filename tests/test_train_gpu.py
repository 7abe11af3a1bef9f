"""Training on the GPU with the real CIFAR-10 copy: a short run learns, --resume is exact, the CLI works end to end.

Kept short (a 10k-image subset, 2 epochs of ResNet-18 fp16, batch 64: 312 steps): the point is correctness, not
accuracy. To measure the spread of the short run's accuracy over seeds (what SHORT_RUN_MIN_TEST_ACC is set from):
    RESNET_NATIVE_SHORT_RUN_SEEDS=0,1,2,3,4 python -m pytest -s tests/test_train_gpu.py -k spread
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from resnet_native.data.cifar10 import load_cifar10
from resnet_native.formats import checkpoint
from resnet_native.training import cli, loop

pytestmark = [pytest.mark.gpu, pytest.mark.data]

# The short run: 312 steps of ResNet-18 on a 10k-image subset at batch 64, lr 0.025 (at 0.1 one seed in five ended
# near chance), no warm-up, no label smoothing, every epoch evaluated: recipe A's optimizer and augmentation with
# the settings its accuracy bar below was measured with.
SHORT_RUN_ARGS = ["--recipe", "A", "--epochs", "2", "--subset", "10000", "--batch-size", "64", "--lr", "0.025",
                  "--warmup-epochs", "0", "--label-smoothing", "0", "--eval-every", "1"]
SUBSET_ARGS = [*SHORT_RUN_ARGS, "--deterministic", "--seed", "1"]

# The test accuracy a short run must beat (chance is 0.10), set from the run's measured spread over seeds, never
# from one run: test_short_run_accuracy_spread over seeds 0-4 on an H200 gave 0.458 to 0.483 (mean 0.471, standard
# deviation 0.010; docs/lab-notes/RESULTS.md). The bar sits below the lowest by more than five standard deviations.
# Re-measure (see the module docstring) whenever SHORT_RUN_ARGS or the recipe changes.
SHORT_RUN_MIN_TEST_ACC = 0.40


def cfg_from(argv):
    return cli.resolve_config(cli.build_parser().parse_args(argv))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cifar_cache")


@pytest.fixture(scope="module")
def cifar(cache_dir):
    from conftest import cifar_path

    return load_cifar10(cifar_path(), cache_dir=cache_dir)


@pytest.fixture(scope="module")
def config():
    return cfg_from(SUBSET_ARGS)


@pytest.fixture(scope="module")
def uninterrupted(cifar, config, tmp_path_factory):
    out = tmp_path_factory.mktemp("run_a")
    summary = loop.Trainer(config, out, data=cifar, progress=False, tensorboard=False).run()
    return out, summary


def test_two_epochs_learn_far_above_chance(uninterrupted):
    out, summary = uninterrupted
    print(json.dumps(summary))
    assert summary["completed"] and summary["epochs_done"] == 2
    # 312 steps on 10k images is 0.4 of a full epoch.
    assert summary["test_acc"] > SHORT_RUN_MIN_TEST_ACC, summary
    assert summary["train_images"] == 10000 and summary["train_images_per_s"] > 1000
    seconds = summary["seconds"]  # where the wall time went: every activity measured, the rest 'other'
    assert set(seconds) == {"set-up", "data", "build", "train", "evaluate", "log", "checkpoint",
                            "checkpoint wait", "finish", "plot", "other"}, seconds
    waits = ("checkpoint wait", "finish")  # zero to the millisecond when the writer has kept up
    assert all(v > 0 for k, v in seconds.items() if k not in ("other", *waits)), seconds
    assert all(seconds[k] >= 0 for k in waits), seconds
    assert sum(seconds.values()) == pytest.approx(summary["wall_time_s"], abs=0.01)
    for name in ("config.yaml", "metrics.csv", "last.npz", "best.npz", "algos.json", "curves.png", "summary.json"):
        assert (out / name).is_file(), name
    from resnet_native.training.metrics_log import read_metrics_csv

    rows = read_metrics_csv(out / "metrics.csv")
    assert [r["epoch"] for r in rows] == [1, 2]
    assert rows[1]["train_loss"] < rows[0]["train_loss"]
    assert all(np.isfinite(r["test_loss"]) for r in rows)
    assert rows[0]["lr"] == pytest.approx(cfg_from(SUBSET_ARGS).optimizer.lr)  # cosine starts at the run's lr
    state = checkpoint.load_checkpoint(out / "last.npz")
    assert state["epoch"] == 1 and state["rng"] == {"seed": 1, "next_epoch": 2}
    assert state["schedule"]["last_step"] == 2 * (10000 // 64)
    assert state["optimizer"]["type"] == "SGD" and state["scaler"]["scale"] > 0
    best = checkpoint.load_checkpoint(out / "best.npz")
    assert best["metrics"]["best"]["test_acc"] == max(r["test_acc"] for r in rows)


def test_progressive_resizing_trains_the_first_epoch_smaller(cifar, tmp_path):
    """Epoch 1 at 16 x 16 pixels, epoch 2 at full size (its own captured step): the run learns and the log says
    which size each epoch took. (Each epoch's first steps search algorithms for its shapes, so their times here say
    nothing of the sizes' speeds; bench runs of the recipe do.)"""
    from resnet_native.training.metrics_log import read_metrics_csv

    cfg = cfg_from([*SHORT_RUN_ARGS, "--seed", "1", "--progressive-size", "16", "--progressive-until", "0.5"])
    summary = loop.Trainer(cfg, tmp_path, data=cifar, progress=False, tensorboard=False).run()
    assert summary["completed"] and summary["test_acc"] > SHORT_RUN_MIN_TEST_ACC, summary
    rows = read_metrics_csv(tmp_path / "metrics.csv")
    assert [r["image_size"] for r in rows] == [16, 32]


def test_resume_after_epoch_one_equals_uninterrupted(uninterrupted, cifar, config, tmp_path):
    out_a, summary_a = uninterrupted
    first = loop.Trainer(config, tmp_path, data=cifar, progress=False, tensorboard=False).run(stop_after=1)
    assert not first["completed"] and first["epochs_done"] == 1
    assert checkpoint.load_checkpoint(tmp_path / "last.npz")["epoch"] == 0
    resumed = loop.Trainer(config, tmp_path, data=cifar, progress=False, tensorboard=False).run(resume=True)
    assert resumed["completed"] and resumed["epochs_done"] == 2

    a = checkpoint.load_checkpoint(out_a / "last.npz")
    b = checkpoint.load_checkpoint(tmp_path / "last.npz")
    assert a["model"].keys() == b["model"].keys()
    worst = max(float(np.max(np.abs(a["model"][k].astype(np.float64) - b["model"][k]))) for k in a["model"])
    assert worst <= 1e-6, f"resumed weights differ from the uninterrupted run's by up to {worst}"
    for k, v in a["optimizer"].items():
        if isinstance(v, np.ndarray):
            np.testing.assert_allclose(b["optimizer"][k], v, rtol=0, atol=1e-6, err_msg=k)
        else:
            assert b["optimizer"][k] == v, k
    assert b["scaler"] == a["scaler"] and b["schedule"] == a["schedule"]
    ha, hb = a["metrics"]["history"], b["metrics"]["history"]
    for ra, rb in zip(ha, hb, strict=True):
        assert rb["epoch"] == ra["epoch"] and rb["test_acc"] == ra["test_acc"] and rb["lr"] == ra["lr"]
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-6)
        assert rb["test_loss"] == pytest.approx(ra["test_loss"], rel=1e-6)


def test_lookahead_without_norm_decay_learns_and_resumes_exactly(cifar, tmp_path):
    """Lookahead's slow weights (and batch norm without weight decay) in the captured step: the run learns, the
    checkpoint holds the slow weights, and a run resumed after epoch one ends where the uninterrupted one does."""
    cfg = cfg_from([*SUBSET_ARGS, "--lookahead-decay", "0.7", "--lookahead-every", "3", "--norm-weight-decay", "0"])
    whole = loop.Trainer(cfg, tmp_path / "whole", data=cifar, progress=False, tensorboard=False).run()
    assert whole["completed"] and whole["test_acc"] > SHORT_RUN_MIN_TEST_ACC, whole
    parts = tmp_path / "parts"
    loop.Trainer(cfg, parts, data=cifar, progress=False, tensorboard=False).run(stop_after=1)
    assert loop.Trainer(cfg, parts, data=cifar, progress=False, tensorboard=False).run(resume=True)["completed"]
    a, b = (checkpoint.load_checkpoint(d / "last.npz") for d in (tmp_path / "whole", parts))
    for group in ("model", "lookahead"):
        assert a[group].keys() == b[group].keys() and a[group].keys() == a["model"].keys()
        for k in a[group]:
            np.testing.assert_allclose(b[group][k], a[group][k], rtol=0, atol=1e-6, err_msg=f"{group}.{k}")
    # The run ends on the slow weights: the last step's update resets the trained weights to them.
    for k in a["model"]:
        if not k.endswith("num_batches_tracked"):  # a count of the trained model's own batches
            np.testing.assert_array_equal(a["model"][k], a["lookahead"][k], err_msg=k)


@pytest.mark.parametrize("frozen", [True, False])
def test_a_whitened_stem_learns_and_a_frozen_one_keeps_its_filters(cifar, tmp_path, frozen):
    """--stem-init whiten writes the training images' whitening into the stem's first 54 filters before the first
    step; with --stem-frozen the captured step leaves the stem as it started (no filter gradient, no update), and
    the run still learns."""
    from resnet_native.data.augment import normalize_on_host
    from resnet_native.nn.whitening import MAX_IMAGES, patch_whitening_filters
    from resnet_native.training.builders import subset_indices

    cfg = cfg_from([*SUBSET_ARGS, "--stem-init", "whiten", *(["--stem-frozen"] if frozen else [])])
    trainer = loop.Trainer(cfg, tmp_path, data=cifar, progress=False, tensorboard=False)
    summary = trainer.run()
    assert summary["completed"] and summary["test_acc"] > SHORT_RUN_MIN_TEST_ACC, summary
    images = cifar.train_images[subset_indices(len(cifar.train_labels), cfg.subset, cfg.seed)[:MAX_IMAGES]]
    whitening = patch_whitening_filters(normalize_on_host(images), 3, eps=cfg.stem.whiten_eps)
    stem = checkpoint.load_checkpoint(tmp_path / "last.npz")["model"]["conv1.weight"]
    if frozen:
        np.testing.assert_array_equal(stem[:54], whitening)
        assert np.all(trainer.model.conv1.weight.grad.get() == 0)
    else:
        assert 0 < np.abs(stem[:54] - whitening).max() < np.abs(whitening).max()


def test_cli_recipe_b_with_autoaugment_then_release(cifar, cache_dir, tmp_path):
    """The commands the README shows, in fresh processes: recipe B (AdamW, one-cycle, AutoAugment workers)."""
    from conftest import child_env, cifar_path

    env = child_env(PYTHONUNBUFFERED="1")
    run = tmp_path / "runs" / "b"
    cmd = [sys.executable, "-m", "resnet_native.train", "--recipe", "B", "--epochs", "2", "--subset", "2048",
           "--data", str(cifar_path()), "--cache-dir", str(cache_dir), "--out", str(run), "--no-progress",
           "--aa-workers", "4", "--warmup-epochs", "0.5", "--label-smoothing", "0.1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["completed"] and summary["epochs_done"] == 2 and summary["recipe"] == "B"
    assert 0.0 <= summary["test_acc"] <= 1.0 and summary["wall_time_s"] > 0 and summary["train_images_per_s"] > 0
    seconds = summary["seconds"]  # the command's whole wall time: its start-up and the plot included
    assert seconds["start-up"] > 0 and seconds["plot"] > 0, seconds
    assert sum(seconds.values()) == pytest.approx(summary["wall_time_s"], abs=0.01)
    assert json.loads((run / "summary.json").read_text())["seconds"] == seconds
    assert (run / "curves.png").is_file() and (run / "metrics.csv").is_file()
    cfg = checkpoint.load_checkpoint(run / "last.npz")["config"]
    assert cfg["augment"]["autoaugment"] and cfg["optimizer"]["name"] == "adamw"
    assert cfg["schedule"] == {"name": "onecycle", "warmup_epochs": 0.5} and cfg["label_smoothing"] == 0.1
    try:
        import tensorboard  # noqa: F401

        assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    except ImportError:
        pass

    proc = subprocess.run([sys.executable, "-m", "resnet_native.release", "--run", str(run), "--version", "B",
                           "--out", str(tmp_path / "cifar10_models"), "--no-benchmark"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["test_accuracy"] == summary["best_test_acc"]
    assert (tmp_path / "cifar10_models" / "version_B" / "preprocess.py").is_file()


@pytest.mark.skipif(not os.environ.get("RESNET_NATIVE_SHORT_RUN_SEEDS"),
                    reason="measures the short run's accuracy spread: set RESNET_NATIVE_SHORT_RUN_SEEDS=0,1,2,3,4")
def test_short_run_accuracy_spread(cifar, tmp_path):
    """The short run over several seeds: prints each test accuracy and their spread, and checks every one against
    the bar."""
    seeds = [int(s) for s in os.environ["RESNET_NATIVE_SHORT_RUN_SEEDS"].split(",")]
    accuracies = []
    for seed in seeds:
        summary = loop.Trainer(cfg_from([*SHORT_RUN_ARGS, "--seed", str(seed)]), tmp_path / f"seed_{seed}",
                               data=cifar, progress=False, tensorboard=False).run()
        accuracies.append(summary["test_acc"])
        print(f"short run, seed {seed}: test_acc {summary['test_acc']:.4f}")
    print(json.dumps({"seeds": seeds, "test_acc": accuracies, "min": min(accuracies),
                      "mean": float(np.mean(accuracies)), "std": float(np.std(accuracies, ddof=1))}))
    assert min(accuracies) > SHORT_RUN_MIN_TEST_ACC, accuracies
