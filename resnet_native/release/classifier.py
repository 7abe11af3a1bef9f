"""CIFAR10Classifier: load a released model (cifar10_models/version_X/) and classify images.

    clf = resnet_native.CIFAR10Classifier(version="A")         # or a path to a version folder
    clf.predict("cat.png")        -> 3                           # PIL image, path, HWC uint8 array
    clf.predict([img1, img2])     -> array([3, 5])               # list, or an (N, 32, 32, 3) uint8 array
    clf.predict_proba(img)        -> (10,) float32 probabilities
    clf.classes                   -> ('airplane', 'automobile', ...)
    CIFAR10Classifier("A", tta="flip")                         # mean logits of each image and its mirror
    CIFAR10Classifier("A", tta="flip-shift")                   # and of their copies shifted a pixel (6 views)

The backend is picked once (clf.backend): on a GPU an InferenceEngine fed the uint8 pixels, whose input stage
normalises through the trainer's lookup table, so the network sees the inputs it was evaluated on bit for bit;
without one onnxruntime on model.onnx (pip install "resnet_native[onnx]"), else the float64 reference ops.
precision='int8' / 'fp8' uses the release's calibration: the quantised engine, or its exact host simulation.
"""

from __future__ import annotations

import os
import pathlib
import warnings

import numpy as np

from .._core.names import choice, precision_argument
from .._core.runtime import cuda_available, device_unavailable_reason
from ..data.augment import normalize_on_host
from ..data.cifar10 import CLASSES
from ..data.tta_views import tta_mode, tta_views, view_images
from ..formats.release_folder import (  # noqa: F401  (re-exported: the classifier's API)
    DEFAULT_MODELS_DIR,
    load_release_config,
    load_weights,
    models_dir_default,
    resolve_version_dir,
)
from ..inference import InferenceEngine
from ..inference.kernel_choice import QUANTIZED_KERNELS
from ..inference.simulate import simulate_logits
from ..inference.source import release_calibration
from ..nn.models.registry import model_from_spec, rename_legacy_keys
from ..quantization.calibration import QUANT_DTYPES
from ..quantization.prefix import AUTO, QUANTIZE_FROM
from .onnx_export import BATCH, INPUT, INSTALL_HINT, OUTPUT, export_onnx, import_onnxruntime

IMAGE_SIZE = (32, 32)


# ----------------------------------------------------------------------------------------------------------------
# Input forms


def load_image(image) -> np.ndarray:
    """A PIL image, a path, or an (H, W, 3) / (H, W) uint8 array -> uint8 (32, 32, 3) RGB."""
    from PIL import Image

    if isinstance(image, str | os.PathLike):
        with Image.open(image) as im:
            return load_image(im.convert("RGB"))
    if isinstance(image, Image.Image):
        im = image.convert("RGB")
        if im.size != IMAGE_SIZE:
            im = im.resize(IMAGE_SIZE, Image.Resampling.BILINEAR)
        return np.asarray(im, dtype=np.uint8)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise TypeError(f"image: expected a uint8 array, got {image.dtype}")
        if image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3, 4)):
            if image.shape[:2] == IMAGE_SIZE and image.ndim == 3 and image.shape[2] == 3:
                return np.ascontiguousarray(image)
            return load_image(Image.fromarray(image.squeeze(-1) if image.ndim == 3 and image.shape[2] == 1
                                              else image))
        raise ValueError(f"image: expected an (H, W, 3) HWC array, got shape {image.shape}")
    raise TypeError(f"image: expected a PIL image, a path, or a uint8 array, got {type(image).__name__}")


def to_batch(images) -> tuple[np.ndarray, bool]:
    """Any accepted input -> (uint8 (N, 32, 32, 3), whether it was a single image)."""
    if isinstance(images, np.ndarray) and images.ndim == 4:
        if images.dtype != np.uint8:
            raise TypeError(f"images: expected a uint8 (N, H, W, 3) array, got {images.dtype}")
        if images.shape[1:] == (*IMAGE_SIZE, 3):
            return np.ascontiguousarray(images), False
        return np.stack([load_image(im) for im in images]), False
    if isinstance(images, list | tuple):
        if not images:
            return np.zeros((0, *IMAGE_SIZE, 3), np.uint8), False
        return np.stack([load_image(im) for im in images]), False
    return load_image(images)[None], True


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return (z / z.sum(axis=-1, keepdims=True)).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------


def build_release_model(config: dict, weights: dict, *, on_host: bool = False):
    """The network described by a release's config.yaml, with its weights, in eval mode: on the GPU, or with
    on_host on the host (float32 masters, the NumPy reference ops)."""
    model = model_from_spec(config["model"])
    if on_host:
        model.to_host(np.float32)
    else:
        model.cuda()
    model.load_state_dict(weights)
    model.eval()
    return model


def onnx_session(folder, num_classes: int):
    """An onnxruntime CPU session of the release in `folder`: its model.onnx, or the graph exported in memory when
    it has none. None when onnxruntime is not installed (or, for a release without model.onnx, onnx). The model is
    checked to take float (N, 3, 32, 32) 'input' and give float (N, num_classes) 'logits' for any N."""
    path = pathlib.Path(folder) / "model.onnx"
    try:
        ort = import_onnxruntime()
        model = str(path) if path.is_file() else export_onnx(folder).SerializeToString()
    except ImportError:  # no onnxruntime, or no onnx to export a release that has no model.onnx
        return None
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    inputs, outputs = session.get_inputs(), session.get_outputs()

    def fits(args, name, shape):  # a symbolic first dimension (a name, or None) serves every batch size
        return (len(args) == 1 and args[0].name == name and args[0].type == "tensor(float)"
                and len(args[0].shape) == len(shape) + 1 and not isinstance(args[0].shape[0], int)
                and list(args[0].shape[1:]) == list(shape))

    if not (fits(inputs, INPUT, (3, *IMAGE_SIZE)) and fits(outputs, OUTPUT, (num_classes,))):
        where = path if path.is_file() else f"the ONNX export of {folder}"
        got = [(a.name, a.type, list(a.shape)) for a in (*inputs, *outputs)]
        raise ValueError(f"{where}: expected a float input {INPUT!r} ({BATCH}, 3, {IMAGE_SIZE[0]}, {IMAGE_SIZE[1]}) "
                         f"and a float output {OUTPUT!r} ({BATCH}, {num_classes}) with a dynamic batch; got {got}")
    return session


DEFAULT_ENGINE_BATCH_SIZES = (1, 8, 32, 256)


class CIFAR10Classifier:
    """A released CIFAR-10 model. version: 'A', 'B', ... (looked up in models_dir, default ./cifar10_models or
    $RESNET_NATIVE_MODELS) or the path of a version folder.

    On a GPU the release is served by an InferenceEngine captured for `engine_batch_sizes` (larger batches run in
    chunks of the largest). Without one, the network runs on the CPU, through onnxruntime when it is installed (the
    release's model.onnx, or the same graph exported in memory, fed normalised NCHW float32), else the NumPy
    reference ops (a warning says which, once; clf.backend: 'engine', 'onnxruntime', 'numpy', 'model', and for
    8-bit 'engine-<precision>' or '<precision>-simulated'). Images that are not 32x32 are converted to RGB and resized
    (bilinear), as the release's preprocess.py does. model: use this
    network instead (for tests or a custom device setup); it must provide forward(x, train=False, copy=False) ->
    logits and is fed normalised batches. precision='int8' / 'fp8': the release's calibration, from quantize_from on
    (InferenceEngine's: 'stem', 'layer1' ... 'layer4', or 'auto', which times them and needs the GPU);
    quantized_kernels: which kernels the int8 engine runs (InferenceEngine's; the host simulation is the own
    kernels' arithmetic).
    algorithm_cache: the engine's cache file (InferenceEngine's: the conv algorithm choices and 'auto''s choice, so
    a classifier made again on the same GPU searches and times nothing); unused without a GPU. tta='flip': the
    mean of the logits of each image and its mirror image; 'flip-shift': those two and their copies shifted a pixel
    diagonally each way, weighted (data/tta_views.py). The engine's, or on the CPU backends one batch a view,
    averaged in NumPy; 2 or 6 times the work, so off by default. dtype: the deprecated name of precision."""

    def __init__(self, version="A", models_dir=None, *, batch_size: int = 1000, model=None,
                 engine_batch_sizes=DEFAULT_ENGINE_BATCH_SIZES, precision=None, quantize_from="stem",
                 algorithm_cache=None, tta=None, quantized_kernels="auto", dtype=None):
        quantized = precision_argument("CIFAR10Classifier", precision, dtype)
        self.tta = tta_mode(tta)
        self.version_dir = resolve_version_dir(version, models_dir)
        # version_X is a symlink that a new release re-points: read config and weights from one release folder.
        folder = self.version_dir.resolve()
        self.config = load_release_config(folder)
        self.classes = tuple(str(c) for c in self.config.get("classes", CLASSES))
        m = rename_legacy_keys(self.config["model"])  # an older release called the precision 'dtype'
        if len(self.classes) != m.get("num_classes", len(self.classes)):
            raise ValueError(f"{folder / 'config.yaml'}: {len(self.classes)} class names for a model of "
                             f"{m['num_classes']} classes")
        self.layout, self.precision = m["layout"], m["precision"]
        self.batch_size = int(batch_size)
        if self.batch_size <= 0:
            raise ValueError(f"batch_size: expected > 0, got {batch_size}")
        self.model, self.engine, self.session, self.calibration = model, None, None, None
        self.quantize_from = choice("quantize_from", quantize_from, QUANTIZE_FROM + (AUTO,))
        self.quantized_kernels = choice("quantized_kernels", quantized_kernels, QUANTIZED_KERNELS)
        if quantized is None and self.quantize_from != "stem":
            raise ValueError(f"quantize_from: only an int8 / fp8 classifier has an 8-bit part (precision=None), got "
                             f"{quantize_from!r}")
        self.algorithm_cache = algorithm_cache
        if quantized is not None:
            self._use_calibration(folder, quantized, engine_batch_sizes)
        elif model is not None:
            self.backend = "model"
        elif cuda_available():
            self.engine = InferenceEngine(folder, batch_sizes=engine_batch_sizes, precision=self.precision,
                                          layout=self.layout, algorithm_cache=self.algorithm_cache, tta=self.tta)
            self.backend = "engine"
        else:
            self.session = onnx_session(folder, len(self.classes))
            reason = f"CIFAR10Classifier: no CUDA GPU ({device_unavailable_reason()})"
            if self.session is not None:
                self.backend = "onnxruntime"
                warnings.warn(f"{reason}; the model runs on the CPU through onnxruntime, which is slower than a GPU",
                              RuntimeWarning, stacklevel=2)
            else:
                self.backend = "numpy"
                warnings.warn(f"{reason}; the model runs on the host through the NumPy reference ops, which is much "
                              f"slower than a GPU, and than onnxruntime ({INSTALL_HINT})", RuntimeWarning,
                              stacklevel=2)
                self.model = build_release_model(self.config, load_weights(folder), on_host=True)

    def _use_calibration(self, folder: pathlib.Path, dtype, engine_batch_sizes) -> None:
        """The release's int8 / FP8 calibration: run by the quantised InferenceEngine on a GPU, else simulated."""
        dtype = choice("precision", dtype, QUANT_DTYPES)
        calibration = release_calibration(folder, None, dtype)
        if cuda_available():
            self.engine = InferenceEngine(folder, batch_sizes=engine_batch_sizes, precision=dtype,
                                          calibration=calibration, quantize_from=self.quantize_from,
                                          quantized_kernels=self.quantized_kernels,
                                          algorithm_cache=self.algorithm_cache, tta=self.tta)
            self.quantize_from = self.engine.quantize_from  # 'auto''s choice (its largest batch size's)
            self.backend = f"engine-{dtype}"
            return
        if self.quantize_from == AUTO:
            raise ValueError(f"quantize_from: 'auto' chooses by timing the GPU engine; without a GPU "
                             f"({device_unavailable_reason()}) name one of {QUANTIZE_FROM}")
        self.calibration = calibration
        self.state = load_weights(folder)
        self.backend = f"{dtype}-simulated"
        warnings.warn(f"CIFAR10Classifier(precision={dtype!r}): no CUDA GPU ({device_unavailable_reason()}); the "
                      f"calibrated {dtype} arithmetic runs simulated on the host in float64 (exact, slow)",
                      RuntimeWarning, stacklevel=3)

    def __repr__(self):
        return (f"CIFAR10Classifier({str(self.version_dir)!r}, model={self.config['model']['name']}, "
                f"backend={self.backend!r})")

    def preprocess(self, images) -> tuple[np.ndarray, bool]:
        """Inputs -> (normalised batch as the backend reads it, single?): NCHW float32 for onnxruntime, else the
        model's layout and storage dtype."""
        batch, single = to_batch(images)
        on_nchw = self.session is not None or self.calibration is not None
        layout, dtype = ("NCHW", "fp32") if on_nchw else (self.layout, self.precision)
        return normalize_on_host(batch, layout=layout, dtype=dtype), single

    def _forward(self, x: np.ndarray) -> np.ndarray:
        """Logits of a normalised host batch through the onnxruntime session or self.model (handed device arrays
        unless it lives on the host)."""
        if self.calibration is not None:
            stem = self.config["model"].get("stem", "cifar")
            return simulate_logits(self.state, x, self.calibration, stem=stem,
                                   quantize_from=self.quantize_from).astype(np.float32)
        if self.session is not None:
            return np.asarray(self.session.run([OUTPUT], {INPUT: x})[0], dtype=np.float32)

        placement = getattr(self.model, "placement", None)
        if placement.on_gpu if placement is not None else cuda_available():
            import cupy

            x = cupy.asarray(x)
        logits = self.model.forward(x, train=False, copy=False)  # the model's own buffer, copied to the host here
        return np.array(logits.get() if hasattr(logits, "get") else logits, dtype=np.float32)

    def logits(self, images) -> np.ndarray:
        """float32 logits: (10,) for one image, (N, 10) for a batch; with tta, the weighted mean of each image's
        views' (see the class)."""
        if self.engine is not None:
            import cupy

            pixels, single = to_batch(images)  # the engine normalises the uint8 pixels on the device (and views)
            out = [self.engine(cupy.asarray(pixels[s:s + self.batch_size])).get()
                   for s in range(0, len(pixels), self.batch_size)]
            logits = np.concatenate(out) if out else np.zeros((0, len(self.classes)), np.float32)
        else:
            pixels, single = to_batch(images)
            views = tta_views(self.tta)
            logits = self._host_logits(pixels)
            if len(views) > 1:  # the views' logits, weighted and summed in float64, rounded once
                total = views[0].weight * logits.astype(np.float64)
                for v in views[1:]:
                    total += v.weight * self._host_logits(view_images(pixels, v))
                logits = total.astype(np.float32)
        return logits[0] if single else logits

    def _host_logits(self, pixels: np.ndarray) -> np.ndarray:
        """Logits of a uint8 (N, 32, 32, 3) batch through the CPU backend (or the given model), in batches."""
        x, _ = self.preprocess(pixels)
        out = [self._forward(x[s:s + self.batch_size]) for s in range(0, len(x), self.batch_size)]
        return np.concatenate(out) if out else np.zeros((0, len(self.classes)), np.float32)

    def _finite_logits(self, images) -> np.ndarray:
        """self.logits(images), or a ValueError when one is NaN or infinite (argmax would say class 0 and softmax
        NaN): a release whose weights overflow in its precision, or a broken backend."""
        logits = self.logits(images)
        finite = np.isfinite(logits)
        if not finite.all():
            rows = np.flatnonzero(~finite.reshape(-1, logits.shape[-1]).all(axis=1))
            raise ValueError(f"CIFAR10Classifier({str(self.version_dir)!r}, backend={self.backend!r}): the model "
                             f"gave non-finite logits (NaN or infinity) for {len(rows)} image(s), the first at index "
                             f"{int(rows[0])}; no class can be predicted")
        return logits

    def predict_proba(self, images) -> np.ndarray:
        """Class probabilities: (10,) for one image, (N, 10) for a batch; ValueError for non-finite logits."""
        return softmax(self._finite_logits(images))

    def predict(self, images):
        """Class ids: an int for one image, an int64 array for a batch (names: self.classes[id]); ValueError for
        non-finite logits."""
        logits = self._finite_logits(images)
        if logits.ndim == 1:
            return int(np.argmax(logits))
        return np.argmax(logits, axis=1).astype(np.int64)
