"""Package a trained run as a model release: `python -m resnet_native.release --run runs/NAME --version A`.

Writes <out>/version_<X>/ (default out: cifar10_models): model.safetensors (torchvision names and shapes),
model.onnx (onnx_export.py; left out with a warning without the onnx package), config.yaml, metrics.json (accuracy,
training time, parameters, this GPU's inference throughput unless --no-benchmark), preprocess.py + preprocess.json
(standalone NumPy + Pillow preprocessing, the same file in every release), and with --int8 / --fp8
calibration_<dtype>.json (the method chosen by held-out accuracy). formats/release_folder.py reads the folder.
The version is a plain name (VERSION_PATTERN) and, like every value, only ever written as data, never into code.
The folder is built and fsynced under a hidden name, then published by os.replace of the version_<X> symlink
(_publish), so a reader sees the old release or the new one, never half of one nor none.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

from .._core.files import current_umask
from .._core.names import choice, whole_number
from .._core.runtime import cuda_available
from ..data.augment import MEAN, STD, normalize_on_host
from ..data.cifar10 import CLASSES, CIFAR10Data, load_cifar10
from ..formats.checkpoint import load_checkpoint
from ..formats.release_folder import calibration_file, check_release_config, preprocess_values  # noqa: F401  (re-exported)
from ..inference import InferenceEngine
from ..inference.calibration_choice import choose_calibrations
from ..nn.models.registry import model_from_spec, model_spec, rename_legacy_keys
from ..quantization.calibration import QUANT_DTYPES
from ..quantization.calibration_file import save_calibration
from .onnx_export import INSTALL_HINT, export_onnx, import_onnx

_NOT_PARAMETERS = ("running_mean", "running_var", "num_batches_tracked")
WEIGHTS_FILE = "model.safetensors"
ONNX_FILE = "model.onnx"
_warned_without_onnx = False  # the missing onnx package is reported once per process, not once per release
CALIBRATE_ON = ("auto", "host", "gpu")  # where a release's calibration forwards run; auto: gpu when there is one
CALIBRATION_SEED = 0  # the training-set slices a calibration uses: the same for every release

# A release name: a letter or digit, then up to 63 letters, digits, '.', '_' or '-' (no path separators, not hidden).
VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# The standalone preprocess.py, the same in every release: it reads the release's values from preprocess.json.
PREPROCESS_PY = '''"""Preprocessing for a CIFAR-10 model release (standalone: NumPy and Pillow only).

    from preprocess import preprocess, CLASSES
    x = preprocess(["cat.png", pil_image, hwc_uint8_array])   # (N, 32, 32, 3) float32 for an NHWC model

The release's values (VERSION, CLASSES, MEAN, STD, LAYOUT) are read from preprocess.json beside this file. Each
image is converted to RGB, resized to 32x32 (bilinear) if needed, scaled to [0, 1], and normalised per channel with
the training set's mean and standard deviation (computed in float64, rounded once to `dtype`).
"""

import json
import os

import numpy as np

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "preprocess.json"), encoding="utf-8") as _f:
    _RELEASE = json.load(_f)

VERSION = str(_RELEASE["version"])
MEAN = tuple(float(v) for v in _RELEASE["mean"])
STD = tuple(float(v) for v in _RELEASE["std"])
CLASSES = tuple(str(c) for c in _RELEASE["classes"])
LAYOUT = str(_RELEASE["layout"])  # the model's input layout: NHWC -> (N, H, W, 3), NCHW -> (N, 3, H, W)
SIZE = (32, 32)


def load_image(image):
    """A PIL image, a path, or an (H, W, 3) uint8 array -> uint8 (32, 32, 3) RGB array."""
    from PIL import Image

    if isinstance(image, (str, os.PathLike)):
        with Image.open(image) as im:
            return load_image(im.convert("RGB"))
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise TypeError("image: expected a uint8 array, got %s" % image.dtype)
        if image.shape == (SIZE[1], SIZE[0], 3):
            return np.ascontiguousarray(image)
        image = Image.fromarray(image)
    im = image.convert("RGB")
    if im.size != SIZE:
        im = im.resize(SIZE, Image.Resampling.BILINEAR)
    return np.asarray(im, dtype=np.uint8)


def preprocess(images, layout=LAYOUT, dtype=np.float32):
    """One image or a list of them (or an (N, 32, 32, 3) uint8 array) -> normalised (N, ...) array of dtype."""
    if isinstance(images, np.ndarray) and images.ndim == 4:
        batch = np.stack([load_image(im) for im in images])
    elif isinstance(images, (list, tuple)):
        batch = np.stack([load_image(im) for im in images])
    else:
        batch = load_image(images)[None]
    x = (batch.astype(np.float64) / 255.0 - np.asarray(MEAN)) / np.asarray(STD)
    if layout == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x.astype(dtype))
'''


def check_version(version) -> str:
    """The release name, or a ValueError: it names a folder and is written into the release's files."""
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise ValueError(f"version: expected a plain name like 'A' (a letter or digit, then up to 63 letters, "
                         f"digits, '.', '_' or '-'), got {version!r}")
    return version


def count_parameters(weights: dict) -> int:
    """Trainable parameters in a state_dict (batch-norm running statistics excluded)."""
    return int(sum(v.size for k, v in weights.items() if not k.endswith(_NOT_PARAMETERS)))


def _train_throughput(history):
    seconds = sum(r.get("epoch_time_s") or 0.0 for r in history)
    images = sum((r.get("images_per_s") or 0.0) * (r.get("epoch_time_s") or 0.0) for r in history)
    return images / seconds if seconds > 0 else None


def _run_wall_time(run_dir):
    """The training command's wall time from the run's summary.json (None while the run is unfinished)."""
    try:
        summary = json.loads((pathlib.Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary.get("wall_time_s") if summary.get("completed") else None


def find_checkpoint(run_dir, which: str = "best") -> pathlib.Path:
    run = pathlib.Path(run_dir)
    order = ["best.npz", "last.npz"] if which == "best" else ["last.npz"]
    for name in order:
        if (run / name).is_file():
            return run / name
    raise FileNotFoundError(f"{run}: no {' or '.join(order)} (is it a resnet_native.train run folder?)")


def save_weights(weights: dict, folder) -> None:
    """Write the state_dict to folder/model.safetensors."""
    from safetensors.numpy import save_file

    # np.require keeps 0-d arrays (num_batches_tracked) 0-d, unlike np.ascontiguousarray.
    weights = {k: np.require(v, requirements="C") for k, v in weights.items()}
    save_file(weights, str(pathlib.Path(folder) / WEIGHTS_FILE), metadata={"format": "resnet_native"})


def measure_inference(config: dict, weights: dict, *, batch_size: int = 1000, iters: int = 20) -> dict:
    """Images/s of the released network served by an InferenceEngine (uint8 pixels in, logits out, one CUDA graph)
    on the current GPU, after warm-up."""
    import cupy

    model = model_from_spec(config["model"])
    model.load_state_dict(weights)
    spec = config["model"]
    rng = np.random.default_rng(0)
    images = cupy.asarray(rng.integers(0, 256, (batch_size, 32, 32, 3), dtype=np.uint8))
    with InferenceEngine(model, batch_sizes=(batch_size,), precision=spec["precision"],
                         layout=spec["layout"]) as engine:
        out = cupy.empty((batch_size, engine.num_classes), dtype=np.float32)
        for _ in range(3):
            engine(images, out=out)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(iters):
            engine(images, out=out)
        stop.record()
        stop.synchronize()
    seconds = cupy.cuda.get_elapsed_time(start, stop) / 1000.0
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"inference_images_per_s": batch_size * iters / seconds, "inference_batch_size": batch_size,
            "inference_device": name}


def save_onnx(folder: pathlib.Path) -> bool:
    """Write folder/model.onnx, exported from the weights and config.yaml already in the folder. Without the onnx
    package: a warning (once per process) and False."""
    global _warned_without_onnx

    try:
        import_onnx()
    except ImportError:
        if not _warned_without_onnx:
            _warned_without_onnx = True
            warnings.warn(f"release: the onnx package is not installed, so the release has no {ONNX_FILE} "
                          f"({INSTALL_HINT} adds it)", RuntimeWarning, stacklevel=4)
        return False
    export_onnx(folder, folder / ONNX_FILE, fold_bn=True, dynamic_batch=True)
    return True


def _fsync(path) -> None:
    """Flush a file's or a folder's contents (a folder: its entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_dead_builds(final: pathlib.Path) -> None:
    """Delete the hidden .version_<X>.* folders and .link symlinks that a release killed mid-build left beside
    `final`, keeping the folder `final` points at. One release of a version at a time: a second one running
    concurrently would lose its folder under construction."""
    current = os.readlink(final) if final.is_symlink() else None
    # Exactly what _write_release and _publish name: mkdtemp's 8 random characters (+ '.link'), so neither another
    # version's folders (version 'A.B' beside 'A') nor a legacy '.old-' folder ever match.
    made = re.compile(re.escape(f".{final.name}.") + r"[a-z0-9_]{8}(\.link)?")
    for path in final.parent.iterdir():
        if path.name == current or not made.fullmatch(path.name):
            continue
        if path.is_symlink():
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _publish(final: pathlib.Path, folder: pathlib.Path) -> pathlib.Path | None:
    """Point the symlink `final` at `folder` (a sibling) with one os.replace. Returns the previous release's folder,
    for the caller to delete once the switch is on disk, or None. A version_<X> that is still a real folder (the
    layout before symlinks) is first renamed aside: a short window without version_<X>, that one time."""
    link = folder.with_name(folder.name + ".link")
    os.symlink(folder.name, link)  # relative, so the models folder can be moved or copied whole
    old = None
    try:
        if final.is_symlink():
            target = os.readlink(final)
            # Delete only a folder this function made (never what a hand-made symlink points at).
            if os.sep not in target and target.startswith(f".{final.name}."):
                old = final.with_name(target)
        elif final.exists():
            old = final.with_name(f".{final.name}.old-{int(time.time() * 1e6)}")
            final.rename(old)  # the legacy layout's one window: a folder cannot be replaced by a symlink
        os.replace(link, final)
    except BaseException:
        link.unlink(missing_ok=True)
        if old is not None and not final.exists() and not final.is_symlink():
            old.rename(final)  # put the legacy folder back
        raise
    return old


def release(run_dir, version: str, out_dir="cifar10_models", *, checkpoint: str = "best", benchmark: bool = True,
            bench_batch_size: int = 1000, quantize=(), data=None, calibration_images: int = 512,
            holdout_images: int = 1000, calibrate_on: str = "auto") -> pathlib.Path:
    """Build <out_dir>/version_<version>/ from a training run; returns its path. quantize: dtypes ('int8',
    'fp8') to calibrate for, on `data` (a CIFAR-10 source): calibration_images of the training set calibrate,
    the next holdout_images choose the method. data: a CIFAR-10 source (load_cifar10) or a loaded CIFAR10Data.
    calibrate_on: 'host' (the float64 NumPy forwards: minutes), 'gpu' (fp32 cuDNN: seconds) or 'auto' (gpu when
    one is available; the report's "device" says which ran)."""
    check_version(version)
    quantize = (quantize,) if isinstance(quantize, str) else tuple(quantize)
    quantize = tuple(dict.fromkeys(choice("quantize", q, QUANT_DTYPES) for q in quantize))
    if quantize and data is None:
        raise ValueError(f"data: calibrating for {', '.join(quantize)} needs the training set (a CIFAR-10 source)")
    calibrate_on = choice("calibrate_on", calibrate_on, CALIBRATE_ON)
    if calibrate_on == "auto":
        calibrate_on = "gpu" if cuda_available() else "host"
    ckpt_path = find_checkpoint(run_dir, checkpoint)
    state = load_checkpoint(ckpt_path)
    weights = {k: np.asarray(v) for k, v in released_weights(state).items()}
    config = release_config(state, version, run_name=pathlib.Path(run_dir).resolve().name,
                            checkpoint_name=ckpt_path.name)
    # The schema every backend reads a release with, checked before anything is written.
    check_release_config(config, f"{ckpt_path} (the release's config.yaml)")
    metrics = release_metrics(state, version, weights, run_dir)
    if benchmark:
        if cuda_available():
            metrics.update(measure_inference(config, weights, batch_size=bench_batch_size))
        else:
            print("release: no GPU, inference_images_per_s left null", file=sys.stderr)
    calibrations = {}
    if quantize:
        calibrations, metrics["quantization"] = calibrate_release(
            weights, config["model"]["stem"], data, quantize, calibration_images, holdout_images, calibrate_on)
    return _write_release(pathlib.Path(out_dir), version, config, metrics, weights, calibrations)


def calibrate_release(weights: dict, stem: str, data, dtypes, calibration_images: int, holdout_images: int,
                      calibrate_on: str = "host"):
    """({dtype: Calibration}, {dtype: report}) from two disjoint, seeded slices of the training set of `data`
    (inference.calibration_choice.choose_calibrations)."""
    n_cal = whole_number("calibration_images", calibration_images, 1)
    n_hold = whole_number("holdout_images", holdout_images, 1)
    train = data if isinstance(data, CIFAR10Data) else load_cifar10(data)
    if n_cal + n_hold > len(train.train_images):
        raise ValueError(f"calibration_images + holdout_images: {n_cal} + {n_hold} exceeds the "
                         f"{len(train.train_images)} training images")
    order = np.random.default_rng(CALIBRATION_SEED).permutation(len(train.train_images))
    cal, hold = order[:n_cal], order[n_cal:n_cal + n_hold]

    def images(idx):
        return normalize_on_host(train.train_images[idx], layout="NCHW", dtype="fp32")

    # Batches of 256 on the GPU; 16 keep the float64 host forward's arrays small.
    chosen = choose_calibrations(weights, images(cal), images(hold), train.train_labels[hold], dtypes=dtypes,
                                 stem=stem, device=calibrate_on, batch_size=256 if calibrate_on == "gpu" else 16)
    return {d: c for d, (c, _) in chosen.items()}, {d: r for d, (_, r) in chosen.items()}


def released_weights(state: dict) -> dict:
    """The weights a training state releases: the moving average of a run that kept one (what it evaluated), else
    the trained weights."""
    return state["ema"] if isinstance(state.get("ema"), dict) else state["model"]


def release_config(state: dict, version: str, *, run_name: str, checkpoint_name: str) -> dict:
    """config.yaml of a release of a training state: the network, classes, input normalisation, and where the
    weights come from (the run folder's name, never a path)."""
    recipe = rename_legacy_keys(state["config"])  # an older run's configuration called the precision 'dtype'
    return {
        "version": version,
        "model": model_spec(recipe["model"], layout=recipe["layout"], precision=recipe["precision"]),
        "classes": list(CLASSES),
        "input": {"height": 32, "width": 32, "channels": 3, "order": "RGB", "scale": "1/255",
                  "mean": list(MEAN), "std": list(STD)},
        "weights": WEIGHTS_FILE,
        "training": {"run": run_name, "checkpoint": checkpoint_name, "epoch": int(state["epoch"]) + 1,
                     "recipe": recipe, "weights": "ema" if isinstance(state.get("ema"), dict) else "model"},
    }


def release_metrics(state: dict, version: str, weights: dict, run_dir) -> dict:
    """metrics.json of a release (its inference throughput is added by the benchmark)."""
    metrics = state.get("metrics", {})
    history = metrics.get("history", [])
    epoch = int(state["epoch"]) + 1
    row = next((r for r in history if r.get("epoch") == epoch), {})
    return {
        "version": version,
        "test_accuracy": row.get("test_acc"),
        "test_loss": row.get("test_loss"),
        "test_accuracy_tta": row.get("test_acc_tta"),
        "tta": state["config"].get("tta", "none"),  # the views test_accuracy_tta averaged (data/tta_views.py)
        "epoch": epoch,
        "epochs": state["config"]["epochs"],
        "training_time_s": metrics.get("train_time_s"),
        "train_images_per_s": _train_throughput(history),
        "wall_time_s": _run_wall_time(run_dir),
        "parameters": count_parameters(weights),
        "inference_images_per_s": None,
        "released_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _write_release(root: pathlib.Path, version: str, config: dict, metrics: dict, weights: dict,
                   calibrations=None) -> pathlib.Path:
    """Build the release under a hidden name, fsync it, and publish it as root/version_<version>."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"version_{version}"
    _remove_dead_builds(final)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".version_{version}.", dir=root))
    try:
        save_weights(weights, tmp)
        (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (tmp / "preprocess.json").write_text(json.dumps(preprocess_values(config), indent=2) + "\n")
        (tmp / "preprocess.py").write_text(PREPROCESS_PY)
        for dtype, calibration in (calibrations or {}).items():
            save_calibration(calibration, tmp / calibration_file(dtype))
        save_onnx(tmp)  # last: it reads the weights and config.yaml written above
        for f in tmp.iterdir():
            _fsync(f)
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp's folder is 0o700: give it a new folder's mode
        _fsync(tmp)
        old = _publish(final, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(root)  # the new link; only then is the old release unneeded
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m resnet_native.release",
                                description="Package a resnet_native.train run as cifar10_models/version_X/.")
    p.add_argument("--run", required=True, help="the run folder (holds best.npz / last.npz)")
    p.add_argument("--version", required=True, help="release name, e.g. A")
    p.add_argument("--out", default="cifar10_models", help="models folder (default cifar10_models)")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best", help="which state to ship")
    p.add_argument("--no-benchmark", action="store_true", help="skip the GPU inference measurement")
    p.add_argument("--bench-batch-size", type=int, default=1000)
    p.add_argument("--int8", action="store_true", help="also calibrate for int8 inference (needs --data)")
    p.add_argument("--fp8", action="store_true", help="also calibrate for FP8 E4M3 inference (needs --data)")
    p.add_argument("--data", help="CIFAR-10 source whose training set calibrates (--int8 / --fp8)")
    p.add_argument("--calibration-images", type=int, default=512, help="training images that calibrate")
    p.add_argument("--holdout-images", type=int, default=1000,
                   help="further training images on which the calibration method is chosen")
    p.add_argument("--calibrate-on", choices=CALIBRATE_ON, default="auto",
                   help="where the calibration's forwards run: host (float64 NumPy, minutes), gpu (fp32 cuDNN, "
                        "seconds) or auto (default: gpu when there is one)")
    return p


def main(argv=None) -> pathlib.Path:
    parser = build_parser()
    args = parser.parse_args(argv)
    quantize = [d for d, on in (("int8", args.int8), ("fp8", args.fp8)) if on]
    if quantize and not args.data:
        parser.error(f"--{quantize[0]}: pass --data, the CIFAR-10 source whose training set calibrates")
    path = release(args.run, args.version, args.out, checkpoint=args.checkpoint, benchmark=not args.no_benchmark,
                   bench_batch_size=args.bench_batch_size, quantize=quantize, data=args.data,
                   calibration_images=args.calibration_images, holdout_images=args.holdout_images,
                   calibrate_on=args.calibrate_on)
    print(json.dumps({"release": str(path), **json.loads((path / "metrics.json").read_text())}))
    return path


if __name__ == "__main__":
    main()
