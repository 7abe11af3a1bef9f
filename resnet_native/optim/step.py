"""One training step: zero_grad, forward, softmax cross-entropy, backward, (loss scaling,) optimizer step.

    step = TrainStep(model, optimizer, label_smoothing=0.1, scaler=GradScaler(), cuda_graph=True)
    loss, correct = step(x, labels)       # device scalars (copies); nothing is read back to the host
    step.run(x, labels)                   # the same step; its loss and correct count go to the totals
    loss_sum, correct_sum, seen = step.read_totals(reset=True)    # host numbers: one synchronisation
    totals = step.take_totals()           # the same, and the reset, queued; totals.result() waits for them alone

A step has a host half (optimizer.prepare_step: the step count and a schedule's hyperparameters written into
device scalars) and a device half that allocates nothing and never synchronises, so the device half can be
captured once per input shape in a CUDA graph and replayed (cuda_graph=True): a few launches per step instead of
a few hundred Python-driven ones. The TrainStep docstring says how capture, memory and data parallelism work.
"""

import contextlib
import warnings

import numpy as np

from .._core.capture import WorkspaceHold, capture_graph, graph_buffers, launch_ordered
from .._core.readback import DeviceValues
from ..nn.layers import BatchNorm2d
from ..nn.params import gradients_into
from ..ops.losses import SoftmaxCrossEntropy
from .direct_grads import DirectGradients


class _CapturedStep:
    """The graph of one input shape and everything its addresses point into."""

    def __init__(self, graph, x, labels, loss, correct, pool, keep, counted):
        self.graph, self.x, self.labels = graph, x, labels
        self.loss, self.correct = loss, correct
        self.pool = pool  # the cupy MemoryPool its warm-up and capture allocated from
        self.keep = keep  # the layers' buffers at capture time (a cache eviction must not free them)
        self.counted = counted  # modules whose host-side num_batches_tracked a replay advances
        self.workspace_hold = WorkspaceHold()  # released by release(), or when the entry is collected

    def release(self):
        self.workspace_hold.release()


class TrainStep:
    """The step of one model and optimizer; see the module docstring for its use.

    cuda_graph=True, per input shape: the first step runs eagerly (algorithm searches, buffers, workspace growth
    and every lazily created state happen there), the second is captured and replayed, like every later one. The
    graph reads the batch from static buffers it is copied into, on the step's own blocking stream, which orders
    it after the default stream's work (the data pipeline) and before later default-stream work (evaluation). Each
    shape's warm-up and capture allocate from a cupy pool of their own, so no address a graph holds is handed to
    other arrays; the layers' buffers stay referenced and the workspace pool keeps its buffers while graphs live.
    GradScaler.load_state_dict writes into the device arrays a captured step reads, but the growth and backoff
    factors and the interval are baked into the graph: after loading different ones call reset_graphs(). A
    capture that fails warns and the step stays eager; a model on the host always runs eagerly.

    allreduce (a resnet_native.distributed GradientAllReduce) averages the gradients over the ranks after
    backward, before the scaler's checks and the update; with cuda_graph it must be capturable (NcclAllReduce).
    overlap_allreduce=True starts each bucket's all-reduce during backward once its gradients are final
    (distributed/overlap.py); not with synchronized batch norm, whose NCCL sums would then share the communicator
    from a second stream.

    direct_gradients=True (without allreduce): the optimizer reads each low-precision weight gradient where its
    layer wrote it (optim/direct_grads.py), which saves the zeroing, the conversions into the fp32 grads and half
    the bytes the finite check and the update read; the update is the same bit for bit, and those weights' `grad`
    arrays are left as they were.
    """

    def __init__(self, model, optimizer, *, label_smoothing=0.0, scaler=None, cuda_graph=False, allreduce=None,
                 overlap_allreduce=False, direct_gradients=False):
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.loss_fn = SoftmaxCrossEntropy(label_smoothing)
        # Where the model lives (placed on the GPU here unless it already is somewhere); the scaler follows it.
        self.placement = model.ensure_placed()
        if scaler is not None:
            scaler.place(self.placement)
        self.cuda_graph = bool(cuda_graph) and self.placement.on_gpu
        # Data parallel: averages the gradients over the ranks after backward, before the scaler and optimizer.
        self.allreduce = allreduce
        if allreduce is not None and not callable(getattr(allreduce, "average", None)):
            raise TypeError(f"allreduce: expected a GradientAllReduce, got {type(allreduce).__name__}")
        if allreduce is not None and self.cuda_graph and not getattr(allreduce, "capturable", False):
            raise ValueError(f"cuda_graph: {type(allreduce).__name__} cannot be captured in a CUDA graph (it "
                             f"synchronises the host); pass cuda_graph=False, or an NcclAllReduce")
        if not isinstance(overlap_allreduce, bool):
            raise TypeError(f"overlap_allreduce: expected True or False, got {overlap_allreduce!r}")
        if overlap_allreduce and allreduce is None:
            raise ValueError("overlap_allreduce: needs an allreduce to overlap")
        self.overlap_allreduce = overlap_allreduce
        if not isinstance(direct_gradients, bool):
            raise TypeError(f"direct_gradients: expected True or False, got {direct_gradients!r}")
        if direct_gradients and allreduce is not None:
            raise ValueError("direct_gradients: not with an allreduce, which averages the parameters' grads")
        self.direct = DirectGradients(optimizer) if direct_gradients else None
        # The overlapped all-reduce's gradients: the optimizer's parameters in the model's order, whatever order its
        # groups list them in, so the session's reversed plan fills its first bucket with backward's first (any
        # the model does not list keep their order, after the rest).
        position = {id(p): i for i, p in enumerate(model.parameters())}
        self._overlap_params = sorted(optimizer.params, key=lambda p: position.get(id(p), len(position)))
        self._param_index = {id(p): i for i, p in enumerate(self._overlap_params)}

        # Found once: synchronize_batch_norms may switch their sync on after this, so each step looks at them.
        self._batch_norms = [m for _, m in model.named_modules() if isinstance(m, BatchNorm2d)]
        self.capture_error = None  # why capture was abandoned, if it was
        self._graphs = {}  # input key -> _CapturedStep
        self._pools = {}  # input key -> cupy MemoryPool of its warm-up (and then capture)
        self._stream = None
        self._totals = None  # (loss sum, correct sum): float64 arrays of shape (1,), where the step runs
        self._seen = 0

    # -- public ----------------------------------------------------------------------------------------------
    def __call__(self, x, labels):
        """(loss, correct): 0-d device arrays, the batch's mean loss (fp32) and number of correct predictions
        (int32), from the forward pass before this step's update (copies: the caller may keep them)."""
        loss, correct = self.run(x, labels)
        with self._on_stream():
            return loss.copy(), correct.copy()

    def run(self, x, labels):
        """One step. Its loss (times the batch size) and correct count are added to the device totals. Returns
        this step's (loss, correct) buffers, which the next step overwrites."""
        if not self.cuda_graph:
            loss, correct = self._eager(x, labels)
        else:
            loss, correct = self._run_graphed(x, labels)
        self._seen += len(labels)
        return loss, correct

    def read_totals(self, reset: bool = False) -> tuple:
        """(sum of per-batch mean loss x batch size, correct predictions, samples) since the last reset, as host
        numbers (one synchronisation)."""
        if reset:
            return self.take_totals().result()
        loss_sum, correct_sum = self._totals_arrays()
        with self._on_stream():
            return float(loss_sum.reshape(())), float(correct_sum.reshape(())), self._seen

    def take_totals(self):
        """The totals since the last reset, and a reset, without waiting for the device: a DeviceValues whose
        result() is (loss sum, correct sum, samples), read once this step's work so far has run."""
        totals = self._totals_arrays()
        seen, self._seen = self._seen, 0
        with self._on_stream():
            values = DeviceValues(totals, lambda loss, correct: (float(loss[0]), float(correct[0]), seen))
            for a in totals:
                a.fill(0)
        return values

    def reset_graphs(self) -> None:
        """Forget the captured graphs (the next steps warm up and capture again)."""
        for entry in self._graphs.values():
            entry.release()
        self._graphs.clear()
        self._pools.clear()

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    step = __call__

    # -- the device half -------------------------------------------------------------------------------------
    def _eager(self, x, labels):
        self.optimizer.prepare_step()
        return self._device_half(x, labels)

    def _device_half(self, x, labels):
        model, optimizer, scaler, direct = self.model, self.optimizer, self.scaler, self.direct
        if direct is not None:
            direct.zero()
        else:
            optimizer.zero_grad()
        logits = model.forward(x, train=True, copy=False)
        loss, correct = self.loss_fn.forward(logits, labels, train=True, totals=self._totals_arrays())
        scale = scaler.scale_array if scaler is not None and scaler.enabled else None
        dlogits = self.loss_fn.backward(scale)
        # The all-reduce comes before the scaler's inf check: every rank then skips alike.
        if self.allreduce is not None and self.overlap_allreduce:
            self._backward_overlapped(dlogits)
        elif direct is not None:
            with gradients_into(direct):
                model.backward(dlogits)
            direct.finish()
        else:
            model.backward(dlogits)
            if self.allreduce is not None:
                self.allreduce.average([p.grad for p in optimizer.params])
        try:
            if scaler is not None:
                scaler.launch_step(optimizer)
                scaler.update()
            else:
                optimizer.launch_step()
        finally:
            if direct is not None:
                direct.release()
        return loss, correct

    def _backward_overlapped(self, dlogits) -> None:
        if any(m.sync is not None for m in self._batch_norms):
            raise ValueError("overlap_allreduce: not with synchronized batch norm (its NCCL sums would share the "
                             "communicator from a second stream)")
        session = self.allreduce.overlapping([p.grad for p in self._overlap_params])
        index = self._param_index
        self.model.backward(dlogits, on_ready=lambda params: session.ready([index[id(p)] for p in params
                                                                            if id(p) in index]))
        session.finish()

    def _totals_arrays(self):
        if self._totals is None:
            self._totals = tuple(self.placement.xp.zeros((1,), dtype=np.float64) for _ in range(2))
        return self._totals

    # -- CUDA graphs -----------------------------------------------------------------------------------------
    def _on_stream(self):
        return self._stream if self._stream is not None else contextlib.nullcontext()

    def _run_graphed(self, x, labels):
        import cupy

        if self._stream is None:
            # Blocking (not non_blocking): it synchronises with the legacy default stream the data pipeline and
            # evaluation use, so no explicit events are needed.
            self._stream = cupy.cuda.Stream(non_blocking=False)
        key = (tuple(x.shape), np.dtype(x.dtype).str, tuple(labels.shape), np.dtype(labels.dtype).str)
        with self._stream:
            entry = self._graphs.get(key)
            if entry is None and key not in self._pools:
                self._pools[key] = pool = cupy.cuda.MemoryPool()
                with cupy.cuda.using_allocator(pool.malloc):
                    return self._eager(x, labels)
            if entry is None:
                entry = self._capture(key, x, labels)
                if entry is None:  # capture failed: eager from now on
                    return self._eager(x, labels)
            cupy.copyto(entry.x, x)
            cupy.copyto(entry.labels, labels)
            self.optimizer.prepare_step()
            launch_ordered(entry.graph, self._stream)
            for m in entry.counted:
                m.num_batches_tracked += 1
            return entry.loss, entry.correct

    def _capture(self, key, x, labels):
        import cupy

        model, stream, pool = self.model, self._stream, self._pools[key]
        static_x = cupy.empty(x.shape, dtype=x.dtype)
        static_labels = cupy.empty(labels.shape, dtype=labels.dtype)
        counted = [m for _, m in model.named_modules() if hasattr(m, "num_batches_tracked")]
        tracked = [m.num_batches_tracked for m in counted]
        scaler_state = getattr(self.scaler, "_unscaled", None)
        try:
            graph, (loss, correct), _ = capture_graph(lambda: self._device_half(static_x, static_labels), stream, pool)
        except Exception as e:  # an op that cannot be captured: say so, and train eagerly
            self.capture_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"TrainStep: CUDA-graph capture failed, the step stays eager ({self.capture_error})",
                          RuntimeWarning, stacklevel=3)
            self.cuda_graph = False
            model.forget_saved()
            return None
        finally:
            # Capturing ran the host side of the step once without executing it on the device.
            for m, n in zip(counted, tracked, strict=True):
                m.num_batches_tracked = n
            if scaler_state is not None:
                self.scaler._unscaled = scaler_state
        entry = _CapturedStep(graph, static_x, static_labels, loss, correct, pool, graph_buffers(model, self.loss_fn),
                              counted)
        self._graphs[key] = entry
        return entry
