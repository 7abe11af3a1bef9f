"""The trainer without a GPU: the command line (errors, --download, the no-GPU path), the schedule/optimizer
adapter, checkpoints (atomic write, round trip, background writer), metrics CSV / TensorBoard / PNG, resume checks.
The recipe's settings are tested in test_config_cpu.py."""

import dataclasses
import hashlib
import importlib
import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import child_env
from test_data_formats_cpu import archive_of_python_batches

import resnet_native as rn
import resnet_native._core.runtime
from resnet_native.data import cifar10
from resnet_native.data.cifar10 import CIFAR10Data
from resnet_native.formats import checkpoint
from resnet_native.training import builders, checkpoint_writer, cli, loop, metrics_log
from resnet_native.training.config import TrainConfig

download = importlib.import_module("resnet_native.data.download")


def cfg_from(argv):
    return cli.resolve_config(cli.build_parser().parse_args(argv))


# ----------------------------------------------------------------------------------------------------------------
# The command line


def test_cli_errors_exit_with_usage(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["--recipe", "Z"])
    assert "unknown recipe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--data", str(tmp_path / "missing")])
    assert "CIFAR-10 not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--epochs", "0"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--precision", "fp8"])


@pytest.fixture
def no_data_around(tmp_path, monkeypatch):
    """A current directory without .data/, no $RESNET_NATIVE_CIFAR10, and an empty cache folder of its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RESNET_NATIVE_CIFAR10", raising=False)
    monkeypatch.setenv("RESNET_NATIVE_CACHE", str(tmp_path / "cache"))
    return cifar10.user_cache_dir()


def test_no_data_says_what_to_pass(no_data_around, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--epochs", "1", "--warmup-epochs", "0"])
    err = capsys.readouterr().err
    assert "CIFAR-10 not found" in err and "--data PATH" in err and "--download" in err
    assert ".data/" in err and str(no_data_around) in err  # where it looked


class RecordingTrainer:
    """Stands in for the Trainer: records how main() set it up and ran it ("run": run()'s arguments)."""

    made = []

    def __init__(self, cfg, out, **kw):
        self.made.append(dict(kw, cfg=cfg, out=out))

    def run(self, **kw):
        self.made[-1]["run"] = kw
        return {"test_acc": 0.5}


def test_download_fetches_into_the_cache_folder_and_trains_on_it(no_data_around, tmp_path, monkeypatch, rng):
    payload = archive_of_python_batches(tmp_path / "build", rng)
    (tmp_path / "served.tar.gz").write_bytes(payload)
    monkeypatch.setitem(download.ARCHIVES, "python", ((tmp_path / "served.tar.gz").as_uri(),
                                                      hashlib.md5(payload).hexdigest(),
                                                      hashlib.sha256(payload).hexdigest(), "cifar-10-batches-py"))
    monkeypatch.setattr(resnet_native._core.runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(cli, "Trainer", RecordingTrainer)
    RecordingTrainer.made.clear()
    cli.main(["--epochs", "1", "--warmup-epochs", "0", "--download", "--no-progress", "--out", str(tmp_path / "run")])
    fetched = no_data_around / "cifar-10-batches-py"
    assert RecordingTrainer.made[-1]["data_path"] == fetched and (fetched / "data_batch_1").is_file()
    # The next run finds the downloaded copy without --download.
    (tmp_path / "served.tar.gz").unlink()
    cli.main(["--epochs", "1", "--warmup-epochs", "0", "--out", str(tmp_path / "run")])
    assert RecordingTrainer.made[-1]["data_path"] == fetched


@pytest.mark.skipif(rn.cuda_available(), reason="checks the no-GPU error")
def test_cli_without_gpu_fails_before_touching_data_or_run_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(cifar10, "load_cifar10", lambda *a, **k: pytest.fail("data decoded without a GPU"))
    monkeypatch.setattr(download, "download", lambda *a, **k: pytest.fail("downloaded without a GPU"))
    with pytest.raises(SystemExit) as e:
        cli.main(["--epochs", "1", "--warmup-epochs", "0", "--data", str(tmp_path / "data"),
                  "--out", str(tmp_path / "run")])
    assert e.value.code == 1 and "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_subset_indices():
    a = builders.subset_indices(50000, 5000, seed=0)
    assert len(a) == 5000 and len(np.unique(a)) == 5000 and (np.diff(a) > 0).all()
    np.testing.assert_array_equal(a, builders.subset_indices(50000, 5000, seed=0))
    assert not np.array_equal(a, builders.subset_indices(50000, 5000, seed=1))
    np.testing.assert_array_equal(builders.subset_indices(100, None, 0), np.arange(100))
    np.testing.assert_array_equal(builders.subset_indices(100, 500, 0), np.arange(100))


# ----------------------------------------------------------------------------------------------------------------
# The model/optimizer adapter (host side: schedules only set optimizer attributes)


class FakeOptimizer:
    def __init__(self, lr):
        self.lr = lr
        self.momentum = None

    def set_momentum(self, m):
        self.momentum = m


def test_schedule_adapter_warmup_then_cosine():
    cfg = TrainConfig.from_dict({"epochs": 10, "optimizer": {"name": "sgd", "lr": 0.1},
                                 "schedule": {"name": "cosine", "warmup_epochs": 2}})
    opt = FakeOptimizer(0.1)
    sched = builders.build_schedule(cfg, opt, steps_per_epoch=5)
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
    sched2 = builders.build_schedule(cfg, opt2, steps_per_epoch=5)
    sched2.load_state_dict(checkpoint._unflatten(checkpoint._flatten(state, {}), {}))
    assert opt2.lr == opt.lr


def test_schedule_adapter_onecycle_cycles_momentum():
    cfg = TrainConfig.from_dict({"epochs": 4, "optimizer": {"name": "adamw", "lr": 3e-4},
                                 "schedule": {"name": "onecycle"}})
    opt = FakeOptimizer(3e-4)
    sched = builders.build_schedule(cfg, opt, steps_per_epoch=25)
    lrs = [opt.lr]
    for _ in range(99):
        sched.step()
        lrs.append(opt.lr)
    assert lrs[0] == pytest.approx(3e-4 / 25) and max(lrs) == pytest.approx(3e-4)
    assert int(np.argmax(lrs)) == 29 and lrs[-1] < 1e-7
    assert opt.momentum is not None


def test_optimizer_adapter_and_state_round_trip(tmp_path):
    model = rn.ResNet18(num_classes=10, stem="cifar", layout="NHWC", precision="fp16", seed=0)
    sgd = builders.build_optimizer(cfg_from(["--recipe", "A"]), model)
    assert isinstance(sgd, rn.SGD) and sgd.nesterov and sgd.lr == 0.3 and sgd.weight_decay == 5e-4
    adamw = builders.build_optimizer(cfg_from(["--recipe", "B"]), model)
    assert isinstance(adamw, rn.AdamW) and adamw.lr == 8e-4 and adamw.weight_decay == 0.05
    state = {"optimizer": adamw.state_dict(), "model": model.state_dict()}
    checkpoint.save_checkpoint(tmp_path / "s.npz", state)
    back = checkpoint.load_checkpoint(tmp_path / "s.npz")
    assert back["optimizer"].keys() == state["optimizer"].keys()
    fresh = builders.build_optimizer(cfg_from(["--recipe", "B"]), model)
    fresh.load_state_dict(back["optimizer"])
    assert fresh.betas == adamw.betas
    for k, v in state["model"].items():
        np.testing.assert_array_equal(back["model"][k], v)
    assert builders.build_scaler(cfg_from([])) is not None
    assert builders.build_scaler(cfg_from(["--precision", "bf16"])) is None


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
    w = checkpoint_writer.CheckpointWriter()
    state = {"epoch": 0, "w": rng.standard_normal(10)}
    w.submit(tmp_path / "last.npz", state, tmp_path / "best.npz")
    w.flush()
    w.submit(tmp_path / "last.npz", {"epoch": 1, "w": np.zeros(10)}, None)
    w.close()
    assert checkpoint.load_checkpoint(tmp_path / "last.npz")["epoch"] == 1
    best = checkpoint.load_checkpoint(tmp_path / "best.npz")
    assert best["epoch"] == 0
    np.testing.assert_array_equal(best["w"], state["w"])

    bad = checkpoint_writer.CheckpointWriter()
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


def block_import(monkeypatch, package):
    """Make `import package` (and its submodules) raise ImportError, as when it is not installed."""
    import builtins

    real_import = builtins.__import__

    def importer(name, *a, **k):
        if name == package or name.startswith(package + "."):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", importer)
    monkeypatch.setattr(metrics_log, "_SAID", set())  # as in a fresh process


def test_tensorboard_absent_is_fine_and_said_once(tmp_path, monkeypatch, capsys):
    block_import(monkeypatch, "tensorboard")
    metrics_log.MetricsLog(tmp_path / "off", tensorboard=False)
    assert "tensorboard" not in capsys.readouterr().err  # not asked for: nothing to say
    log = metrics_log.MetricsLog(tmp_path)
    assert not log.tensorboard_enabled
    log.log_epoch(rows(1)[0])
    assert (tmp_path / "metrics.csv").is_file()
    assert capsys.readouterr().err == ("tensorboard is not installed: pip install 'resnet_native[logging]'; "
                                       "writing metrics.csv only\n")
    metrics_log.MetricsLog(tmp_path)
    assert capsys.readouterr().err == ""  # once per process


@pytest.mark.parametrize("backend", ["pil", "matplotlib"])
def test_plot_curves(tmp_path, monkeypatch, capsys, backend):
    from PIL import Image

    if backend == "matplotlib":
        pytest.importorskip("matplotlib")
    else:
        block_import(monkeypatch, "matplotlib")
    used = metrics_log.plot_curves(rows(5), tmp_path / "curves.png", title="recipe A")
    assert used == backend
    with Image.open(tmp_path / "curves.png") as im:
        assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 200
        px = np.asarray(im.convert("RGB"))
    assert len(np.unique(px.reshape(-1, 3), axis=0)) > 3  # lines were drawn, not a blank canvas
    said = capsys.readouterr().err
    if backend == "pil":
        assert "matplotlib is not installed: pip install 'resnet_native[logging]'; drawing curves.png with Pillow" \
            in said
    else:
        assert "matplotlib" not in said


# ----------------------------------------------------------------------------------------------------------------
# Resume checks and the no-GPU path (before any GPU work)


def tiny_data(rng):
    return CIFAR10Data(rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8), np.arange(64, dtype=np.int32) % 10,
                       rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8), np.arange(20, dtype=np.int32) % 10)


def test_resume_refuses_a_different_configuration(tmp_path, rng):
    cfg = cfg_from(["--epochs", "4", "--batch-size", "32"])
    checkpoint.save_checkpoint(tmp_path / "last.npz", {"format": loop.STATE_FORMAT, "epoch": 1,
                                                       "config": cfg.to_dict()})
    other = dataclasses.replace(cfg, seed=1)
    with pytest.raises(ValueError, match="seed"):
        loop.Trainer(other, tmp_path, data=tiny_data(rng)).run(resume=True)
    checkpoint.save_checkpoint(tmp_path / "last.npz", {"format": "something/else", "epoch": 1,
                                                       "config": cfg.to_dict()})
    with pytest.raises(ValueError, match="not a training state"):
        loop.Trainer(cfg, tmp_path, data=tiny_data(rng)).run(resume=True)
    # A checkpoint written before 'dtype' became 'precision' is compared on its precision all the same.
    old = cfg.to_dict()
    old["dtype"] = old.pop("precision")
    checkpoint.save_checkpoint(tmp_path / "last.npz", {"format": loop.STATE_FORMAT, "epoch": 1, "config": old})
    with pytest.raises(ValueError, match=r"differs from the checkpoint's in \['precision'\]"):
        loop.Trainer(dataclasses.replace(cfg, precision="bf16"), tmp_path, data=tiny_data(rng)).run(resume=True)


@pytest.mark.skipif(rn.cuda_available(), reason="checks the no-GPU error")
def test_training_without_gpu_says_so(tmp_path, rng):
    cfg = cfg_from(["--epochs", "1", "--batch-size", "32", "--warmup-epochs", "0"])
    with pytest.raises(rn.NoGPUError, match="needs a CUDA GPU"):
        loop.Trainer(cfg, tmp_path / "run", data=tiny_data(rng), progress=False).run()
    assert not (tmp_path / "run").exists()  # failed before making the run folder
    with pytest.raises(rn.NoGPUError):  # and before decoding any data
        loop.Trainer(cfg, tmp_path / "run", data_path=tmp_path / "not-a-data-set").run()


def test_summary_line_is_plain_json():
    line = cli.summary_line({"test_acc": float("nan"), "wall_time_s": 12.5, "best": float("inf"), "x": 1})
    assert "\n" not in line
    assert json.loads(line) == {"test_acc": None, "wall_time_s": 12.5, "best": None, "x": 1}


def test_the_stopwatch_sums_each_activity_and_calls_the_rest_other(monkeypatch):
    from resnet_native.training import stopwatch

    clock = iter([0.0, 1.5, 2.0, 2.25, 10.0, 10.5, 20.0, 23.0])
    monkeypatch.setattr(stopwatch.time, "perf_counter", lambda: next(clock))
    spent = stopwatch.Stopwatch()
    with spent("evaluate"):
        pass
    with spent("evaluate"):
        pass
    with pytest.raises(RuntimeError), spent("data"):  # an activity that raises still counts
        raise RuntimeError
    with spent("train"):
        pass
    assert spent.totals(wall=6.0) == {"evaluate": 1.75, "data": 0.5, "train": 3.0, "other": 0.75}


def test_untracked_seconds_are_those_no_activity_took(monkeypatch):
    from resnet_native.training import stopwatch

    clock = iter([1.0, 3.0, 10.0])
    monkeypatch.setattr(stopwatch.time, "perf_counter", lambda: next(clock))
    spent = stopwatch.Stopwatch()
    with spent("data"):  # 2 s of the 9 since 1.0
        pass
    spent.add_untracked("set-up", since=1.0)
    assert spent.seconds == {"data": 2.0, "set-up": 7.0}


def test_the_process_start_is_before_the_imports_and_a_sleep(tmp_path):
    from conftest import run_child

    # A child that sleeps 0.5 s before importing the trainer: the start it reads must be at least that far back.
    age = float(run_child("import time; time.sleep(0.5); from resnet_native.training.stopwatch import process_start; "
                          "print(time.perf_counter() - process_start())", cwd=tmp_path))
    if not pathlib.Path("/proc/self/stat").exists():
        assert age < 0.1  # no /proc: the wall time counts from the call
    else:
        assert 0.5 <= age < 60


def test_the_process_start_falls_back_to_now_without_a_plausible_age(monkeypatch):
    from resnet_native.training import stopwatch

    def no_proc(*args, **kwargs):
        raise OSError("no /proc")

    monkeypatch.setattr(stopwatch, "open", no_proc, raising=False)
    before = time.perf_counter()
    assert before <= stopwatch.process_start() <= time.perf_counter()


def test_the_command_counts_its_wall_time_from_the_process_start(monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "Trainer", RecordingTrainer)
    monkeypatch.setattr(resnet_native._core.runtime, "require_gpu", lambda: None)
    data = tmp_path / "cifar-10-python.tar.gz"
    data.write_bytes(b"")
    cli.main(["--recipe", "C", "--data", str(data), "--out", str(tmp_path / "run")], started_at=12.5)
    assert RecordingTrainer.made[-1]["run"]["started_at"] == 12.5


def test_the_evaluation_graph_is_on_unless_turned_off():
    assert cfg_from(["--recipe", "A"]).eval_cuda_graph is True
    assert cfg_from(["--recipe", "A", "--no-eval-cuda-graph"]).eval_cuda_graph is False


def test_the_command_exits_without_the_interpreters_teardown_once_the_run_is_done(tmp_path):
    """After main() returns, `python -m resnet_native.train` flushes its output and ends the process: an exit
    handler registered before the run does not run, and what the run printed is all there."""
    marker = tmp_path / "teardown-ran"
    script = (
        "import atexit, pathlib, runpy\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).touch)\n"
        "import resnet_native.training.cli as cli\n"
        "cli.main = lambda started_at: print('the run', end='')\n"
        "runpy.run_module('resnet_native.train', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=child_env(), cwd=tmp_path)  # not the checkout: its unbuilt tree would shadow the package
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the run"
    assert not marker.exists()
