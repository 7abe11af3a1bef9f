"""Recipe C's pieces in the trainer's whole loop on the CPU (tests/test_train_dryrun_cpu.py's stand-ins): flip TTA
in the evaluation, the rows, metrics.csv and summary.json; the weights' average evaluated, checkpointed, resumed
bit for bit and released; the linear schedule."""

import numpy as np
import pytest
from test_train_dryrun_cpu import config, cpu_backend, run, tiny  # noqa: F401  (fixtures)

from resnet_native.formats import checkpoint
from resnet_native.formats.release_folder import load_release_config, load_weights
from resnet_native.release import build as release
from resnet_native.training import cli, evaluation
from resnet_native.training.metrics_log import read_metrics_csv

FAST = ("--tta", "flip", "--ema-decay", "0.5", "--ema-every", "2", "--schedule", "linear")


def test_tta_figures_beside_the_plain_ones(cpu_backend, tiny, tmp_path, capsys):  # noqa: F811
    summary = run(config("--tta", "flip", "--eval-every", "2"), tmp_path, tiny).run()
    rows = checkpoint.load_checkpoint(tmp_path / "last.npz")["metrics"]["history"]
    assert [r["test_acc_tta"] is None for r in rows] == [True, False, False]  # evaluated: epochs 2 and 3
    assert all(0.0 <= r["test_acc_tta"] <= 1.0 and np.isfinite(r["test_loss_tta"]) and r["tta_s"] >= 0
               for r in rows[1:])
    assert summary["tta"] == "flip" and summary["test_acc_tta"] == rows[-1]["test_acc_tta"]
    assert summary["test_acc"] == rows[-1]["test_acc"]  # the plain accuracy keeps its field
    assert summary["tta_s"] == pytest.approx(rows[1]["tta_s"] + rows[2]["tta_s"], abs=1e-3)
    csv_rows = read_metrics_csv(tmp_path / "metrics.csv")
    assert csv_rows[2]["test_acc_tta"] == pytest.approx(rows[2]["test_acc_tta"]) and csv_rows[0]["tta_s"] is None
    assert "tta acc" in capsys.readouterr().err
    plain = run(config(), tmp_path / "plain", tiny).run()
    assert plain["tta"] == "none" and "test_acc_tta" not in plain
    assert "test_acc_tta" not in read_metrics_csv(tmp_path / "plain" / "metrics.csv")[0]


def test_the_tta_accuracy_is_the_mean_logits_accuracy(cpu_backend, tiny, tmp_path, monkeypatch):  # noqa: F811
    """The figures the trainer logs are those of its Evaluation, given the mirrored test set."""
    seen = []
    queue = evaluation.Evaluation.queue

    def recording(self):
        seen.append((len(self.x_views) == 1, self.model))
        return queue(self)

    monkeypatch.setattr(evaluation.Evaluation, "queue", recording)
    trainer = run(config("--epochs", "1", *FAST), tmp_path, tiny)
    summary = trainer.run()
    assert seen and all(flag for flag, _ in seen) and summary["ema"] is True
    assert seen[0][1] is not trainer.model  # the average is evaluated, not the trained weights


def test_the_average_is_checkpointed_resumed_exactly_and_released(cpu_backend, tiny, tmp_path):  # noqa: F811
    cfg = config("--epochs", "3", *FAST)
    full = run(cfg, tmp_path / "full", tiny).run()
    run(cfg, tmp_path / "part", tiny).run(stop_after=1)
    again = run(cfg, tmp_path / "part", tiny).run(resume=True)
    a = checkpoint.load_checkpoint(tmp_path / "full" / "last.npz")
    b = checkpoint.load_checkpoint(tmp_path / "part" / "last.npz")
    assert a["ema"].keys() == a["model"].keys()
    assert any(not np.array_equal(a["ema"][k], a["model"][k]) for k in a["model"])
    for group in ("model", "ema"):
        for k in a[group]:
            np.testing.assert_array_equal(b[group][k], a[group][k], err_msg=f"{group} {k}")
    assert again["test_acc"] == full["test_acc"] and again["test_acc_tta"] == full["test_acc_tta"]
    path = release.release(tmp_path / "full", "C", tmp_path / "models", benchmark=False)
    weights = load_weights(path)
    best = checkpoint.load_checkpoint(tmp_path / "full" / "best.npz")
    for k, v in best["ema"].items():
        np.testing.assert_array_equal(weights[k], v, err_msg=k)
    assert load_release_config(path)["training"]["weights"] == "ema"
    damaged = checkpoint.load_checkpoint(tmp_path / "part" / "last.npz")
    del damaged["ema"]
    with pytest.raises(ValueError, match="the checkpoint holds none"):
        _load_into_parts(cfg, damaged)
    with pytest.raises(ValueError, match=r"differs from the checkpoint's in \['ema'\]"):
        run(config("--epochs", "3", "--tta", "flip", "--schedule", "linear"), tmp_path / "part", tiny).run(
            resume=True)


def _load_into_parts(cfg, state):
    """Parts of cfg (on the host stand-ins) loading `state`, as --resume does."""
    from cpu_stand_ins import tiny_cifar

    from resnet_native.distributed.world import World
    from resnet_native.training import builders

    parts = builders.build_parts(cfg, tiny_cifar(np.random.default_rng(0)), World())
    parts.load_state_dict(state)


def test_the_linear_schedule_runs_to_zero(cpu_backend, tiny, tmp_path):  # noqa: F811
    run(config("--epochs", "2", "--schedule", "linear"), tmp_path, tiny).run()
    state = checkpoint.load_checkpoint(tmp_path / "last.npz")
    rows = state["metrics"]["history"]
    assert state["schedule"]["type"] == "LinearSchedule" and rows[0]["lr"] == pytest.approx(0.01)
    assert rows[1]["lr"] == pytest.approx(0.005)  # halfway at the second epoch's start (2 steps an epoch)


def test_recipe_c_runs(cpu_backend, tiny, tmp_path):  # noqa: F811
    """Recipe C as shipped (batch, epochs and rate shrunk to the tiny set, Cutout and the 20-pixel early epochs off
    for its 8x8 images; test_train_dryrun_cpu.py runs progressive resizing)."""
    cfg = cli.resolve_config(cli.build_parser().parse_args(
        ["--recipe", "C", "--epochs", "3", "--batch-size", "16", "--eval-batch-size", "8", "--cutout", "0",
         "--warmup-epochs", "1", "--lr", "0.01", "--progressive-size", "0"]))
    summary = run(cfg, tmp_path, tiny).run()
    assert summary["recipe"] == "C" and summary["completed"] and summary["epochs_done"] == 3
    assert summary["tta"] == "flip-shift" and summary["ema"] is True and 0.0 <= summary["test_acc_tta"] <= 1.0
    assert summary["progressive"] is None
    rows = checkpoint.load_checkpoint(tmp_path / "last.npz")["metrics"]["history"]
    assert [r["test_acc"] is None for r in rows] == [True, True, False]  # evaluated once, at the end
