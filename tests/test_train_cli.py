"""The trainer without a GPU: CLI parsing, YAML recipes, configuration checks, the schedule/optimizer adapter,
checkpoints (atomic write, round trip, background writer), metrics CSV / TensorBoard / PNG, resume checks."""

import json
import pathlib

import numpy as np
import pytest

import resnet_native as rn
from resnet_native import checkpoint, metrics_log, train
from resnet_native.data.cifar10 import CIFAR10Data


def cfg_from(argv):
    return train.resolve_config(train.build_parser().parse_args(argv))


# ----------------------------------------------------------------------------------------------------------------
# Recipes and CLI


def test_recipe_a_is_the_issue_recipe():
    cfg = cfg_from(["--recipe", "A"])
    assert cfg["name"] == "A" and cfg["model"] == "resnet18" and cfg["epochs"] == 200
    assert cfg["batch_size"] == 256 and cfg["dtype"] == "fp16" and cfg["layout"] == "NHWC"
    assert cfg["optimizer"] == {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}
    assert cfg["schedule"] == {"name": "cosine", "warmup_epochs": 0.0}
    assert cfg["augment"] == {"crop_padding": 4, "flip": True, "cutout": 16, "autoaugment": False}
    assert cfg["label_smoothing"] == 0.0


def test_recipe_b_is_the_issue_recipe():
    cfg = cfg_from(["--recipe", "B"])
    assert cfg["epochs"] == 100 and cfg["batch_size"] == 256
    assert cfg["optimizer"] == {"name": "adamw", "lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                "weight_decay": 0.05}
    assert cfg["schedule"]["name"] == "onecycle"
    assert cfg["augment"]["autoaugment"] is True and cfg["augment"]["cutout"] == 16
    assert cfg["label_smoothing"] == 0.1
    assert sorted(train.available_recipes())[:2] == ["A", "B"]


def test_cli_flags_override_the_recipe():
    cfg = cfg_from(["--recipe", "B", "--model", "resnet50", "--epochs", "3", "--batch-size", "128",
                    "--eval-batch-size", "500", "--dtype", "bf16", "--layout", "NCHW", "--seed", "4",
                    "--subset", "1000", "--warmup-epochs", "1.5", "--label-smoothing", "0.1", "--lr", "0.01",
                    "--weight-decay", "0.001", "--cutout", "8", "--deterministic"])
    assert (cfg["model"], cfg["epochs"], cfg["batch_size"], cfg["eval_batch_size"]) == ("resnet50", 3, 128, 500)
    assert (cfg["dtype"], cfg["layout"], cfg["seed"], cfg["subset"]) == ("bf16", "NCHW", 4, 1000)
    assert cfg["schedule"] == {"name": "onecycle", "warmup_epochs": 1.5}
    assert cfg["label_smoothing"] == 0.1 and cfg["deterministic"] is True
    assert cfg["optimizer"]["lr"] == 0.01 and cfg["optimizer"]["weight_decay"] == 0.001
    assert cfg["augment"]["cutout"] == 8 and cfg["augment"]["autoaugment"] is True
    assert cfg["optimizer"]["name"] == "adamw"  # untouched keys keep the recipe's values
    args = train.build_parser().parse_args(["--out", "runs/x", "--resume", "--no-progress", "--data", "d"])
    assert args.resume and args.no_progress and args.out == "runs/x" and args.data == "d"
    assert train.default_out_dir(cfg_from([])) == pathlib.Path("runs/A-resnet18")


def test_recipe_from_a_yaml_file(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("epochs: 7\noptimizer:\n  name: sgd\n  lr: 5e-2\n  weight_decay: 5e-4\n")
    cfg = cfg_from(["--recipe", str(p)])
    # YAML 1.1 reads 5e-2 as a string; the config coerces numbers.
    assert cfg["name"] == "mine" and cfg["epochs"] == 7 and cfg["optimizer"]["lr"] == 0.05
    assert cfg["optimizer"]["weight_decay"] == 5e-4 and cfg["augment"]["crop_padding"] == 4


@pytest.mark.parametrize("bad, message", [
    ({"epochs": 0}, "epochs"),
    ({"epochs": 2.5}, "epochs"),
    ({"dtype": "fp64"}, "dtype"),
    ({"layout": "NWHC"}, "layout"),
    ({"model": "resnet20"}, "model"),
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"optimizer": {"name": "rmsprop", "lr": 0.1}}, "optimizer.name"),
    ({"optimizer": {"name": "sgd"}}, "optimizer.lr"),
    ({"optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9]}}, "optimizer.betas"),
    ({"schedule": {"name": "step"}}, "schedule.name"),
    ({"schedule": {"name": "cosine", "warmup_epochs": 10}}, "warmup_epochs"),
    ({"augment": {"cutout": -2}}, "augment.cutout"),
    ({"batch_size": "many"}, "batch_size"),
    # bool("false") is True: only real booleans are accepted.
    ({"optimizer": {"name": "sgd", "lr": 0.1, "nesterov": "false"}}, "optimizer.nesterov"),
    ({"augment": {"flip": "false"}}, "augment.flip"),
    ({"augment": {"autoaugment": "false"}}, "augment.autoaugment"),
    ({"augment": {"autoaugment": 1}}, "augment.autoaugment"),
    ({"deterministic": "false"}, "deterministic"),
])
def test_invalid_configurations_name_the_key(bad, message):
    cfg = train.load_recipe("A")
    cfg.update(bad)
    cfg["epochs"] = bad.get("epochs", 10)
    with pytest.raises(ValueError, match=message):
        train.validate_config(cfg)


def test_cli_errors_exit_with_usage(capsys, tmp_path):
    with pytest.raises(SystemExit):
        train.main(["--recipe", "Z"])
    assert "unknown recipe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--data", str(tmp_path / "missing")])
    assert "CIFAR-10 not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--epochs", "0"])
    with pytest.raises(SystemExit):
        train.build_parser().parse_args(["--dtype", "fp8"])


def test_subset_indices():
    a = train.subset_indices(50000, 5000, seed=0)
    assert len(a) == 5000 and len(np.unique(a)) == 5000 and (np.diff(a) > 0).all()
    np.testing.assert_array_equal(a, train.subset_indices(50000, 5000, seed=0))
    assert not np.array_equal(a, train.subset_indices(50000, 5000, seed=1))
    np.testing.assert_array_equal(train.subset_indices(100, None, 0), np.arange(100))
    np.testing.assert_array_equal(train.subset_indices(100, 500, 0), np.arange(100))


# ----------------------------------------------------------------------------------------------------------------
# The model/optimizer adapter (host side: schedules only set optimizer attributes)


class FakeOptimizer:
    def __init__(self, lr):
        self.lr = lr
        self.momentum = None

    def set_momentum(self, m):
        self.momentum = m


def test_schedule_adapter_warmup_then_cosine():
    cfg = train.validate_config({"epochs": 10, "optimizer": {"name": "sgd", "lr": 0.1},
                                 "schedule": {"name": "cosine", "warmup_epochs": 2}})
    opt = FakeOptimizer(0.1)
    sched = train.build_schedule(cfg, opt, steps_per_epoch=5)
    lrs = [opt.lr]
    for _ in range(50):
        sched.step()
        lrs.append(opt.lr)
    # Warm-up from a third of the lr (step 0 must move the weights), linear to the full lr at step 10.
    assert lrs[0] == pytest.approx(0.1 / 3) and lrs[5] == pytest.approx(0.1 * 2 / 3) and lrs[10] == pytest.approx(0.1)
    assert lrs[30] == pytest.approx(0.05)  # cosine half-way through its 40 steps
    assert lrs[50] == pytest.approx(0.0, abs=1e-12)
    assert np.all(np.diff(lrs[10:]) <= 1e-15)
    state = sched.state_dict()
    opt2 = FakeOptimizer(0.1)
    sched2 = train.build_schedule(cfg, opt2, steps_per_epoch=5)
    sched2.load_state_dict(checkpoint._unflatten(checkpoint._flatten(state, {}), {}))
    assert opt2.lr == opt.lr


def test_schedule_adapter_onecycle_cycles_momentum():
    cfg = train.validate_config({"epochs": 4, "optimizer": {"name": "adamw", "lr": 3e-4},
                                 "schedule": {"name": "onecycle"}})
    opt = FakeOptimizer(3e-4)
    sched = train.build_schedule(cfg, opt, steps_per_epoch=25)
    lrs = [opt.lr]
    for _ in range(99):
        sched.step()
        lrs.append(opt.lr)
    assert lrs[0] == pytest.approx(3e-4 / 25) and max(lrs) == pytest.approx(3e-4)
    assert int(np.argmax(lrs)) == 29 and lrs[-1] < 1e-7
    assert opt.momentum is not None


def test_optimizer_adapter_and_state_round_trip(tmp_path):
    model = rn.ResNet18(num_classes=10, stem="cifar", layout="NHWC", precision="fp16", seed=0)
    sgd = train.build_optimizer(cfg_from(["--recipe", "A"]), model)
    assert isinstance(sgd, rn.SGD) and sgd.nesterov and sgd.lr == 0.1 and sgd.weight_decay == 5e-4
    adamw = train.build_optimizer(cfg_from(["--recipe", "B"]), model)
    assert isinstance(adamw, rn.AdamW) and adamw.lr == 3e-4 and adamw.weight_decay == 0.05
    state = {"optimizer": adamw.state_dict(), "model": model.state_dict()}
    checkpoint.save_checkpoint(tmp_path / "s.npz", state)
    back = checkpoint.load_checkpoint(tmp_path / "s.npz")
    assert back["optimizer"].keys() == state["optimizer"].keys()
    fresh = train.build_optimizer(cfg_from(["--recipe", "B"]), model)
    fresh.load_state_dict(back["optimizer"])
    assert fresh.betas == adamw.betas
    for k, v in state["model"].items():
        np.testing.assert_array_equal(back["model"][k], v)
    assert train.build_scaler(cfg_from([])) is not None and train.build_scaler(cfg_from(["--dtype", "bf16"])) is None


def test_model_seed_reproduces_initial_weights():
    a = rn.ResNet18(num_classes=10, stem="cifar", layout="NHWC", precision="fp16", seed=3).state_dict()
    b = rn.ResNet18(num_classes=10, stem="cifar", layout="NHWC", precision="fp16", seed=3).state_dict()
    c = rn.ResNet18(num_classes=10, stem="cifar", layout="NHWC", precision="fp16", seed=4).state_dict()
    np.testing.assert_array_equal(a["conv1.weight"], b["conv1.weight"])
    assert not np.array_equal(a["conv1.weight"], c["conv1.weight"])


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints


def nested_state(rng):
    return {
        "epoch": 3, "lr": 0.05, "flag": True, "nothing": None, "name": "A",
        "model": {"conv1.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                  "bn1.num_batches_tracked": np.array(12, np.int64)},
        "half": rng.standard_normal(5).astype(np.float16),
        "bits": np.arange(4, dtype=np.uint16),
        "history": [{"epoch": 1, "test_acc": 0.5}, {"epoch": 2, "test_acc": float("inf")}],
        "betas": (0.9, 0.999),
        "per_param": {0: np.ones(2, np.float32), 1: np.zeros(3, np.float32)},
        "scalar": np.float32(1.5),
    }


def test_checkpoint_round_trip(tmp_path, rng):
    state = nested_state(rng)
    checkpoint.save_checkpoint(tmp_path / "c.npz", state)
    back = checkpoint.load_checkpoint(tmp_path / "c.npz")
    assert back["epoch"] == 3 and back["lr"] == 0.05 and back["flag"] is True and back["nothing"] is None
    assert back["name"] == "A" and back["betas"] == (0.9, 0.999) and back["scalar"] == 1.5
    assert back["history"] == state["history"]
    for k in ("half", "bits"):
        assert back[k].dtype == state[k].dtype
        np.testing.assert_array_equal(back[k], state[k])
    np.testing.assert_array_equal(back["model"]["conv1.weight"], state["model"]["conv1.weight"])
    assert back["model"]["bn1.num_batches_tracked"] == 12
    assert sorted(back["per_param"]) == [0, 1]
    np.testing.assert_array_equal(back["per_param"][1], np.zeros(3))
    # Plain NumPy can open it and nothing in it needs pickle.
    with np.load(tmp_path / "c.npz", allow_pickle=False) as z:
        assert "__tree__" in z.files


def test_checkpoint_write_is_atomic(tmp_path, rng, monkeypatch):
    path = tmp_path / "last.npz"
    checkpoint.save_checkpoint(path, {"epoch": 1, "w": np.ones(3)})

    def crash(f, **arrays):
        f.write(b"partial data")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_checkpoint(path, {"epoch": 2, "w": np.zeros(3)})
    monkeypatch.undo()
    assert checkpoint.load_checkpoint(path)["epoch"] == 1  # the old checkpoint, intact
    assert [p.name for p in tmp_path.iterdir()] == ["last.npz"]  # no temporary file left


def test_checkpoint_rejects_foreign_files_and_values(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    with pytest.raises(ValueError, match="not a resnet_native checkpoint"):
        checkpoint.load_checkpoint(tmp_path / "plain.npz")
    with pytest.raises(TypeError, match="cannot store"):
        checkpoint.save_checkpoint(tmp_path / "x.npz", {"f": object()})


def test_background_writer_and_best_link(tmp_path, rng):
    w = train.CheckpointWriter()
    state = {"epoch": 0, "w": rng.standard_normal(10)}
    w.submit(tmp_path / "last.npz", state, tmp_path / "best.npz")
    w.flush()
    w.submit(tmp_path / "last.npz", {"epoch": 1, "w": np.zeros(10)}, None)
    w.close()
    assert checkpoint.load_checkpoint(tmp_path / "last.npz")["epoch"] == 1
    best = checkpoint.load_checkpoint(tmp_path / "best.npz")
    assert best["epoch"] == 0
    np.testing.assert_array_equal(best["w"], state["w"])

    bad = train.CheckpointWriter()
    bad.submit(tmp_path / "no" / "\0bad.npz", {"epoch": 0})
    with pytest.raises(RuntimeError, match="checkpoint"):
        bad.flush()
    bad.close()


# ----------------------------------------------------------------------------------------------------------------
# Metrics


def rows(n=4):
    return [{"epoch": e, "lr": 0.1 / e, "train_loss": 2.0 / e, "train_acc": 0.2 * e, "test_loss": 2.2 / e,
             "test_acc": 0.19 * e, "epoch_time_s": 1.5, "images_per_s": 30000.0 + e} for e in range(1, n + 1)]


def test_metrics_csv_and_resume_rewrite(tmp_path):
    log = metrics_log.MetricsLog(tmp_path, tensorboard=False)
    for r in rows(3):
        log.log_epoch(r)
    back = metrics_log.read_metrics_csv(tmp_path / "metrics.csv")
    assert [r["epoch"] for r in back] == [1, 2, 3] and back[2]["test_acc"] == pytest.approx(0.57)
    assert list(back[0]) == list(metrics_log.COLUMNS)
    # Resuming from a checkpoint taken after epoch 2: the CSV holds epochs 1-2 plus the new ones only.
    log2 = metrics_log.MetricsLog(tmp_path, rows=rows(2), tensorboard=False)
    log2.log_epoch(rows(3)[2] | {"test_acc": 0.9})
    back = metrics_log.read_metrics_csv(tmp_path / "metrics.csv")
    assert [r["epoch"] for r in back] == [1, 2, 3] and back[2]["test_acc"] == 0.9


def test_tensorboard_events_are_readable(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = metrics_log.MetricsLog(tmp_path)
    assert log.tensorboard_enabled
    for r in rows(3):
        log.log_epoch(r)
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"loss/train", "loss/test", "accuracy/train", "accuracy/test", "lr"} <= set(acc.Tags()["scalars"])
    test_acc = acc.Scalars("accuracy/test")
    assert [e.step for e in test_acc] == [1, 2, 3]
    assert test_acc[2].value == pytest.approx(0.57)


def test_tensorboard_absent_is_fine(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *a, **k):
        if name.startswith("tensorboard"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    log = metrics_log.MetricsLog(tmp_path)
    assert not log.tensorboard_enabled
    log.log_epoch(rows(1)[0])
    assert (tmp_path / "metrics.csv").is_file()


@pytest.mark.parametrize("backend", ["pil", "matplotlib"])
def test_plot_curves(tmp_path, monkeypatch, backend):
    from PIL import Image

    if backend == "matplotlib":
        pytest.importorskip("matplotlib")
    else:
        import builtins

        real_import = builtins.__import__
        monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                            if name.startswith("matplotlib") else real_import(name, *a, **k))
    used = metrics_log.plot_curves(rows(5), tmp_path / "curves.png", title="recipe A")
    assert used == backend
    with Image.open(tmp_path / "curves.png") as im:
        assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 200
        px = np.asarray(im.convert("RGB"))
    assert len(np.unique(px.reshape(-1, 3), axis=0)) > 3  # lines were drawn, not a blank canvas


# ----------------------------------------------------------------------------------------------------------------
# Resume checks and the no-GPU path (before any GPU work)


def tiny_data(rng):
    return CIFAR10Data(rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8), np.arange(64, dtype=np.int32) % 10,
                       rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8), np.arange(20, dtype=np.int32) % 10)


def test_resume_refuses_a_different_configuration(tmp_path, rng):
    cfg = cfg_from(["--epochs", "4", "--batch-size", "32"])
    checkpoint.save_checkpoint(tmp_path / "last.npz", {"format": train.STATE_FORMAT, "epoch": 1, "config": cfg})
    other = dict(cfg, seed=1)
    with pytest.raises(ValueError, match="seed"):
        train.Trainer(other, tmp_path, data=tiny_data(rng)).run(resume=True)
    checkpoint.save_checkpoint(tmp_path / "last.npz", {"format": "something/else", "epoch": 1, "config": cfg})
    with pytest.raises(ValueError, match="not a training state"):
        train.Trainer(cfg, tmp_path, data=tiny_data(rng)).run(resume=True)


@pytest.mark.skipif(rn.cuda_available(), reason="checks the no-GPU error")
def test_training_without_gpu_says_so(tmp_path, rng):
    cfg = cfg_from(["--epochs", "1", "--batch-size", "32"])
    with pytest.raises(rn.NoGPUError):
        train.Trainer(cfg, tmp_path, data=tiny_data(rng), progress=False).run()


def test_summary_line_is_plain_json():
    line = train.summary_line({"test_acc": float("nan"), "wall_time_s": 12.5, "best": float("inf"), "x": 1})
    assert "\n" not in line
    assert json.loads(line) == {"test_acc": None, "wall_time_s": 12.5, "best": None, "x": 1}
