"""InferenceEngine: a trained ResNet served from one CUDA graph per batch size.

    engine = InferenceEngine(model, batch_sizes=(1, 8, 32, 256, 1024), precision="fp16", layout="NHWC")
    logits = engine(images)        # uint8 (N, 32, 32, 3) pixels, or a normalised batch -> (N, classes) float32
    InferenceEngine(model, tta="flip")   # the mean logits of each image and its mirror: two replays per chunk

Building does the slow work once: BatchNorm folded into each convolution (fold.py, plan.py), activation buffers
shared by liveness (buffers.py) in the engine's own cupy pool, per batch size an eager forward (algorithm searches,
fused-or-unfused timing: tuning.py), then a capture (_core/capture.py). A call is then a handful of launches with
no allocation and no host synchronisation: the input stage (input_stage.py), the replay of the smallest captured
batch size that holds the batch, the copy of the logits. precision='int8' / 'fp8' adds quantized.py's steps.
algorithm_cache=PATH keeps the searches, the timings and quantize_from='auto''s choice (choice_cache.py) for the
next engine on the same GPU and cuDNN. An engine is not thread-safe.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import numpy as np

from .._core.capture import WorkspaceHold, capture_graph, launch_ordered
from .._core.names import (
    ARRAY_DTYPES,
    DTYPE_ALIASES,
    ENGINES,
    LAYOUTS,
    PRECISIONS,
    QUANT_PRECISIONS,
    VALUE_DTYPES,
    choice,
    flag,
    precision_argument,
    whole_numbers,
)
from .._core.runtime import require_gpu
from ..data.augment import normalization_lut
from ..ops import conv, kernels, own_conv
from ..ops.workspace import reserve_workspace
from ..quantization.prefix import AUTO, QUANTIZE_FROM, quantize_from_choices
from . import choice_cache
from .batching import batch_chunks
from .buffers import plan_buffers
from .flip_tta import FlipAverage, tta_mode
from .fold import conv_step_params
from .input_stage import InputStage, QuantizedInputStage, as_device_array
from .kernel_choice import QUANTIZED_KERNELS, KernelChooser
from .plan import build_plan
from .quantized import (
    boundary_quantize,
    checked_scales,
    input_table,
    quantized_convs,
    quantized_plan,
    residual_scratch_elements,
)
from .runner import bind_forward
from .simulate import quantized_steps
from .source import model_source, release_calibration
from .timing import forward_ms
from .tuning import decide_fusion

# The precision of an int8 / FP8 engine's float values (the last block's output, the pooled features): the
# calibration's (quantization.calibrate plans in fp32), so the two plans have the same values and names.
QUANTIZED_FLOAT_PRECISION = "fp32"

DEFAULT_BATCH_SIZES = (1, 8, 32, 256, 1024)


class InferenceEngine(contextlib.AbstractContextManager):
    """A model or release built into captured forwards; see the module docstring for its use.

    While an engine lives, do not drop the cached cuDNN plans (resnet_native.release_handles,
    _drop_cached_descriptors): its graphs launch kernels those plans own (the plan cache's own evictions skip
    plans run during a capture: they are pinned). close(), or dropping the engine, releases everything it holds.
    """

    def __init__(self, model_or_release, batch_sizes=DEFAULT_BATCH_SIZES, precision="fp16", layout="NHWC", *,
                 image_size=32, split=True, cuda_graph=True, conv_engine="auto", deterministic=False,
                 tune_fusion=True, algorithm_cache=None, models_dir=None, calibration=None,
                 quantize_from="stem", quantized_kernels="auto", tta=None, dtype=None):
        """model_or_release: a resnet_native ResNet, a release folder, or a release version name (looked up in
        models_dir like CIFAR10Classifier). precision: what the engine computes in ('fp16', 'bf16', 'fp32'
        strict, or 'tf32'); the logits are float32 whatever it is. layout: of the normalised inputs and every
        activation. image_size: (H, W) of the inputs (an int: square). split: a batch over the largest captured
        size runs in chunks (False: ValueError). cuda_graph=False runs the same steps eagerly (debugging).
        conv_engine / deterministic: the ConvSpec fields of every convolution. tune_fusion=False skips the
        fused-or-unfused timing (undecided keys stay fused where cuDNN accepts it; decided ones keep their
        choice). algorithm_cache: a cache file path (conv.save_algorithm_cache's), for the conv algorithm choices
        and 'auto''s choice.

        precision='int8' / 'fp8': the quantised engine (quantized.py) with `calibration` (a quantization.Calibration;
        for a release, its calibration_<dtype>.json when None); NHWC. quantize_from: where the 8-bit part begins
        (quantization/prefix.py): 'stem' (all but the classifier; the 'cifar' stem, uint8 images only), 'layer1'
        ... 'layer4' (the earlier stages in fp16, then one quantise step; any input the fp16 engine takes), or
        'auto': each candidate built and graph-timed at the largest batch size, the fastest kept
        (engine.quantize_from, quantize_from_times {candidate: ms}, quantize_from_source 'timed' or 'cache': with
        algorithm_cache the file's stored choice of the same problem, choice_cache.choice_key, is reused).
        quantized_kernels: which kernel runs each int8 convolution ('auto' timed per layer and batch size, 'own',
        'cudnn': kernel_choice.py); engine.kernel_choice records what was chosen and why.
        'stem' is the default: the calibrations' measured accuracy is for it, and the choice does not depend on a
        timing. tta='flip': the mean of the logits of each image and its mirror image (flip_tta.py: the staged input
        mirrored in place and replayed; twice the forward's latency); None or 'none': the logits alone. dtype: the
        deprecated name of precision."""
        self._graphs, self._hold, self._pool, self._closed, self._flip = {}, None, None, False, None
        self.batch_sizes = tuple(sorted(set(whole_numbers("batch_sizes", batch_sizes, 1))))
        precision = precision_argument("InferenceEngine", precision, dtype, default="fp16")
        self.precision = choice("precision", precision, PRECISIONS + QUANT_PRECISIONS)
        self.quantized = self.precision in QUANT_PRECISIONS
        float_precision = QUANTIZED_FLOAT_PRECISION if self.quantized else self.precision
        self.dtype = DTYPE_ALIASES[float_precision]  # the dtype of the float values
        self.layout = choice("layout", layout, LAYOUTS)
        if self.quantized and self.layout != "NHWC":
            raise ValueError(f"layout: the {self.precision} engine runs NHWC, got {self.layout!r}")
        self.split = flag("split", split)
        self.tta = tta_mode(tta)
        self.cuda_graph = flag("cuda_graph", cuda_graph)
        self.deterministic = flag("deterministic", deterministic)
        self.tune_fusion = flag("tune_fusion", tune_fusion)
        self.conv_engine = choice("conv_engine", conv_engine, ENGINES)
        if algorithm_cache is not None and not isinstance(algorithm_cache, (str, os.PathLike)):
            raise TypeError(f"algorithm_cache: expected a file path or None, got {type(algorithm_cache).__name__}")
        self.algorithm_cache = algorithm_cache
        source = model_source(model_or_release, models_dir)
        self.source = source.description
        self.plan = build_plan(source.state, source.stem, float_precision, image_size)
        self.calibration = None
        self.quantize_from = choice("quantize_from", quantize_from, QUANTIZE_FROM + (AUTO,))
        self.quantize_from_times = {}  # candidate -> median ms at the largest batch size ('auto' only)
        self.quantize_from_source = None  # 'auto': 'timed', or 'cache' (the algorithm_cache file's choice)
        self._calibration_plan = self.plan  # the fp32 plan whose value names the calibration's scales are keyed by
        if self.quantized:
            self.calibration = (calibration if calibration is not None
                                else release_calibration(model_or_release, models_dir, self.precision, source))
            self._candidates = ((self.quantize_from,) if self.quantize_from != AUTO else
                                tuple(q for q in quantize_from_choices(self.plan) if q != "stem" or
                                      self.plan.stem == "cifar"))
            # A bad quantize_from or calibration fails here, before the GPU; _bind makes the chosen plan.
            checked_scales(self._calibration_plan, self.calibration, self.precision)
            for candidate in self._candidates:
                quantized_plan(self._calibration_plan, self.precision, candidate)
        elif calibration is not None:
            raise ValueError(f"calibration: only int8 / fp8 engines take one (precision={self.precision!r})")
        elif self.quantize_from != "stem":
            raise ValueError(f"quantize_from: only int8 / fp8 engines have an 8-bit part "
                             f"(precision={self.precision!r})")
        self.quantized_kernels = choice("quantized_kernels", quantized_kernels, QUANTIZED_KERNELS)
        if self.quantized_kernels != "auto" and self.precision != "int8":
            raise ValueError(f"quantized_kernels: only int8 engines choose their convolutions' kernels "
                             f"(precision={self.precision!r}); leave it 'auto'")
        self.kernel_choice = KernelChooser(self.quantized_kernels, deterministic=self.deterministic)
        self.num_classes = self.plan.num_classes
        self.fused_paths = {}  # (conv step name, batch size) -> the fused_path its cache entry has
        self.capture_error = None  # why capture was abandoned, if it was
        self.capture_allocated_bytes = 0  # what the captures allocated (nothing, unless an op misbehaves)
        require_gpu()
        if self.quantized_kernels == "own" and not own_conv.available():
            raise RuntimeError(f"quantized_kernels='own': this build or GPU cannot run the package's own kernels "
                               f"({own_conv.unavailable_reason()})")
        self._build(source.state)

    # -- public ----------------------------------------------------------------------------------------------
    def __call__(self, x, *, out=None):
        """Logits (N, num_classes) float32 of a batch: uint8 (N, H, W, 3) images, or a float32 / float16 / bf16
        (uint16 bits) batch in the engine's layout. out: a C-contiguous float32 (N, num_classes) cupy array to
        write into (no allocation); else a new array. Larger batches than the largest captured size run in chunks
        of that size (split=True). Work is queued on cupy's current stream; a call on another stream than the
        previous call's first waits for that call, since both use the same buffers."""
        import cupy

        if self._closed:
            raise RuntimeError("InferenceEngine: closed")
        if cupy.cuda.runtime.getDevice() != self._device:
            raise ValueError(f"InferenceEngine: built on CUDA device {self._device}, called with device "
                             f"{cupy.cuda.runtime.getDevice()} current")
        x = as_device_array(x, "x")
        if x.device.id != self._device:
            raise ValueError(f"x: array is on CUDA device {x.device.id}, the engine on device {self._device}")
        kind = self._input.kind_of(x)
        n = int(x.shape[0])
        chunks = batch_chunks(n, self.batch_sizes, self.split)
        out = self._output(out, n)
        if not chunks:
            return out
        stream = cupy.cuda.get_current_stream()
        if self._last_stream is not None and self._last_stream != stream.ptr:
            stream.wait_event(self._done)
        for start, count, batch in chunks:
            forward = self._forwards[batch]
            self._input.write(x[start:start + count], kind, forward.input[:count])
            if count < batch:  # padding rows: zeros, not whatever bits (NaN included) the buffer last held
                forward.input[count:].fill(0)
            self._replay(batch, stream)
            cupy.copyto(out[start:start + count], forward.logits[:count])
            if self._flip is not None:  # the mirrored chunk through the same forward, then the mean logits
                self._flip.mirror(forward.input[:count])
                self._replay(batch, stream)
                self._flip.average(out[start:start + count], forward.logits[:count])
        self._done.record(stream)
        self._last_stream = stream.ptr
        return out

    def _replay(self, batch: int, stream) -> None:
        if self.cuda_graph:
            launch_ordered(self._graphs[batch], stream)
        else:
            self._forwards[batch].run()

    @property
    def input_shape(self) -> tuple:
        """The per-sample shape of a normalised input, in the engine's layout (uint8 images are (H, W, 3))."""
        return self._input.sample_shape

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    @property
    def memory_bytes(self) -> int:
        """Device memory the engine holds: activation buffers, folded weights and biases, the lookup table."""
        return 0 if self._pool is None else int(self._pool.total_bytes())

    def close(self) -> None:
        """Drop the graphs, the buffers and the workspace hold, and return the memory to the device."""
        self._closed = True
        self._graphs = {}
        self._forwards, self._weights, self._arena, self._input = {}, {}, [], None
        self._quantized, self._all_quantized, self._float_weights, self._flip = {}, None, None, None
        if self._hold is not None:
            self._hold.release()
            self._hold = None
        if self._pool is not None:
            self._pool.free_all_blocks()

    def __exit__(self, *exc):  # __enter__ (returns the engine) from AbstractContextManager
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter teardown
            pass

    def __repr__(self):
        quantized = ""
        if self.quantized:
            times = ", ".join(f"{q}: {ms:.3f} ms" for q, ms in self.quantize_from_times.items())
            auto = f" (auto, {self.quantize_from_source}: {times})" if self.quantize_from_source else ""
            kernels = ", ".join(f"{k}: {n}" for k, n in self.kernel_choice.summary().items())
            quantized = f", quantize_from={self.quantize_from!r}{auto}, kernels=({kernels})"
        tta = ", tta='flip'" if self.tta == "flip" else ""
        return (f"InferenceEngine({self.source}, batch_sizes={self.batch_sizes}, precision={self.precision!r}"
                f"{quantized}, layout={self.layout!r}{tta}, graphs={self.num_graphs})")

    # -- calls -----------------------------------------------------------------------------------------------
    def _output(self, out, n: int):
        import cupy

        shape = (n, self.num_classes)
        if out is None:
            return cupy.empty(shape, dtype=np.float32)
        if not isinstance(out, cupy.ndarray):
            raise TypeError(f"out: expected a cupy array, got {type(out).__name__}")
        if out.dtype != np.float32 or tuple(out.shape) != shape or not out.flags.c_contiguous:
            raise ValueError(f"out: expected a C-contiguous float32 array of shape {shape}, got {out.dtype} "
                             f"{tuple(out.shape)}")
        return out

    # -- building --------------------------------------------------------------------------------------------
    def _build(self, state: dict) -> None:
        # Activations get buffers for the largest batch size from the engine's own pool (smaller batch sizes use
        # their leading bytes); BN is folded in float64 on the host and rounded once to the storage dtype.
        import cupy

        self._device = cupy.cuda.runtime.getDevice()
        self._pool = cupy.cuda.MemoryPool()
        # Keyed by what was asked for (a failed capture turns cuda_graph off after the timing).
        key = None if self.quantize_from != AUTO else choice_cache.choice_key(
            self._calibration_plan, dtype=self.precision, batch=self.batch_sizes[-1], cuda_graph=self.cuda_graph,
            candidates=self._candidates, conv_engine=self.conv_engine, deterministic=self.deterministic,
            tune_fusion=self.tune_fusion)
        with cupy.cuda.using_allocator(self._pool.malloc):
            # Every step's quantised operands once ('stem''s are every quantize_from's): candidates share them.
            self._all_quantized = {} if not self.quantized else quantized_convs(
                self._calibration_plan, state, self.calibration, self.precision, cupy.asarray)
            self._float_weights = {}  # (step name, precision) -> device (weight, bias), shared by the candidates
            stored = {}
            if self.algorithm_cache is not None and os.path.exists(self.algorithm_cache):
                # The choices first: a malformed section raises before the conv entries are added.
                stored = choice_cache.load_choices(self.algorithm_cache)
                conv.load_algorithm_cache(self.algorithm_cache)
            self.kernel_choice.stored = {k: v for k, v in stored.items() if "kernel" in v}

            if key is not None:
                self._choose_quantize_from(state, stored.get(key))
            self._bind(state, self.quantize_from if self.quantized else "stem", self.batch_sizes)
            self._all_quantized, self._float_weights = None, None  # the rejected candidates' operands go,
            self._pool.free_all_blocks()  # and with them the prefix's 8-bit operands and 'auto''s buffers
            workspace = max(self._warm_up(b) for b in self.batch_sizes)
            reserve_workspace(workspace)
            if self.cuda_graph:
                self._capture_all()
            if self.tta == "flip":
                self._flip = FlipAverage(self._forwards[self.batch_sizes[-1]].input, self.layout)
        cupy.cuda.get_current_stream().synchronize()
        if self.algorithm_cache is not None:
            conv.save_algorithm_cache(self.algorithm_cache)  # keeps the file's choices (this machine's)
            timed = dict(self.kernel_choice.timed)
            if self.quantize_from_source == "timed":
                timed[key] = (self.quantize_from, self.quantize_from_times)
            if timed:
                choice_cache.store_choices(self.algorithm_cache, timed)
        self._done = cupy.cuda.Event(disable_timing=True)
        self._last_stream = None
        if self._flip is not None:  # compiles the mirror's copy kernels now rather than in the first call
            _, height, width = self.plan.values[self.plan.input].shape
            self(cupy.zeros((1, height, width, 3), np.uint8))
            cupy.cuda.get_current_stream().synchronize()

    def _choose_quantize_from(self, state: dict, stored) -> None:
        """'auto': the stored choice of this problem, else each candidate bound at the largest batch size and
        timed, the fastest kept."""
        import cupy


        if stored is not None:
            self.quantize_from, self.quantize_from_times = stored["quantize_from"], dict(stored["times_ms"])
            self.quantize_from_source = "cache"
            return
        largest = self.batch_sizes[-1]
        for candidate in self._candidates:
            self._bind(state, candidate, (largest,))
            reserve_workspace(self._warm_up(largest))
            cupy.cuda.get_current_stream().synchronize()
            self.quantize_from_times[candidate] = forward_ms(self._forwards[largest], self._pool, self.cuda_graph)
            self._forwards, self._arena = {}, []  # the next candidate's buffers reuse the memory
        self.quantize_from = min(self.quantize_from_times, key=self.quantize_from_times.get)
        self.quantize_from_source = "timed"
        self.fused_paths = {}
        self.kernel_choice.forget_steps()  # the chosen candidate's bind records its own

    def _bind(self, state: dict, quantize_from: str, batch_sizes: tuple) -> None:
        """The plan of `quantize_from` (quantised engines) with its operands, buffers, input stage and one Forward
        per batch size of `batch_sizes`, its input filled with a warm-up stand-in."""
        import cupy


        largest = self.batch_sizes[-1]
        base = self._calibration_plan
        if self.quantized:
            self.plan = quantized_plan(base, self.precision, quantize_from)
            suffix = {s.name for s in quantized_steps(base, quantize_from)}
            self._quantized = {k: q for k, q in self._all_quantized.items() if k in suffix}
            quantize = next((s for s in self.plan.steps if s.kind == "quantize"), None)
            if quantize is not None:  # the float prefix's end (quantized.py: residual_requantize over zeros)
                self._quantized[quantize.name] = boundary_quantize(base, self.calibration, self.precision,
                                                                   quantize_from, largest, cupy.zeros)
        else:
            self._quantized = {}
        self.buffers = plan_buffers(self.plan)
        self._weights = {s.name: self._float_weight(state, s) for s in self.plan.conv_steps()
                         if s.name not in self._quantized}
        self._arena = [cupy.zeros(size * largest, dtype=np.uint8) for size in self.buffers.sizes]
        _, height, width = self.plan.values[self.plan.input].shape
        if self.quantized and quantize_from == "stem":  # the table of the simulation's fp32 normalised inputs
            table = input_table(self.calibration, self.precision, normalization_lut("fp32"))
            self._input = QuantizedInputStage(self.precision, (height, width), cupy.asarray(table))
        else:  # the float engine's, in the dtype of the plan's input (a quantised engine's fp16 prefix)
            dtype = self.plan.values[self.plan.input].dtype
            self._input = InputStage(dtype, self.layout, (height, width), cupy.asarray(normalization_lut(dtype)))
        self._specs = {s.name: self._spec(s) for s in self.plan.conv_steps()}
        # The residual steps' fp16 scratch (quantised engines: quantized.py), shared: each is read at once.
        scratch = cupy.empty(residual_scratch_elements(base, quantize_from) * largest if self.quantized else 0,
                             np.float16)
        self._forwards = {b: bind_forward(self.plan, b, self._view, self._weights, self._specs, self.layout,
                                          self._quantized, scratch)
                          for b in batch_sizes}
        # Warm-up input like normalised images (host-generated: cupy.random would create its global generator,
        # and with it lasting memory, in this pool).
        first = self._forwards[batch_sizes[-1]].input
        noise = np.random.default_rng(0).standard_normal(first.shape, dtype=np.float32)
        if isinstance(self._input, QuantizedInputStage):
            first[...] = cupy.asarray(self._input.codes_of(noise))
        else:
            kernels.cast(cupy.asarray(noise), first)

    def _float_weight(self, state: dict, step) -> tuple:
        """A float convolution's folded (weight, bias) on the device in its precision, made once per engine."""
        key = (step.name, step.precision)
        if key not in self._float_weights:
            self._float_weights[key] = tuple(_to_device(a, DTYPE_ALIASES[step.precision])
                                             for a in conv_step_params(step, state, self.layout))
        return self._float_weights[key]

    def _spec(self, step):
        """A convolution step's ConvSpec: a quantised one's on the graph engine (the only one with 8-bit kernels)."""
        quantized = step.name in self._quantized
        return conv.ConvSpec(stride=step.stride, padding=step.padding, layout=self.layout,
                             precision=self.precision if quantized else step.precision, algo="find",
                             engine="graph" if quantized else self.conv_engine, deterministic=self.deterministic)

    def _view(self, value: int, batch: int):
        """Value `value` for a batch of `batch`: the leading bytes of its buffer, in its dtype and the layout."""
        v = self.plan.values[value]
        c, h, w = v.shape
        shape = (batch, h, w, c) if self.layout == "NHWC" else (batch, c, h, w)
        flat = self._arena[self.buffers.buffer_of[value]][: batch * v.bytes_per_sample]
        return flat.view(VALUE_DTYPES[v.dtype]).reshape(shape)

    def _warm_up(self, batch: int) -> int:
        """Run the forward of `batch` once eagerly, deciding fused or unfused per convolution; returns the largest
        workspace its convolutions need."""
        forward = self._forwards[batch]
        workspace = 0
        for step, call in zip(self.plan.steps, forward.calls, strict=True):
            if step.name in forward.quantized_calls:  # its kernel chosen (and cuDNN's plan found) as it runs
                self.kernel_choice.decide(step.name, batch, call)
                continue
            if step.name not in forward.conv_calls:  # pools, casts, quantise steps
                call()
                continue
            entry = decide_fusion(forward.conv_calls[step.name], self._specs[step.name], tune=self.tune_fusion)
            self.fused_paths[(step.name, batch)] = entry["fused_path"] if entry else ""
            workspace = max(workspace, int(entry["workspace"]) if entry else 0)
        return workspace

    def _capture_all(self) -> None:
        import cupy

        self._hold = WorkspaceHold()
        try:
            for batch in self.batch_sizes:
                stream = cupy.cuda.Stream(non_blocking=True)
                graph, _, allocated = capture_graph(self._forwards[batch].run, stream, self._pool)
                stream.synchronize()
                self._graphs[batch] = graph
                self.capture_allocated_bytes += allocated
        except Exception as e:  # an op that cannot be captured: say so, and run eagerly
            self.capture_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"InferenceEngine: CUDA-graph capture failed, the forward runs eagerly "
                          f"({self.capture_error})", RuntimeWarning, stacklevel=3)
            self._graphs = {}
            self._hold.release()
            self._hold = None
            self.cuda_graph = False


def _to_device(array: np.ndarray, dtype: str):
    """A float64 host array on the device in storage dtype `dtype`: rounded to float32 on the host, then (fp16,
    bf16) to the dtype by kernels.cast, the rounding every low-precision copy in the package gets."""
    import cupy

    a32 = cupy.asarray(np.ascontiguousarray(array, dtype=np.float32))
    if dtype == "fp32":
        return a32
    return kernels.cast(a32, cupy.empty(a32.shape, dtype=ARRAY_DTYPES[dtype]))
