"""Overlapping the gradient all-reduce with backward: one session per step.

    session = allreduce.overlapping(grads)      # grads: every parameter's gradient, in the optimizer's order
    model.backward(dlogits, on_ready=...)       # calls session.ready(indices) as groups of gradients become final
    session.finish()                            # every gradient averaged (on the step's stream from here on)

Gradients become final in reverse order (the classifier's first, the stem's last), so a session plans its buckets
over the reversed list: the first bucket fills first and its all-reduce starts while backward still runs on the
stages below. DeferredOverlap (every GradientAllReduce's default, the Store's) overlaps nothing; StreamOverlap
(NcclAllReduce's) reduces each ready bucket on a communication stream, also inside a captured step.
"""

from __future__ import annotations

from collections.abc import Sequence


class DeferredOverlap:
    """No overlap: ready() only checks its indices, finish() averages everything at once (average(grads): the
    same results and calls as without a session)."""

    def __init__(self, allreduce, grads: Sequence):
        self.allreduce, self.grads = allreduce, list(grads)
        self.finished = False

    def ready(self, indices) -> None:
        for i in indices:
            if not 0 <= i < len(self.grads):
                raise IndexError(f"indices: {i} is not a gradient of this session (0..{len(self.grads) - 1})")

    def finish(self) -> None:
        if self.finished:
            raise RuntimeError("overlap session: finish() called twice")
        self.finished = True
        self._complete()

    def _complete(self) -> None:
        self.allreduce.average(self.grads)


class StreamOverlap(DeferredOverlap):
    """NcclAllReduce's buckets on a communication stream as soon as their gradients are final.

    Each bucket is ordered after the gradients' writes by an event recorded on the step's stream; finish() makes
    the step's stream wait for the communication stream. Inside a CUDA-graph capture the events fork and join the
    captured graph, so the replay overlaps the same way. The events and the stream are made once per plan, before
    capture (the first, eager step); the buckets' buffers by NcclAllReduce's plan."""

    def __init__(self, allreduce, grads: Sequence):
        import cupy

        super().__init__(allreduce, grads)
        # Reverse order: the order backward finishes them; the plan (and its buffers) are kept by the all-reduce.
        self.order = list(range(len(self.grads)))[::-1]
        self.reordered = allreduce._prepare([self.grads[i] for i in self.order])
        self.step_stream = cupy.cuda.get_current_stream()
        plan = allreduce._plan
        self.comm_stream, self.events = allreduce._overlap_resources()
        self.bucket_of = {}
        self.missing = []
        for b, bucket in enumerate(plan.buckets):
            self.missing.append(len(bucket))
            for pos in bucket:
                self.bucket_of[self.order[pos]] = b
        self.seen = set()
        self.launched = [False] * len(plan.buckets)

    def ready(self, indices) -> None:
        super().ready(indices)
        for i in indices:
            if i in self.seen:
                continue
            self.seen.add(i)
            b = self.bucket_of[i]
            self.missing[b] -= 1
            if self.missing[b] == 0:
                self._launch(b)

    def _launch(self, b: int) -> None:
        if self.launched[b]:
            return
        self.launched[b] = True
        event = self.events[b]
        event.record(self.step_stream)  # the bucket's gradients are written by now, on the step's stream
        self.comm_stream.wait_event(event)
        with self.comm_stream:
            self.allreduce._reduce_bucket(b, self.reordered, self.comm_stream)

    def _complete(self) -> None:
        for b in range(len(self.launched)):  # any bucket whose gradients were never reported: now
            self._launch(b)
        join = self.events[-1]
        join.record(self.comm_stream)
        self.step_stream.wait_event(join)


__all__ = ["DeferredOverlap", "StreamOverlap"]
