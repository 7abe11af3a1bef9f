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
    DTYPE_ALIASES,
    ENGINES,
    LAYOUTS,
    PRECISIONS,
    QUANT_PRECISIONS,
    choice,
    flag,
    precision_argument,
    whole_numbers,
)
from .._core.runtime import require_gpu
from ..data.tta_views import tta_mode
from ..ops import conv, own_conv
from ..ops.workspace import reserve_workspace
from ..quantization.prefix import AUTO, FLOAT, QUANTIZE_FROM, fastest, quantize_from_choices
from . import choice_cache
from .batching import batch_chunks
from .binding import Binder
from .input_stage import as_device_array
from .kernel_choice import QUANTIZED_KERNELS, KernelChooser
from .plan import build_plan
from .quantized import PREFIX_PRECISION, checked_scales, quantized_convs, quantized_plan
from .source import model_source, release_calibration
from .timing import forward_ms
from .tta import ViewAverage
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
        'auto': per batch size, each candidate and 'float' (no 8-bit part: the fp16 engine's plan, so no batch
        size is slower than fp16) built and graph-timed, the fastest kept, 'float' unless an 8-bit one is at least
        3% faster (prefix.fastest; engine.quantize_from_by_batch
        {batch: choice}, engine.quantize_from the largest batch size's, quantize_from_times {batch: {candidate:
        ms}}, quantize_from_source 'timed' or 'cache': with algorithm_cache the file's stored choices of the same
        problem, choice_cache.choice_key, are reused). When any batch size chose 'stem', the engine takes uint8
        images only, at every batch size.
        quantized_kernels: which kernel runs each int8 convolution ('auto' timed per layer and batch size, 'own',
        'cudnn': kernel_choice.py); engine.kernel_choice records what was chosen and why.
        'stem' is the default: the calibrations' measured accuracy is for it, and the choice does not depend on a
        timing. tta='flip': the mean of the logits of each image and its mirror image; 'flip-shift': those two and
        their copies shifted a pixel diagonally each way (data/tta_views.py; tta.py: each view of the staged input
        replayed, so 2 or 6 times the forward's latency); None or 'none': the logits alone. dtype: the deprecated
        name of precision."""
        self._graphs, self._hold, self._pool, self._closed, self._bindings = {}, None, None, False, {}
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
        # The plan the engine computes in (a quantised engine's: the fp32 plan its calibration's scales are keyed
        # by); the plans the engine runs are its Bindings' (binding.py).
        self._base_plan = build_plan(source.state, source.stem, float_precision, image_size)
        self._float_plan = None  # quantize_from='auto''s FLOAT candidate's
        self.calibration = None
        self.quantize_from = choice("quantize_from", quantize_from, QUANTIZE_FROM + (AUTO,))
        self.quantize_from_by_batch = {}  # batch size -> where its 8-bit part begins (quantised engines)
        self.quantize_from_times = {}  # 'auto': batch size -> {candidate: median ms}
        self.quantize_from_source = None  # 'auto': 'timed', or 'cache' (the algorithm_cache file's choices)
        if self.quantized:
            self.calibration = (calibration if calibration is not None
                                else release_calibration(model_or_release, models_dir, self.precision, source))
            self._candidates = ((self.quantize_from,) if self.quantize_from != AUTO else
                                tuple(q for q in quantize_from_choices(self._base_plan) if q != "stem" or
                                      self._base_plan.stem == "cifar") + (FLOAT,))
            # A bad quantize_from or calibration fails here, before the GPU; the Binder makes the chosen plans.
            checked_scales(self._base_plan, self.calibration, self.precision)
            for candidate in self._candidates:
                if candidate != FLOAT:
                    quantized_plan(self._base_plan, self.precision, candidate)
            if FLOAT in self._candidates:
                self._float_plan = build_plan(source.state, source.stem, PREFIX_PRECISION, image_size)
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
        self.num_classes = self._base_plan.num_classes
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
        n = int(x.shape[0])
        chunks = batch_chunks(n, self.batch_sizes, self.split)
        # Every binding checks the input, whichever the chunks use: what the engine takes does not depend on the
        # batch size (a 'stem' plan takes uint8 images only), and nothing is written before all agree.
        kinds = {key: b.input.kind_of(x) for key, b in {id(b): b for b in self._bindings.values()}.items()}
        out = self._output(out, n)
        if not chunks:
            return out
        stream = cupy.cuda.get_current_stream()
        if self._last_stream is not None and self._last_stream != stream.ptr:
            stream.wait_event(self._done)
        for start, count, batch in chunks:
            binding = self._bindings[batch]
            forward = binding.forwards[batch]
            binding.input.write(x[start:start + count], kinds[id(binding)], forward.input[:count])
            views = binding.views
            if views is None:
                self._replay_chunk(forward, count, stream)
                cupy.copyto(out[start:start + count], forward.logits[:count])
                continue
            views.keep(forward.input[:count])  # before the replay, which reuses the input's buffer
            self._replay_chunk(forward, count, stream)
            views.first(out[start:start + count], forward.logits[:count])
            for index in range(1, len(views.views)):  # each further view through the same forward
                views.stage(index, forward.input[:count])
                self._replay_chunk(forward, count, stream)
                views.add(index, out[start:start + count], forward.logits[:count])
        self._done.record(stream)
        self._last_stream = stream.ptr
        return out

    def _replay_chunk(self, forward, count: int, stream) -> None:
        if count < forward.batch:  # padding rows: zeros, not whatever bits (NaN included) the buffer last held
            forward.input[count:].fill(0)
        self._replay(forward.batch, stream)

    def _replay(self, batch: int, stream) -> None:
        if self.cuda_graph:
            launch_ordered(self._graphs[batch], stream)
        else:
            self._bindings[batch].forwards[batch].run()

    @property
    def plan(self):
        """The plan the largest batch size runs (inference/plan.py; a quantised engine's, quantized.py)."""
        return self._bindings[self.batch_sizes[-1]].plan if self._bindings else self._base_plan

    @property
    def input_shape(self) -> tuple:
        """The per-sample shape of a normalised input, in the engine's layout (uint8 images are (H, W, 3))."""
        return self._bindings[self.batch_sizes[-1]].input.sample_shape

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
        self._bindings = {}
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
            by_batch = self.quantize_from_by_batch
            shown = self.quantize_from if len(set(by_batch.values())) <= 1 else by_batch
            auto = f" (auto, {self.quantize_from_source})" if self.quantize_from_source else ""
            kernels = ", ".join(f"{k}: {n}" for k, n in self.kernel_choice.summary().items())
            quantized = f", quantize_from={shown!r}{auto}, kernels=({kernels})"
        tta = f", tta={self.tta!r}" if self.tta != "none" else ""
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
        # Activations get buffers for each Binding's largest batch size from the engine's own pool (smaller batch
        # sizes use their leading bytes); BN is folded in float64 on the host and rounded once to the storage dtype.
        import cupy

        self._device = cupy.cuda.runtime.getDevice()
        self._pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(self._pool.malloc):
            # Every step's quantised operands once ('stem''s are every quantize_from's): candidates share them.
            binder = Binder(state, self._base_plan, precision=self.precision, layout=self.layout,
                            conv_engine=self.conv_engine, deterministic=self.deterministic, quantized=self.quantized,
                            float_plan=self._float_plan, calibration=self.calibration,
                            all_quantized=None if not self.quantized else quantized_convs(
                                self._base_plan, state, self.calibration, self.precision, cupy.asarray))
            stored = {}
            if self.algorithm_cache is not None and os.path.exists(self.algorithm_cache):
                # The choices first: a malformed section raises before the conv entries are added.
                stored = choice_cache.load_choices(self.algorithm_cache)
                conv.load_algorithm_cache(self.algorithm_cache)
            self.kernel_choice.stored = {k: v for k, v in stored.items() if "kernel" in v}

            if self.quantize_from == AUTO:
                self._choose_quantize_from(binder, stored)
            elif self.quantized:
                self.quantize_from_by_batch = dict.fromkeys(self.batch_sizes, self.quantize_from)
            groups = {}  # one Binding per choice, for the batch sizes that chose it
            for batch in self.batch_sizes:
                groups.setdefault(self.quantize_from_by_batch.get(batch), []).append(batch)
            for chosen, sizes in groups.items():
                binding = binder.bind(chosen, sizes)
                self._bindings.update(dict.fromkeys(sizes, binding))
            binder = None  # the rejected candidates' operands go,
            self._pool.free_all_blocks()  # and with them the prefix's 8-bit operands and 'auto''s buffers
            workspace = max(self._warm_up(b) for b in self.batch_sizes)
            reserve_workspace(workspace)
            if self.cuda_graph:
                self._capture_all()
            if self.tta != "none":
                for sizes in groups.values():
                    binding = self._bindings[sizes[-1]]
                    largest = binding.forwards[sizes[-1]].input
                    binding.views = ViewAverage(self.tta, largest, self.layout, self._black_pixel(binding, largest))
        cupy.cuda.get_current_stream().synchronize()
        if self.algorithm_cache is not None:
            conv.save_algorithm_cache(self.algorithm_cache)  # keeps the file's choices (this machine's)
            timed = dict(self.kernel_choice.timed)
            if self.quantize_from_source == "timed":
                timed.update({self._choice_key(b): (self.quantize_from_by_batch[b], self.quantize_from_times[b])
                              for b in self.batch_sizes})
            if timed:
                choice_cache.store_choices(self.algorithm_cache, timed)
        self._done = cupy.cuda.Event(disable_timing=True)
        self._last_stream = None
        if self.tta != "none":  # compiles the views' copy kernels now rather than in the first calls
            _, height, width = self._base_plan.values[self._base_plan.input].shape
            for sizes in groups.values():
                self(cupy.zeros((sizes[0], height, width, 3), np.uint8))
            cupy.cuda.get_current_stream().synchronize()

    @staticmethod
    def _black_pixel(binding, largest):
        """A black image's pixel as the binding's input stage writes it (its first row of `largest`, overwritten
        by every call), shaped to broadcast against a staged batch: what a shifted view brings in."""
        import cupy

        stage = binding.input
        black = cupy.zeros((1, stage.height, stage.width, 3), np.uint8)
        stage.write(black, stage.kind_of(black), largest[:1])
        return (largest[:1, :1, :1, :] if binding.layout == "NHWC" else largest[:1, :, :1, :1]).copy()

    def _choice_key(self, batch: int) -> str:
        return choice_cache.choice_key(self._base_plan, dtype=self.precision, batch=batch,
                                       cuda_graph=self.cuda_graph, candidates=self._candidates,
                                       conv_engine=self.conv_engine, deterministic=self.deterministic,
                                       tune_fusion=self.tune_fusion)

    def _choose_quantize_from(self, binder: Binder, stored: dict) -> None:
        """'auto': the stored choices of this problem when the file has every batch size's, else each candidate
        bound at every batch size and timed, the fastest kept per batch size (prefix.fastest: the fp16 plan unless an
        8-bit candidate is clearly faster)."""
        import cupy

        keys = {b: self._choice_key(b) for b in self.batch_sizes}
        if all(key in stored for key in keys.values()):
            for b, key in keys.items():
                self.quantize_from_by_batch[b] = stored[key]["quantize_from"]
                self.quantize_from_times[b] = dict(stored[key]["times_ms"])
            self.quantize_from_source = "cache"
        else:
            for candidate in self._candidates:
                binding = binder.bind(candidate, self.batch_sizes)
                self._bindings = dict.fromkeys(self.batch_sizes, binding)
                for b in self.batch_sizes:
                    reserve_workspace(self._warm_up(b))
                    cupy.cuda.get_current_stream().synchronize()
                    self.quantize_from_times.setdefault(b, {})[candidate] = forward_ms(
                        binding.forwards[b], self._pool, self.cuda_graph)
                self._bindings, binding = {}, None  # the next candidate's buffers reuse the memory
            self.quantize_from_by_batch = {b: fastest(times) for b, times in self.quantize_from_times.items()}
            self.quantize_from_source = "timed"
            self.fused_paths = {}
            self.kernel_choice.forget_steps()  # the chosen candidates' binds record their own
        self.quantize_from = self.quantize_from_by_batch[self.batch_sizes[-1]]

    def _warm_up(self, batch: int) -> int:
        """Run the forward of `batch` once eagerly, deciding fused or unfused per convolution; returns the largest
        workspace its convolutions need."""
        binding = self._bindings[batch]
        forward = binding.forwards[batch]
        workspace = 0
        for step, call in zip(binding.plan.steps, forward.calls, strict=True):
            if step.name in forward.quantized_calls:  # its kernel chosen (and cuDNN's plan found) as it runs
                self.kernel_choice.decide(step.name, batch, call)
                continue
            if step.name not in forward.conv_calls:  # pools, casts, quantise steps
                call()
                continue
            entry = decide_fusion(forward.conv_calls[step.name], binding.specs[step.name], tune=self.tune_fusion)
            self.fused_paths[(step.name, batch)] = entry["fused_path"] if entry else ""
            workspace = max(workspace, int(entry["workspace"]) if entry else 0)
        return workspace

    def _capture_all(self) -> None:
        import cupy

        self._hold = WorkspaceHold()
        try:
            for batch in self.batch_sizes:
                stream = cupy.cuda.Stream(non_blocking=True)
                graph, _, allocated = capture_graph(self._bindings[batch].forwards[batch].run, stream, self._pool)
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

