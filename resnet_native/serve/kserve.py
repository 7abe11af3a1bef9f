"""The Open Inference Protocol (KServe v2) without its transport: what REST (kserve_http.py) and gRPC share.

    model = KServeModel(batcher, name="version_A")        # the one model a server serves, version "1"
    model.check("version_A", None)                         # ProtocolError 404 for another model or version
    images = model.decode_input("images", "UINT8", [2, 32, 32, 3], raw=body_bytes)   # uint8 (N, 32, 32, 3)
    logits = await model.infer(images)                     # (N, 10) float32, counted in model.stats
    outputs = model.outputs(logits, ["logits", "class"])   # [(name, datatype, shape, array)]

Inputs (exactly one per request): `images` UINT8 [N, 32, 32, 3] pixels; `normalized` FP32 or FP16 [N, 32, 32, 3],
the trainer's normalisation ((v / 255 - mean) / std, NHWC); `encoded` BYTES [N] (or [N, 1]), one PNG or JPEG per
element, decoded by images.decode_image with its limits. A normalised batch is mapped back to the pixels it was
made from: the engine reads images through its own lookup table, so the model never sees values between pixel
levels and every input takes the one batched path. Outputs: `logits` FP32 [N, 10] and, when asked for, `class`
INT64 [N]. Every refusal is a ProtocolError whose status is the HTTP one (gRPC maps it) and whose message names
the field.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import threading
import time

import numpy as np

from .._core.version import __version__
from ..data.augment import MEAN, STD
from ..data.cifar10 import CLASSES
from .batcher import IMAGE_SHAPE, BatcherClosed, BatcherFull
from .images import DEFAULT_MAX_PIXELS, ImageError, decode_image

PLATFORM = "resnet_native"
SERVER_NAME = "resnet_native"
VERSION = "1"
# What GET /v2 (and gRPC ServerMetadata) lists: the Triton extensions this server implements.
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")

# The wire datatypes and their little-endian NumPy dtypes (BYTES: length-prefixed elements, no dtype).
DATATYPES = {"BOOL": "?", "UINT8": "u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "INT8": "i1",
             "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
             "BYTES": None}

IMAGES, NORMALIZED, ENCODED = "images", "normalized", "encoded"
LOGITS, CLASS = "logits", "class"
INPUT_TYPES = {IMAGES: ("UINT8",), NORMALIZED: ("FP32", "FP16"), ENCODED: ("BYTES",)}
OUTPUT_NAMES = (LOGITS, CLASS)
DEFAULT_OUTPUTS = (LOGITS,)

_PNG, _JPEG = b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"
_MEAN = np.asarray(MEAN, np.float64)
_STD = np.asarray(STD, np.float64)
# How far past the pixel range [0, 255] a normalised value may lie and still round to it (FP16's rounding error).
_PIXEL_SLACK = 0.5


class ProtocolError(Exception):
    """A request the protocol refuses: `status` is the HTTP status (400, 404, 500, 503), the message names the
    field. REST answers {"error": message}; gRPC maps the status to its code."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = int(status)

    @property
    def message(self) -> str:
        return str(self)


def server_metadata() -> dict:
    return {"name": SERVER_NAME, "version": str(__version__), "extensions": list(EXTENSIONS)}


# -- statistics ----------------------------------------------------------------------------------------------


def _duration() -> dict:
    return {"count": 0, "ns": 0}


class ModelStats:
    """Triton's statistics extension for one model, updated from any thread (REST, gRPC, the batcher's worker).

    execution_count, inference_count and compute_infer come from every engine call (observe_batch, the batcher's
    listener), so /predict's images count too: they are the model's work. success, fail and queue are per v2
    request: queue is the wait from submitting to the start of the engine call that ran its last image."""

    def __init__(self, name: str, version: str = VERSION):
        self.name, self.version = name, version
        self._lock = threading.Lock()
        self._stats = {k: _duration() for k in ("success", "fail", "queue", "compute_input", "compute_infer",
                                                 "compute_output", "cache_hit", "cache_miss")}
        self._batches = {}  # batch size -> compute_infer duration
        self.inference_count = self.execution_count = 0
        self.last_inference_ms = 0
        self._last_batch_ns = 0  # the latest engine call's time, read by the futures it resolves

    def observe_batch(self, size: int, seconds: float) -> None:
        ns = int(seconds * 1e9)
        with self._lock:
            self.execution_count += 1
            self.inference_count += size
            self.last_inference_ms = int(time.time() * 1000)
            self._add("compute_infer", ns)
            b = self._batches.setdefault(size, _duration())
            b["count"] += 1
            b["ns"] += ns
            self._last_batch_ns = ns

    def _add(self, key: str, ns: int) -> None:
        self._stats[key]["count"] += 1
        self._stats[key]["ns"] += max(0, int(ns))

    def record(self, ok: bool, total_ns: int, queue_ns: int | None = None) -> None:
        """One v2 request answered (ok) or failed, its whole time, and its queue time when it reached the engine."""
        with self._lock:
            self._add("success" if ok else "fail", total_ns)
            if queue_ns is not None:
                self._add("queue", queue_ns)

    def started_ns(self, done_ns: int) -> int:
        """When the engine call that just resolved a future began (called on the thread that resolved it)."""
        return done_ns - self._last_batch_ns

    def snapshot(self) -> dict:
        """Triton's model_stats entry (the JSON of GET /v2/models/{m}/stats; gRPC's ModelStatistics fields)."""
        with self._lock:
            empty = _duration()
            return {"name": self.name, "version": self.version, "last_inference": self.last_inference_ms,
                    "inference_count": self.inference_count, "execution_count": self.execution_count,
                    "inference_stats": {k: dict(v) for k, v in self._stats.items()},
                    "batch_stats": [{"batch_size": size, "compute_input": dict(empty), "compute_infer": dict(d),
                                     "compute_output": dict(empty)} for size, d in sorted(self._batches.items())]}


# -- tensors on the wire -------------------------------------------------------------------------------------


def split_bytes(raw: bytes, field: str) -> list:
    """BYTES tensor contents on the wire (each element a 4-byte little-endian length, then its bytes) -> list."""
    out, i, view = [], 0, memoryview(raw)
    while i < len(view):
        if i + 4 > len(view):
            raise ProtocolError(400, f"{field}: BYTES data ends inside an element's 4-byte length")
        n = int.from_bytes(view[i:i + 4], "little")
        if i + 4 + n > len(view):
            raise ProtocolError(400, f"{field}: BYTES element {len(out)} declares {n} bytes, past the data's end")
        out.append(bytes(view[i + 4:i + 4 + n]))
        i += 4 + n
    return out


def join_bytes(elements) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    """An output's binary form (the binary tensor data extension, gRPC raw_output_contents)."""
    if datatype == "BYTES":
        return join_bytes([bytes(e) for e in np.asarray(array, object).ravel()])
    return np.ascontiguousarray(array, DATATYPES[datatype]).tobytes()


def to_json(array: np.ndarray) -> list:
    """An output's JSON form: the flat row-major list the protocol uses."""
    return np.asarray(array).ravel().tolist()


def _check_shape(name: str, datatype: str, shape, max_batch_size: int) -> tuple:
    field = f"inputs[{name}].shape"
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                       for d in shape):
        raise ProtocolError(400, f"{field}: expected a list of integers, got {shape!r}")
    shape = tuple(int(d) for d in shape)
    if datatype == "BYTES":
        ok = len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)
        expected = "[N] or [N, 1]"
    else:
        ok = len(shape) == 4 and shape[1:] == IMAGE_SHAPE
        expected = "[N, " + ", ".join(map(str, IMAGE_SHAPE)) + "]"
    if not ok or any(d < 0 for d in shape):
        raise ProtocolError(400, f"{field}: expected {expected}, got {list(shape)}")
    if shape[0] == 0:
        raise ProtocolError(400, f"{field}: an empty batch (N = 0); expected 1 to {max_batch_size} images")
    if shape[0] > max_batch_size:
        raise ProtocolError(400, f"{field}: a batch of {shape[0]} images, more than max_batch_size={max_batch_size}")
    return shape


def _flatten(data, field: str) -> list:
    """The protocol's JSON data, flat or nested row-major lists, as one flat list."""
    if not isinstance(data, list):
        raise ProtocolError(400, f"{field}: expected a list, got {type(data).__name__}")
    flat, stack = [], [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _numbers(flat: list, datatype: str, field: str) -> np.ndarray:
    integer = datatype == "UINT8"
    for v in flat:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            kind = "integers" if integer else "numbers"
            raise ProtocolError(400, f"{field}: expected {datatype} {kind}, got {type(v).__name__} {v!r}")
    if integer:
        values = np.asarray(flat, dtype=np.int64) if flat else np.zeros(0, np.int64)
        if values.size and (values.min() < 0 or values.max() > 255):
            raise ProtocolError(400, f"{field}: UINT8 values must be 0 to 255")
        return values.astype(np.uint8)
    return np.asarray(flat, dtype=np.float64)


def pixels_from_normalized(x: np.ndarray, field: str) -> np.ndarray:
    """A normalised NHWC batch -> the uint8 pixels it was made from (nearest level); 400 for values that are not
    finite or lie outside the pixel range."""
    x = np.asarray(x, np.float64)
    if not np.isfinite(x).all():
        raise ProtocolError(400, f"{field}: values must be finite")
    levels = (x * _STD + _MEAN) * 255.0
    if levels.size and (levels.min() < -_PIXEL_SLACK or levels.max() > 255 + _PIXEL_SLACK):
        raise ProtocolError(400, f"{field}: values outside the normalised range of pixels 0 to 255 "
                                 "((v / 255 - mean) / std with the training set's mean and std)")
    return np.clip(np.rint(levels), 0, 255).astype(np.uint8)


def _media(data: bytes) -> str | None:
    return "image/png" if data.startswith(_PNG) else "image/jpeg" if data.startswith(_JPEG) else None


def decode_encoded(elements: list, field: str, *, resize: bool = False,
                   max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """BYTES elements (PNG or JPEG each) -> uint8 (N, 32, 32, 3); 400 naming the element that is refused."""
    out = np.empty((len(elements), *IMAGE_SHAPE), np.uint8)
    for i, data in enumerate(elements):
        kind = _media(data)
        if kind is None:
            raise ProtocolError(400, f"{field}[{i}]: not a PNG or JPEG image")
        try:
            out[i] = decode_image(data, kind, resize=resize, max_pixels=max_pixels)
        except ImageError as e:
            raise ProtocolError(400, f"{field}[{i}]: {e}") from None
    return out


def decode_input(name: str, datatype: str, shape, *, raw: bytes | None = None, data=None,
                 max_batch_size: int, resize: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """One request input -> uint8 (N, 32, 32, 3) images. Its contents come as `raw` bytes (the binary tensor data
    extension, gRPC raw_input_contents) or `data`, the JSON list (gRPC's typed contents as a list; a BYTES element
    as bytes, or as a base64 string in JSON). ProtocolError 400 naming the field for anything else."""
    if name not in INPUT_TYPES:
        raise ProtocolError(400, f"inputs[{name}]: unknown input name {name!r}; expected one of "
                                 f"{', '.join(INPUT_TYPES)}")
    if datatype not in INPUT_TYPES[name]:
        known = "" if datatype in DATATYPES else " (not a datatype of the protocol)"
        raise ProtocolError(400, f"inputs[{name}].datatype: expected {' or '.join(INPUT_TYPES[name])}, got "
                                 f"{datatype!r}{known}")
    shape = _check_shape(name, datatype, shape, max_batch_size)
    count = int(np.prod(shape))
    if (raw is None) == (data is None):
        raise ProtocolError(400, f"inputs[{name}]: expected its contents either as data or as binary data, "
                                 f"got {'both' if raw is not None else 'neither'}")
    field = f"inputs[{name}].data"
    if datatype == "BYTES":
        if raw is not None:
            elements = split_bytes(raw, field)
        else:
            elements = [_element(v, f"{field}[{i}]") for i, v in enumerate(_flatten(data, field))]
        if len(elements) != count:
            raise ProtocolError(400, f"{field}: {len(elements)} elements for shape {list(shape)} ({count} expected)")
        return decode_encoded(elements, field, resize=resize, max_pixels=max_pixels)
    if raw is not None:
        itemsize = np.dtype(DATATYPES[datatype]).itemsize
        if len(raw) != count * itemsize:
            raise ProtocolError(400, f"{field}: {len(raw)} bytes for shape {list(shape)} of {datatype} "
                                     f"({count * itemsize} expected)")
        values = np.frombuffer(raw, DATATYPES[datatype])
    else:
        values = _numbers(_flatten(data, field), datatype, field)
        if values.size != count:
            raise ProtocolError(400, f"{field}: {values.size} values for shape {list(shape)} ({count} expected)")
    values = values.reshape(shape)
    if datatype == "UINT8":
        return np.array(values, np.uint8, order="C")
    return pixels_from_normalized(values, field)


def _element(value, field: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise ProtocolError(400, f"{field}: expected an image as a base64 string") from None
    raise ProtocolError(400, f"{field}: expected an image as a base64 string, got {type(value).__name__}")


# -- the model -----------------------------------------------------------------------------------------------


class KServeModel:
    """The one model a server serves over the protocol: names, metadata, config, inputs in, outputs out, and its
    statistics. batcher: the server's Batcher (or a RemoteBatcher); attach() makes its engine calls count in
    stats. max_batch_size: the most images one request may carry (default: the batcher's max_batch, bounded by
    its queue)."""

    def __init__(self, batcher, *, name: str, classes=CLASSES, resize: bool = False,
                 max_pixels: int = DEFAULT_MAX_PIXELS, max_batch_size: int | None = None):
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"name: expected a model name without '/', got {name!r}")
        self.batcher, self.name, self.version, self.classes = batcher, name, VERSION, tuple(classes)
        self.resize, self.max_pixels = bool(resize), int(max_pixels)
        limit = min(batcher.settings()["max_batch"], batcher.max_queue)  # one request: one engine call
        self.max_batch_size = limit if max_batch_size is None else int(max_batch_size)
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size: expected >= 1, got {max_batch_size}")
        self.stats = ModelStats(name, VERSION)

    def attach(self) -> None:
        self.batcher.add_batch_listener(self.stats.observe_batch)

    def detach(self) -> None:
        self.batcher.remove_batch_listener(self.stats.observe_batch)

    @property
    def ready(self) -> bool:
        return not self.batcher.closed

    def check(self, name: str, version: str | None = None) -> None:
        """ProtocolError 404 unless `name` (and `version`, when given and not empty) is this model's."""
        if name != self.name:
            raise ProtocolError(404, f"model_name: unknown model {name!r}; this server serves {self.name!r}")
        if version not in (None, "", self.version):
            raise ProtocolError(404, f"model_version: unknown version {version!r} of model {self.name!r}; "
                                     f"its only version is {self.version!r}")

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.version], "platform": PLATFORM,
                "inputs": [{"name": IMAGES, "datatype": "UINT8", "shape": [-1, *IMAGE_SHAPE]},
                           {"name": NORMALIZED, "datatype": "FP32", "shape": [-1, *IMAGE_SHAPE]},
                           {"name": ENCODED, "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": LOGITS, "datatype": "FP32", "shape": [-1, len(self.classes)]},
                            {"name": CLASS, "datatype": "INT64", "shape": [-1]}]}

    def config(self) -> dict:
        """Triton's model configuration (JSON form): each request carries exactly one of the optional inputs."""
        dims = list(IMAGE_SHAPE)
        return {"name": self.name, "platform": PLATFORM, "backend": PLATFORM, "max_batch_size": self.max_batch_size,
                "input": [{"name": IMAGES, "data_type": "TYPE_UINT8", "format": "FORMAT_NHWC", "dims": dims,
                           "optional": True},
                          {"name": NORMALIZED, "data_type": "TYPE_FP32", "format": "FORMAT_NHWC", "dims": dims,
                           "optional": True},
                          {"name": ENCODED, "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []},
                           "optional": True}],
                "output": [{"name": LOGITS, "data_type": "TYPE_FP32", "dims": [len(self.classes)],
                            "label_filename": ""},
                           {"name": CLASS, "data_type": "TYPE_INT64", "dims": [1], "reshape": {"shape": []}}],
                "version_policy": {"latest": {"num_versions": 1}},
                "parameters": {"classes": {"string_value": ",".join(self.classes)}}}

    def decode_input(self, name: str, datatype: str, shape, *, raw: bytes | None = None, data=None) -> np.ndarray:
        return decode_input(name, datatype, shape, raw=raw, data=data, max_batch_size=self.max_batch_size,
                            resize=self.resize, max_pixels=self.max_pixels)

    def check_outputs(self, names) -> list:
        """The requested output names (default: logits), each known and asked for once."""
        names = list(DEFAULT_OUTPUTS if not names else names)
        for n in names:
            if n not in OUTPUT_NAMES:
                raise ProtocolError(400, f"outputs[{n}]: unknown output name {n!r}; expected one of "
                                         f"{', '.join(OUTPUT_NAMES)}")
        if len(set(names)) != len(names):
            raise ProtocolError(400, "outputs: an output is requested more than once")
        return names

    def outputs(self, logits: np.ndarray, names) -> list:
        """[(name, datatype, shape, array)] of the requested outputs, in the requested order."""
        out = []
        for n in self.check_outputs(names):
            if n == LOGITS:
                out.append((n, "FP32", list(logits.shape), np.ascontiguousarray(logits, np.float32)))
            else:
                out.append((n, "INT64", [len(logits)], np.argmax(logits, axis=1).astype(np.int64)))
        return out

    async def infer(self, images: np.ndarray) -> np.ndarray:
        """Run uint8 (N, 32, 32, 3) images through the batcher (all queued at once, or none) -> (N, classes)
        float32 logits; 503 when the queue is full or closing, 500 when the engine fails or gives a non-finite
        logit. Counted in stats (success / fail, queue)."""
        start = time.perf_counter_ns()
        started = []

        def note(future):  # on the thread that resolved it, right after the engine call that ran it
            started.append(self.stats.started_ns(time.perf_counter_ns()))

        try:
            try:
                future = self.batcher.submit_array(images)
            except (BatcherFull, BatcherClosed) as e:
                raise _unavailable(e) from None
            except ValueError as e:
                raise ProtocolError(400, f"inputs: {e}") from None
            future.add_done_callback(note)
            try:
                rows = await asyncio.wrap_future(future)
            except (BatcherFull, BatcherClosed) as e:  # a RemoteBatcher's refusal arrives in the future
                raise _unavailable(e) from None
            except (concurrent.futures.CancelledError, asyncio.CancelledError):
                raise
            except Exception as e:
                raise ProtocolError(500, f"inference failed: {type(e).__name__}: {e}") from None
            logits = np.asarray(rows, np.float32)
            if not np.isfinite(logits).all():
                bad = sorted({int(i) for i in np.nonzero(~np.isfinite(logits))[0]})
                raise ProtocolError(500, f"outputs[{LOGITS}]: the model gave non-finite logits for batch "
                                         f"element(s) {bad[:8]}")
        except ProtocolError:
            self.stats.record(False, time.perf_counter_ns() - start)
            raise
        queue = max(started) - start if started else None
        self.stats.record(True, time.perf_counter_ns() - start, queue)
        return logits


def _unavailable(e: Exception) -> ProtocolError:
    if isinstance(e, BatcherFull):
        return ProtocolError(503, f"the server is busy: {e}")
    return ProtocolError(503, f"the server is shutting down ({e})")
