"""CIFAR10Classifier's input forms and outputs, with a stub network standing in for the GPU model; without a GPU,
its onnxruntime and NumPy backends against the float64 host forward of the release's weights."""

import re
import shutil
import sys
import warnings

import numpy as np
import pytest
from PIL import Image
from test_release_cpu import make_fake_run

import resnet_native as rn
from resnet_native.data.augment import normalize_on_host
from resnet_native.data.cifar10 import CLASSES
from resnet_native.formats.release_folder import load_weights
from resnet_native.release import build as release
from resnet_native.release.classifier import CIFAR10Classifier, softmax, to_batch


class StubNet:
    """Logits = a fixed linear map of each image's mean normalised colour; records what it was given."""

    def __init__(self, seed=0):
        self.w = np.random.default_rng(seed).standard_normal((3, 10)).astype(np.float32) * 5
        self.inputs = []
        self._buffer = None

    def forward(self, x, train=None, *, copy=True):
        assert train is False
        x = x.get() if hasattr(x, "get") else np.asarray(x)  # the classifier hands cupy arrays over on a GPU
        self.inputs.append(x)
        logits = x.astype(np.float32).mean(axis=(1, 2)) @ self.w  # NHWC
        if copy:
            return logits
        # Like the model's own buffer, rewritten by the next call: the classifier must copy what it keeps.
        if self._buffer is None or self._buffer.shape != logits.shape:
            self._buffer = np.empty_like(logits)
        self._buffer[...] = logits
        return self._buffer


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    make_fake_run(root / "run")
    return release.release(root / "run", "A", root / "cifar10_models", benchmark=False)


@pytest.fixture
def clf(release_dir):
    return CIFAR10Classifier("A", models_dir=release_dir.parent, model=StubNet(), batch_size=3)


def expected(images, net=None):
    net = net or StubNet()
    return net.forward(normalize_on_host(np.asarray(images), layout="NHWC", dtype="fp16"), train=False)


def test_single_image_forms_agree(clf, rng, tmp_path):
    img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(img).save(tmp_path / "x.png")
    want = int(np.argmax(expected(img[None])[0]))
    for form in (img, Image.fromarray(img), str(tmp_path / "x.png"), tmp_path / "x.png"):
        got = clf.predict(form)
        assert isinstance(got, int) and got == want
    p = clf.predict_proba(img)
    assert p.shape == (10,) and p.dtype == np.float32 and p.sum() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(p, softmax(expected(img[None])[0]), rtol=1e-6)
    # The network saw exactly the trainer's normalisation (fp16 model: the fp16 lookup table), in NHWC.
    x = clf.model.inputs[-1]
    assert x.dtype == np.float16 and x.shape == (1, 32, 32, 3)
    np.testing.assert_array_equal(x, normalize_on_host(img[None], layout="NHWC", dtype="fp16"))


def test_batches(clf, rng):
    imgs = rng.integers(0, 256, (7, 32, 32, 3), dtype=np.uint8)
    want = np.argmax(expected(imgs), axis=1)
    from_array = clf.predict(imgs)
    assert isinstance(from_array, np.ndarray) and from_array.dtype == np.int64 and from_array.shape == (7,)
    np.testing.assert_array_equal(from_array, want)
    np.testing.assert_array_equal(clf.predict([Image.fromarray(i) for i in imgs]), want)
    np.testing.assert_array_equal(clf.predict(list(imgs)), want)
    assert [len(x) for x in clf.model.inputs[-3:]] == [3, 3, 1]  # batch_size=3
    proba = clf.predict_proba(imgs)
    assert proba.shape == (7, 10)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-6)
    assert clf.predict([]).shape == (0,)


def test_other_sizes_and_modes_are_converted(clf, rng):
    big = Image.fromarray(rng.integers(0, 256, (64, 48, 3), dtype=np.uint8))
    clf.predict(big)
    np.testing.assert_array_equal(clf.model.inputs[-1],
                                  normalize_on_host(np.asarray(big.resize((32, 32), Image.Resampling.BILINEAR))[None],
                                                    dtype="fp16"))
    gray = rng.integers(0, 256, (32, 32), dtype=np.uint8)
    clf.predict(gray)
    np.testing.assert_array_equal(clf.model.inputs[-1], normalize_on_host(np.stack([gray] * 3, -1)[None],
                                                                         dtype="fp16"))  # grey -> R = G = B
    rgba = rng.integers(0, 256, (32, 32, 4), dtype=np.uint8)
    assert isinstance(clf.predict(rgba), int)
    assert to_batch(Image.fromarray(rgba[..., :3]).convert("P"))[0].shape == (1, 32, 32, 3)


def test_bad_inputs(clf):
    with pytest.raises(TypeError, match="uint8"):
        clf.predict(np.zeros((32, 32, 3), np.float32))
    with pytest.raises(ValueError, match="HWC"):
        clf.predict(np.zeros((3, 32, 32, 5), np.uint8)[0])
    with pytest.raises(TypeError, match="PIL image"):
        clf.predict(12)
    with pytest.raises(FileNotFoundError):
        clf.predict("/no/such/image.png")


def test_versions_paths_and_attributes(release_dir):
    by_path = CIFAR10Classifier(release_dir, model=StubNet())
    by_name = CIFAR10Classifier("A", models_dir=release_dir.parent, model=StubNet())
    assert by_path.version_dir == by_name.version_dir == release_dir
    assert by_name.classes == CLASSES and by_name.classes[3] == "cat"
    assert (by_name.layout, by_name.precision) == ("NHWC", "fp16")
    with pytest.raises(FileNotFoundError, match="version_A"):
        CIFAR10Classifier("Z", models_dir=release_dir.parent, model=StubNet())
    assert rn.CIFAR10Classifier is CIFAR10Classifier
    assert by_path.backend == "model" and by_path.session is None and "backend='model'" in repr(by_path)


def test_a_class_list_that_does_not_fit_the_model_is_refused(release_dir, tmp_path):
    import shutil

    import yaml

    folder = tmp_path / "version_X"
    shutil.copytree(release_dir.resolve(), folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["classes"] = config["classes"][:9]
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="config.yaml: 9 class names for a model of 10 classes"):
        CIFAR10Classifier(folder, model=StubNet())


def test_models_dir_from_environment(release_dir, monkeypatch):
    monkeypatch.setenv("RESNET_NATIVE_MODELS", str(release_dir.parent))
    assert CIFAR10Classifier("A", model=StubNet()).version_dir == release_dir


@pytest.mark.parametrize("dtype", [None, "int8"])
def test_on_a_gpu_the_engine_gets_the_algorithm_cache(release_dir, tmp_path, monkeypatch, dtype):
    """The engine keeps its conv algorithms and quantize_from='auto''s choice in that file (InferenceEngine)."""
    import resnet_native.inference
    import resnet_native.inference.source

    built = []

    class FakeEngine:
        def __init__(self, folder, **kwargs):
            built.append(kwargs)
            self.quantize_from = "layer2" if kwargs.get("quantize_from") == "auto" else kwargs.get("quantize_from")

    monkeypatch.setattr(resnet_native.release.classifier, "cuda_available", lambda: True)
    monkeypatch.setattr(resnet_native.release.classifier, "InferenceEngine", FakeEngine)
    monkeypatch.setattr(resnet_native.release.classifier, "release_calibration", lambda *a: "calibration")
    path = tmp_path / "algos.json"
    extra = {} if dtype is None else {"precision": dtype, "quantize_from": "auto"}
    clf = CIFAR10Classifier(release_dir, algorithm_cache=path, **extra)
    assert built[-1]["algorithm_cache"] == path and clf.algorithm_cache == path
    assert clf.backend == ("engine" if dtype is None else "engine-int8")
    if dtype is not None:
        assert clf.quantize_from == "layer2" and built[-1]["calibration"] == "calibration"
    CIFAR10Classifier(release_dir, **extra)
    assert built[-1]["algorithm_cache"] is None


def test_serving_does_not_import_the_trainer_or_the_release_builder(tmp_path):
    from conftest import run_child

    script = ("import sys, resnet_native\n"
              "from resnet_native.release.classifier import CIFAR10Classifier\n"
              "print(sorted(m for m in sys.modules\n"
              "             if m.startswith(('resnet_native.train', 'resnet_native.release.build'))))")
    stdout = run_child(script, tmp_path)
    assert stdout.strip() == "[]"


# ----------------------------------------------------------------------------------------------------------------
# Without a GPU: onnxruntime when it is installed, else the NumPy reference ops

# onnxruntime's float32 against the float64 host forward, relative to the largest logit: the bound
# tests/test_onnx_export_cpu.py derives (measured here 7e-7).
ORT_RTOL = 2e-5
WARNINGS = {
    "onnxruntime": r"^CIFAR10Classifier: no CUDA GPU \(.*\); the model runs on the CPU through onnxruntime, which is "
                   r"slower than a GPU$",
    "numpy": r"^CIFAR10Classifier: no CUDA GPU \(.*\); the model runs on the host through the NumPy reference ops, "
             r"which is much slower than a GPU, and than onnxruntime \(pip install \"resnet_native\[onnx\]\"\)$",
}


@pytest.fixture
def no_gpu():
    if rn.cuda_available():
        pytest.skip("a GPU is present: the release is served by its InferenceEngine (tests/test_release_gpu.py)")


def use_backend(backend, monkeypatch):
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime", reason='needs onnxruntime (pip install "resnet_native[onnx]")')
    else:
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError


def host_logits(release_dir, images):
    """The release's weights in a float64 host ResNet-18, fed the normalised batch (NCHW float32, as onnxruntime)."""
    net = rn.ResNet18(num_classes=10, layout="NCHW").to_host(np.float64)
    net.load_state_dict(load_weights(release_dir))
    return net.eval().forward(normalize_on_host(images, layout="NCHW", dtype="fp32").astype(np.float64))


def quiet_classifier(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return CIFAR10Classifier(*args, **kwargs)


@pytest.fixture(scope="module")
def fp32_release_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models32")
    make_fake_run(root / "run", precision="fp32")
    return release.release(root / "run", "F", root / "cifar10_models", benchmark=False)


@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
def test_without_a_gpu_the_release_runs_on_the_cpu_and_says_so_once(release_dir, rng, monkeypatch, no_gpu, backend):
    use_backend(backend, monkeypatch)
    images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf = CIFAR10Classifier("A", models_dir=release_dir.parent, batch_size=2)
        logits = clf.logits(images)
        single = clf.predict(images[0])
        proba = clf.predict_proba(images)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages  # once per classifier, however often it predicts
    assert re.match(WARNINGS[backend], messages[0]), messages[0]
    assert clf.backend == backend and clf.engine is None and f"backend={backend!r}" in repr(clf)
    assert logits.shape == (3, 10) and logits.dtype == np.float32
    assert single == int(np.argmax(logits[0])) and isinstance(single, int)
    np.testing.assert_allclose(proba, softmax(logits), rtol=1e-6)
    if backend == "numpy":
        assert clf.session is None and clf.model.placement is not None and not clf.model.placement.on_gpu
        # The release's network built on the host by hand, fed the normalised batch in its layout and precision.
        net = rn.ResNet18(num_classes=10, stem="cifar", layout="NHWC", precision="fp16").to_host(np.float32)
        net.load_state_dict(load_weights(release_dir))
        np.testing.assert_array_equal(logits, net.eval().forward(normalize_on_host(images, layout="NHWC",
                                                                                  dtype="fp16")))
    else:
        assert clf.model is None and clf.session is not None
        x, _ = clf.preprocess(images)  # the session reads the normalised batch in NCHW float32
        np.testing.assert_array_equal(x, normalize_on_host(images, layout="NCHW", dtype="fp32"))
        want = host_logits(release_dir, images)
        assert np.abs(logits - want).max() <= ORT_RTOL * np.abs(want).max()


@pytest.mark.parametrize(("which", "rtol"), [("fp32", 4e-5), ("fp16", 1e-2)])
def test_the_onnxruntime_and_numpy_backends_agree(release_dir, fp32_release_dir, rng, monkeypatch, no_gpu, which,
                                                  rtol):
    """The NumPy backend runs an fp16 release as it was trained (fp16 activations, measured 1.1e-3 of the logits'
    size from float64), onnxruntime in float32 (7e-7): they agree to that rounding, and an fp32 release to float32's."""
    pytest.importorskip("onnxruntime", reason='needs onnxruntime (pip install "resnet_native[onnx]")')
    folder = fp32_release_dir if which == "fp32" else release_dir
    fast = quiet_classifier(folder, batch_size=4)
    use_backend("numpy", monkeypatch)
    slow = quiet_classifier(folder, batch_size=4)
    assert (fast.backend, slow.backend) == ("onnxruntime", "numpy")
    images = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    a, b = fast.logits(images), slow.logits(images)
    scale = np.abs(host_logits(folder, images)).max()
    assert a.shape == b.shape == (6, 10) and np.abs(a - b).max() <= rtol * scale
    # Predictions agree wherever the two best logits are further apart than the backends can differ.
    top2 = np.sort(a, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * rtol * scale
    assert clear.sum() >= 3
    np.testing.assert_array_equal(fast.predict(images)[clear], slow.predict(images)[clear])
    if clear[0]:
        assert fast.predict(images[0]) == slow.predict(images[0])


def test_a_release_without_model_onnx_is_exported_in_memory(release_dir, tmp_path, rng, monkeypatch, no_gpu):
    pytest.importorskip("onnxruntime", reason='needs onnxruntime (pip install "resnet_native[onnx]")')
    pytest.importorskip("onnx", reason='needs onnx (pip install "resnet_native[onnx]")')
    copy = tmp_path / "version_A"
    shutil.copytree(release_dir.resolve(), copy)
    (copy / "model.onnx").unlink()
    images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    clf = quiet_classifier(copy)
    assert clf.backend == "onnxruntime" and not (copy / "model.onnx").exists()  # the release is only read
    np.testing.assert_allclose(clf.logits(images), quiet_classifier(release_dir).logits(images), rtol=1e-6,
                               atol=1e-6)
    monkeypatch.setitem(sys.modules, "onnx", None)  # onnxruntime alone cannot export: the NumPy reference serves
    assert quiet_classifier(copy).backend == "numpy"


def test_a_model_onnx_that_does_not_fit_the_release_is_refused(release_dir, tmp_path, no_gpu):
    pytest.importorskip("onnxruntime", reason='needs onnxruntime (pip install "resnet_native[onnx]")')
    copy = tmp_path / "version_A"
    shutil.copytree(release_dir.resolve(), copy)
    for kwargs in ({"dynamic_batch": False}, {"image_size": 64}):
        rn.export_onnx(copy, copy / "model.onnx", **kwargs)
        with pytest.raises(ValueError, match=r"model.onnx: expected a float input 'input' \(batch, 3, 32, 32\)"):
            quiet_classifier(copy)
