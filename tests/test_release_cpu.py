"""Releases without a GPU: cifar10_models/version_X/ from a run folder, weights round trip (safetensors; an older
release's npz is still read), config and metrics, atomic replacement, the CLI, the version's validation, and the
standalone preprocess.py."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import yaml

import resnet_native as rn
from resnet_native.data.augment import MEAN, STD, normalize_on_host
from resnet_native.data.cifar10 import CLASSES
from resnet_native.formats import checkpoint
from resnet_native.formats.release_folder import load_weights
from resnet_native.release import build as release
from resnet_native.training import cli, loop

HAVE_ONNX = importlib.util.find_spec("onnx") is not None


def make_fake_run(run_dir, *, recipe="A", best_epoch=2, epochs=3, layout="NHWC", precision="fp16", seed=0):
    """A run folder as resnet_native.train leaves it: config.yaml, last.npz, best.npz (weights of a real
    ResNet-18 built on the host), summary.json."""
    cfg = cli.resolve_config(cli.build_parser().parse_args(
        ["--recipe", recipe, "--epochs", str(epochs), "--layout", layout, "--precision", precision])).to_dict()
    model = rn.ResNet18(num_classes=10, stem="cifar", layout=layout, precision=precision, seed=seed)
    history = [{"epoch": e, "lr": 0.1, "train_loss": 1.0 / e, "train_acc": 0.3 * e, "test_loss": 1.1 / e,
                "test_acc": 0.25 * e + (0.1 if e == best_epoch else 0.0), "epoch_time_s": 2.0,
                "images_per_s": 25000.0} for e in range(1, epochs + 1)]
    state = {"format": loop.STATE_FORMAT, "epoch": best_epoch - 1, "config": cfg, "model": model.state_dict(),
             "optimizer": None, "schedule": None, "scaler": None, "rng": {"seed": 0, "next_epoch": best_epoch},
             "metrics": {"history": history[:best_epoch], "best": {"test_acc": history[best_epoch - 1]["test_acc"],
                                                                    "epoch": best_epoch},
                         "train_time_s": 2.0 * best_epoch}}
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.save_checkpoint(run_dir / "best.npz", state)
    checkpoint.save_checkpoint(run_dir / "last.npz", dict(state, epoch=epochs - 1,
                                                          metrics=dict(state["metrics"], history=history)))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run_dir / "summary.json").write_text(json.dumps({"completed": True, "wall_time_s": 99.5}))
    return state


def assert_published(models, version="A"):
    """version_X is a relative symlink to the one hidden release folder beside it; nothing else is left."""
    link = models / f"version_{version}"
    assert link.is_symlink() and (link / "config.yaml").is_file()
    target = os.readlink(link)
    assert target.startswith(f".version_{version}.") and os.sep not in target
    assert sorted(p.name for p in models.iterdir()) == sorted([target, f"version_{version}"])
    return models / target


def test_release_round_trip(tmp_path):
    state = make_fake_run(tmp_path / "run")
    path = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    assert path == tmp_path / "models" / "version_A"
    files = sorted(p.name for p in path.iterdir())
    assert files == sorted(["config.yaml", "metrics.json", "model.safetensors", "preprocess.json", "preprocess.py"]
                           + (["model.onnx"] if HAVE_ONNX else []))
    assert_published(tmp_path / "models")  # no temporary folders left

    weights = load_weights(path)
    assert weights.keys() == state["model"].keys()
    for k, v in state["model"].items():
        assert weights[k].dtype == v.dtype and weights[k].shape == v.shape
        np.testing.assert_array_equal(weights[k], v)

    config = yaml.safe_load((path / "config.yaml").read_text())
    assert config["model"] == {"name": "resnet18", "num_classes": 10, "stem": "cifar", "layout": "NHWC",
                               "precision": "fp16"}
    assert config["classes"] == list(CLASSES) and config["weights"] == "model.safetensors"
    assert config["input"]["mean"] == list(MEAN) and config["input"]["std"] == list(STD)
    assert config["training"]["epoch"] == 2 and config["training"]["recipe"]["optimizer"]["name"] == "sgd"
    # No absolute paths: the run is named by its folder's name.
    assert config["training"]["run"] == "run"
    assert str(tmp_path) not in (path / "config.yaml").read_text() + (path / "metrics.json").read_text()

    metrics = json.loads((path / "metrics.json").read_text())
    assert metrics["test_accuracy"] == pytest.approx(0.6) and metrics["epoch"] == 2 and metrics["epochs"] == 3
    assert metrics["parameters"] == rn.ResNet18(num_classes=10).num_parameters() == 11173962
    assert metrics["training_time_s"] == 4.0 and metrics["wall_time_s"] == 99.5
    assert metrics["train_images_per_s"] == pytest.approx(25000.0)
    assert metrics["inference_images_per_s"] is None
    assert metrics["tta"] == "none" and metrics["test_accuracy_tta"] is None  # recipe A evaluates without TTA


def test_release_of_the_last_checkpoint(tmp_path):
    make_fake_run(tmp_path / "run")
    path = release.release(tmp_path / "run", "B", tmp_path / "models", checkpoint="last", benchmark=False)
    assert (path / "model.safetensors").is_file() and not (path / "model.npz").exists()
    assert yaml.safe_load((path / "config.yaml").read_text())["weights"] == "model.safetensors"
    assert json.loads((path / "metrics.json").read_text())["epoch"] == 3
    w = load_weights(path)
    assert w["fc.weight"].shape == (10, 512) and w["conv1.weight"].shape == (64, 3, 3, 3)
    assert w["bn1.num_batches_tracked"].shape == () and w["bn1.num_batches_tracked"].dtype == np.int64


def test_older_releases_and_runs_are_still_read(tmp_path):
    """A release made before safetensors was required (model.npz) and before 'dtype' became 'precision'; and a run
    whose checkpoint still says 'dtype'."""
    state = make_fake_run(tmp_path / "run", precision="bf16")
    old = tmp_path / "old" / "version_O"
    shutil.copytree(release.release(tmp_path / "run", "O", tmp_path / "models", benchmark=False).resolve(), old)
    weights = load_weights(old)
    np.savez(old / "model.npz", **weights)
    (old / "model.safetensors").unlink()
    config = yaml.safe_load((old / "config.yaml").read_text())
    config["model"]["dtype"] = config["model"].pop("precision")
    config["weights"] = "model.npz"
    (old / "config.yaml").write_text(yaml.safe_dump(config))
    w = load_weights(old)
    assert w.keys() == weights.keys() and w["bn1.num_batches_tracked"].shape == ()
    assert w["bn1.num_batches_tracked"].dtype == np.int64
    for k, v in weights.items():
        np.testing.assert_array_equal(w[k], v)

    from resnet_native.release.classifier import CIFAR10Classifier

    clf = CIFAR10Classifier(old, model=object())
    assert clf.precision == "bf16" and clf.layout == "NHWC"

    legacy = dict(state["config"])
    legacy["dtype"] = legacy.pop("precision")
    checkpoint.save_checkpoint(tmp_path / "legacy" / "best.npz", dict(state, config=legacy))
    path = release.release(tmp_path / "legacy", "L", tmp_path / "models", benchmark=False)
    config = yaml.safe_load((path / "config.yaml").read_text())
    assert config["model"]["precision"] == "bf16" and config["training"]["recipe"]["precision"] == "bf16"


def test_release_replaces_a_version_and_validates(tmp_path):
    make_fake_run(tmp_path / "run")
    first = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    (first / "stale.txt").write_text("from the previous release")
    second = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    assert second == first and not (second / "stale.txt").exists()
    assert_published(tmp_path / "models")  # the previous release's folder is gone
    for bad in ("", "../x", ".hidden", "a/b", "a\\b", "-x", "x" * 65, None, 3):
        with pytest.raises(ValueError, match="version"):
            release.release(tmp_path / "run", bad, tmp_path / "models", benchmark=False)
    with pytest.raises(FileNotFoundError, match="best.npz"):
        release.release(tmp_path / "nothing", "A", tmp_path / "models", benchmark=False)


def test_the_next_release_removes_what_a_killed_one_left(tmp_path):
    make_fake_run(tmp_path / "run")
    models = tmp_path / "models"
    release.release(tmp_path / "run", "A", models, benchmark=False)
    other = release.release(tmp_path / "run", "A.B", models, benchmark=False)  # its folders start '.version_A.' too
    dead = models / ".version_A.k1ll3d_x"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "model.safetensors").write_bytes(b"half")
    os.symlink(dead.name, models / ".version_A.k1ll3d_y.link")
    legacy = models / ".version_A.old-1234"  # a legacy release renamed aside: never deleted unasked
    legacy.mkdir()
    release.release(tmp_path / "run", "A", models, benchmark=False)
    assert not dead.exists() and not (models / ".version_A.k1ll3d_y.link").is_symlink() and legacy.is_dir()
    kept = {".version_A.old-1234", os.readlink(models / "version_A"), os.readlink(models / "version_A.B")}
    assert {p.name for p in models.iterdir()} == kept | {"version_A", "version_A.B"}
    assert load_weights(other) and load_weights(models / "version_A")


@pytest.mark.parametrize("umask, mode", [(0o077, 0o700), (0o022, 0o755)])
def test_the_release_folder_honours_the_umask(tmp_path, umask, mode):
    make_fake_run(tmp_path / "run")
    old = os.umask(umask)
    try:
        path = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    finally:
        os.umask(old)
    assert path.resolve().stat().st_mode & 0o777 == mode
    assert (path / "config.yaml").stat().st_mode & 0o777 == mode & 0o666


def test_damaged_release_files_are_named(tmp_path):
    from resnet_native.formats.release_folder import load_release_config

    make_fake_run(tmp_path / "run")
    folder = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False).resolve()
    (folder / "config.yaml").write_text("model: [unclosed")
    with pytest.raises(ValueError, match="config.yaml: not a valid YAML"):
        load_release_config(folder)
    (folder / "config.yaml").write_text("- a list\n")
    with pytest.raises(ValueError, match="config.yaml: expected a mapping"):
        load_release_config(folder)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors"):
        load_weights(folder)
    # An older release's model.npz whose member's header claims more than it stores: refused before it is read.
    (folder / "model.safetensors").unlink()
    np.savez(folder / "model.npz", w=np.zeros(4, np.float32))
    data = (folder / "model.npz").read_bytes().replace(b"(4,)", b"(9,)", 1)
    (folder / "model.npz").write_bytes(data)
    with pytest.raises(ValueError, match="model.npz"):
        load_weights(folder)


def test_release_replaces_without_a_window_and_fsyncs(tmp_path, monkeypatch):
    from resnet_native.release.classifier import CIFAR10Classifier

    make_fake_run(tmp_path / "run")
    models = tmp_path / "models"
    release.release(tmp_path / "run", "A", models, benchmark=False)
    final = models / "version_A"
    old_folder = final.resolve()

    def always_published(real):
        def call(src, dst, *a, **k):
            # Every rename/replace of the publication: a reader must find a whole release at version_A throughout.
            assert (final / "config.yaml").is_file(), f"version_A missing while moving {src} -> {dst}"
            return real(src, dst, *a, **k)
        return call

    synced = set()
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.add(os.path.realpath(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "replace", always_published(os.replace))
    monkeypatch.setattr(os, "rename", always_published(os.rename))
    monkeypatch.setattr(os, "fsync", recording_fsync)
    release.release(tmp_path / "run", "A", models, benchmark=False)
    monkeypatch.undo()
    new_folder = assert_published(models)
    assert new_folder.resolve() != old_folder and not old_folder.exists()
    want = {str(p.resolve()) for p in new_folder.iterdir()} | {str(new_folder.resolve()), str(models.resolve())}
    assert want <= synced, f"not fsynced: {sorted(want - synced)}"
    clf = CIFAR10Classifier("A", models_dir=models, model=object())
    assert clf.version_dir == final and clf.config["model"]["name"] == "resnet18"


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_the_release_model_onnx_runs_in_onnxruntime_like_the_host_reference(tmp_path, rng, layout):
    onnx = pytest.importorskip("onnx", reason='needs the onnx package (pip install "resnet_native[onnx]")')
    ort = pytest.importorskip("onnxruntime", reason='needs onnxruntime (pip install "resnet_native[onnx]")')
    make_fake_run(tmp_path / "run", layout=layout, precision="fp16")
    path = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    model = onnx.load(str(path / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    props = {p.key: p.value for p in model.metadata_props}
    assert props["version"] == "A" and props["fold_bn"] == "true" and props["model"] == "resnet18"
    assert "BatchNormalization" not in {n.op_type for n in model.graph.node}
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    # The release's weights on the host in float64, fed what preprocess.py gives with layout='NCHW'.
    images = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    x = normalize_on_host(images, layout="NCHW", dtype="fp32")
    host = rn.ResNet18(num_classes=10, layout="NCHW").to_host(np.float64)
    host.load_state_dict(load_weights(path))
    want = host.eval().forward(x.astype(np.float64))
    session = ort.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {"input": x})[0]
    assert got.shape == (5, 10) and got.dtype == np.float32
    # float32 against float64: within the tolerance tests/test_onnx_export_cpu.py derives.
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()
    np.testing.assert_array_equal(np.argmax(got, axis=1), np.argmax(want, axis=1))


def test_without_onnx_the_release_has_no_model_onnx_and_says_so_once(tmp_path, monkeypatch):
    make_fake_run(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    monkeypatch.setattr(release, "_warned_without_onnx", False)
    with pytest.warns(RuntimeWarning, match=r'no model.onnx \(pip install "resnet_native\[onnx\]" adds it\)'):
        path = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    assert not (path / "model.onnx").exists() and (path / "model.safetensors").is_file()
    assert_published(tmp_path / "models")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second release in the same process: no second warning
        path = release.release(tmp_path / "run", "B", tmp_path / "models", benchmark=False)
    assert not (path / "model.onnx").exists() and load_weights(path)


def test_release_over_a_legacy_folder(tmp_path):
    """A version_X that is a real folder (releases made before the symlink layout) is replaced too."""
    make_fake_run(tmp_path / "run")
    published = release.release(tmp_path / "run", "A", tmp_path / "old", benchmark=False)
    models = tmp_path / "models"
    shutil.copytree(published.resolve(), models / "version_A")
    (models / "version_A" / "stale.txt").write_text("legacy")
    assert not (models / "version_A").is_symlink() and load_weights(models / "version_A")
    path = release.release(tmp_path / "run", "A", models, benchmark=False)
    assert_published(models)
    assert not (path / "stale.txt").exists() and load_weights(path).keys() == load_weights(published).keys()


def test_release_cli(tmp_path, capsys):
    make_fake_run(tmp_path / "run")
    path = release.main(["--run", str(tmp_path / "run"), "--version", "A", "--out", str(tmp_path / "m"),
                         "--no-benchmark"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["release"] == str(path) and line["test_accuracy"] == pytest.approx(0.6)
    with pytest.raises(SystemExit):
        release.main(["--version", "A"])  # --run is required


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_preprocess_py_is_standalone_and_matches_the_package(tmp_path, rng, layout):
    from PIL import Image

    make_fake_run(tmp_path / "run", layout=layout)
    path = release.release(tmp_path / "run", "A-1.2_b", tmp_path / "models", benchmark=False)
    images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    Image.fromarray(images[1]).save(tmp_path / "one.png")
    np.save(tmp_path / "images.npy", images)
    # A fresh interpreter that can import only the release folder (plus NumPy/Pillow), not resnet_native.
    script = (
        "import sys, numpy as np; sys.path[:0] = [sys.argv[1]]; import preprocess as p\n"
        "assert 'resnet_native' not in sys.modules\n"
        "imgs = np.load(sys.argv[2])\n"
        "np.save(sys.argv[3], p.preprocess([imgs[0], sys.argv[4], imgs[2], imgs[3]]))\n"
        "np.save(sys.argv[5], p.preprocess(imgs, dtype=np.float16))\n"
        "print(p.LAYOUT, len(p.CLASSES), p.VERSION)\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", script, str(path), str(tmp_path / "images.npy"),
                          str(tmp_path / "a.npy"), str(tmp_path / "one.png"), str(tmp_path / "b.npy")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [layout, "10", "A-1.2_b"]
    assert (path / "preprocess.py").read_text() == release.PREPROCESS_PY  # the same fixed file in every release
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), normalize_on_host(images, layout=layout, dtype="fp32"))
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), normalize_on_host(images, layout=layout, dtype="fp16"))


CRAFTED_VERSIONS = [
    'x"""\nimport os; os.system("touch pwned")\n"""',  # closes the docstring preprocess.py once had
    "x'''; raise SystemExit('''",
    'A" + __import__("os").getcwd() + "',
    "A\nB", "A B", "A;B", "A\x00", "\u00e9",
]


@pytest.mark.parametrize("version", CRAFTED_VERSIONS)
def test_crafted_versions_are_refused_and_never_reach_code(tmp_path, version, monkeypatch):
    make_fake_run(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="version: expected a plain name"):
        release.release(tmp_path / "run", version, tmp_path / "models", benchmark=False)
    assert not (tmp_path / "models").exists() or not list((tmp_path / "models").iterdir())
    # The version only ever travels as data: preprocess.py is one fixed text, which reads preprocess.json.
    assert "{version" not in release.PREPROCESS_PY and "preprocess.json" in release.PREPROCESS_PY


def test_preprocess_py_runs_no_value_as_code(tmp_path):
    """Even a preprocess.json holding code-like text (the checks above keep versions plain) is only data."""
    make_fake_run(tmp_path / "run")
    path = release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False).resolve()
    values = json.loads((path / "preprocess.json").read_text())
    values["version"] = CRAFTED_VERSIONS[0]
    (path / "preprocess.json").write_text(json.dumps(values))
    script = "import sys; sys.path[:0] = [sys.argv[1]]; import preprocess as p; print(repr(p.VERSION))"
    out = subprocess.run([sys.executable, "-I", "-c", script, str(path)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr(CRAFTED_VERSIONS[0]) and not (tmp_path / "pwned").exists()


def _random_cifar(n_train: int):
    from resnet_native.data.cifar10 import CIFAR10Data

    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (n_train, 32, 32, 3), dtype=np.uint8)
    return CIFAR10Data(images, (np.arange(n_train) % 10).astype(np.int32), images[:2], np.zeros(2, np.int32),
                       source="random")


def test_an_int8_release_carries_its_calibration_and_the_classifier_uses_it(tmp_path):
    from resnet_native.inference.simulate import simulate_logits
    from resnet_native.quantization import load_calibration
    from resnet_native.release.classifier import CIFAR10Classifier

    make_fake_run(tmp_path / "run", precision="fp32", layout="NCHW")
    data = _random_cifar(8)
    path = release.release(tmp_path / "run", "Q", tmp_path / "models", benchmark=False, quantize=["int8"],
                           data=data, calibration_images=3, holdout_images=3, calibrate_on="host")
    cal = load_calibration(path / "calibration_int8.json")
    assert cal.dtype == "int8" and cal.method in ("max", "percentile", "entropy")
    report = json.loads((path / "metrics.json").read_text())["quantization"]["int8"]
    assert report["method"] == cal.method and set(report["methods"]) == {"max", "percentile", "entropy"}
    assert report["calibration_images"] == 3 and report["holdout_images"] == 3 and report["device"] == "host"
    with pytest.raises(ValueError, match="calibrate_on"):
        release.release(tmp_path / "run", "Q2", tmp_path / "models", benchmark=False, quantize=["int8"], data=data,
                        calibrate_on="tpu")
    for figures in report["methods"].values():
        assert 0.0 <= figures["accuracy"] <= 1.0 and 0.0 <= figures["agreement"] <= 1.0
        assert 0.0 < figures["logit_error"] < 1.0  # quantisation moves the logits, by less than their size
    rank = lambda f: (f["accuracy"], f["agreement"], -f["logit_error"])  # noqa: E731
    best = report["methods"][cal.method]
    assert all(rank(best) >= rank(f) for f in report["methods"].values())
    images = data.train_images[:2]
    x = normalize_on_host(images, layout="NCHW", dtype="fp32")
    want = simulate_logits(load_weights(path), x, cal)
    if rn.cuda_available():  # the int8 engine, whose arithmetic the simulation defines (test_quantized_conv_gpu)
        clf = CIFAR10Classifier(path, precision="int8")
        assert clf.backend == "engine-int8"
        got = clf.logits(images)
        assert np.linalg.norm(got - want) <= 5e-2 * np.linalg.norm(want)
    else:
        with pytest.warns(RuntimeWarning, match="int8 arithmetic runs simulated on the host"):
            clf = CIFAR10Classifier(path, precision="int8")
        assert clf.backend == "int8-simulated"
        np.testing.assert_allclose(clf.logits(images), want.astype(np.float32), rtol=0, atol=0)
    # A float prefix: the stem, layer1 and layer2 in float, then 8-bit, as the engine and the simulation agree.
    want = simulate_logits(load_weights(path), x, cal, quantize_from="layer3")
    if rn.cuda_available():
        clf = CIFAR10Classifier(path, precision="int8", quantize_from="layer3")
        assert clf.engine.quantize_from == "layer3"
        assert np.linalg.norm(clf.logits(images) - want) <= 5e-2 * np.linalg.norm(want)
    else:
        with pytest.warns(RuntimeWarning, match="simulated"):
            clf = CIFAR10Classifier(path, precision="int8", quantize_from="layer3")
        np.testing.assert_allclose(clf.logits(images), want.astype(np.float32), rtol=0, atol=0)
        with pytest.raises(ValueError, match="'auto' chooses by timing the GPU engine"):
            CIFAR10Classifier(path, precision="int8", quantize_from="auto")
    with pytest.raises(ValueError, match="quantize_from: only an int8 / fp8 classifier"):
        CIFAR10Classifier(path, quantize_from="layer3")
    with pytest.raises(ValueError, match="quantize_from: expected one of"):
        CIFAR10Classifier(path, precision="int8", quantize_from="layer9")
    with pytest.raises(ValueError, match="quantized_kernels: expected one of 'auto', 'cudnn', 'own', got 'mine'"):
        CIFAR10Classifier(path, precision="int8", quantized_kernels="mine")
    with pytest.raises(FileNotFoundError, match="this release has no fp8 calibration; make one with"):
        CIFAR10Classifier(path, precision="fp8")
    with pytest.raises(ValueError, match="precision: expected one of 'int8', 'fp8', got 'int4'"):
        CIFAR10Classifier(path, precision="int4")


def test_release_quantize_arguments_are_checked(tmp_path, capsys):
    make_fake_run(tmp_path / "run")
    with pytest.raises(ValueError, match="data: calibrating for int8 needs the training set"):
        release.release(tmp_path / "run", "Q", tmp_path / "models", benchmark=False, quantize="int8")
    with pytest.raises(ValueError, match="quantize: expected one of 'int8', 'fp8', got 'int4'"):
        release.release(tmp_path / "run", "Q", tmp_path / "models", benchmark=False, quantize=["int4"], data="x")
    with pytest.raises(ValueError, match=r"calibration_images \+ holdout_images: 5 \+ 5 exceeds the 8 training"):
        release.release(tmp_path / "run", "Q", tmp_path / "models", benchmark=False, quantize=["fp8"],
                        data=_random_cifar(8), calibration_images=5, holdout_images=5)
    with pytest.raises(SystemExit):
        release.main(["--run", str(tmp_path / "run"), "--version", "Q", "--int8", "--no-benchmark"])
    assert "--int8: pass --data" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("gpu", [False, True])
def test_auto_calibrates_on_the_gpu_when_there_is_one(tmp_path, monkeypatch, gpu):

    make_fake_run(tmp_path / "run", precision="fp32", layout="NCHW")
    seen = []
    monkeypatch.setattr(release, "cuda_available", lambda: gpu)
    monkeypatch.setattr(release, "calibrate_release", lambda *a: seen.append(a[-1]) or ({}, {}))
    release.release(tmp_path / "run", "Q", tmp_path / "models", benchmark=False, quantize=["int8"],
                    data=_random_cifar(8))
    assert seen == ["gpu" if gpu else "host"]


def test_the_quant_accuracy_tool_compares_every_calibrated_backend_with_the_float_one(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    import quant_accuracy

    make_fake_run(tmp_path / "run", precision="fp32", layout="NCHW")
    data = _random_cifar(8)
    path = release.release(tmp_path / "run", "Q", tmp_path / "models", benchmark=False, quantize=["int8"],
                           data=data, calibration_images=3, holdout_images=3, calibrate_on="host")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU backends say they are slow
        report = quant_accuracy.evaluate(path, data, ("int8",), limit=2, quantize_from=("stem", "layer3"),
                                         kernels=("auto", "own"))
    assert report["images"] == 2
    assert set(report["results"]) == {"float", "int8", "int8:own", "int8@layer3", "int8@layer3:own"}
    assert report["results"]["int8@layer3"]["quantize_from"] == "layer3"
    assert report["results"]["int8:own"]["quantized_kernels"] == "own"
    with pytest.raises(ValueError, match="--quantized-kernels: expected one of"):
        quant_accuracy.main(["--release", str(path), "--data", "unused", "--quantized-kernels", "fast"])
    with pytest.raises(ValueError, match="--quantize-from: expected one of"):
        quant_accuracy.main(["--release", str(path), "--data", "unused", "--quantize-from", "stem,layer9"])
    int8 = report["results"]["int8"]
    assert 0.0 <= int8["agreement"] <= 1.0
    assert int8["gap_points"] == pytest.approx(100 * (report["results"]["float"]["accuracy"] - int8["accuracy"]))
