"""An epoch's device work, queued before the host reads the epoch before it.

Reading an epoch's figures synchronises the host with the GPU, which would then idle while the host logs,
checkpoints and uploads. So the trainer queues epoch k+1 (upload, steps, their totals, evaluation, checkpoint
staging) first and only then reads epoch k's figures, each read waiting on an event of its own
(_core.readback.DeviceValues). A checkpoint after epoch k must not see epoch k+1's updates: its arrays, device
scalars included, are copied when epoch k is queued (training/snapshot.py) and the host's state read at the same
moment. Whether it is written depends on the test accuracy, known only when the epoch is read, so an epoch is
staged whenever its checkpoint is due or it is evaluated; an unused one is released.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._core.readback import reserve_slots


@dataclass
class QueuedEpoch:
    """One epoch's queued work: the events around its steps and the values to read once they have run."""

    epoch: int
    lr: float  # at the epoch's start
    start: Any  # cupy Events, recorded before the first step and after the last
    end: Any
    totals: Any  # DeviceValues: (loss sum, correct sum, samples)
    test: Any = None  # DeviceValues: (mean loss, accuracy[, the three TTA figures]) when the epoch is evaluated
    staged: Any = None  # PendingSnapshot of the arrays, when the epoch may be checkpointed
    host_state: dict | None = None  # the host's part of that state, read when the epoch was queued
    previous_end: Any = None  # the end event of the epoch queued before this one
    image_size: int = 32  # the side of its training images (progressive resizing downscales the early epochs')

    def training_figures(self) -> tuple[float, float, float]:
        """(mean loss, accuracy, seconds between the first step's start and the last step's end on the GPU)."""
        import cupy

        loss_sum, correct_sum, seen = self.totals.result()
        self.end.synchronize()
        return loss_sum / seen, correct_sum / seen, cupy.cuda.get_elapsed_time(self.start, self.end) / 1e3

    def test_figures(self) -> tuple:
        """(mean loss, accuracy) on the test set, followed with flip TTA by (TTA mean loss, TTA accuracy, seconds of
        the mirrored pass); (None, None) when the epoch was not evaluated."""
        return self.test.result() if self.test is not None else (None, None)

    def seconds_before(self) -> float:
        """GPU seconds from the last step of the epoch before (its end event: previous_end) to this epoch's first
        step: that epoch's evaluation and checkpoint copies, any wait for this one's upload (a side stream's, normally
        done by then), and any wait for the host. Once training_figures() has been read."""
        import cupy

        if self.previous_end is None:
            return 0.0
        return cupy.cuda.get_elapsed_time(self.previous_end, self.start) / 1e3

    def release(self) -> None:
        """Give the staged copies back unwritten."""
        if self.staged is not None:
            self.staged.release()
            self.staged = None


# Snapshots in flight at once while queuing one epoch ahead: the one just staged, the epoch before's (not yet
# read) and the one the checkpoint writer is writing. (A fourth, queued behind a slow write, allocates.)
SNAPSHOTS_IN_FLIGHT = 3


def reserve_buffers(snapshots, sources, device) -> None:
    """Allocate now what the queued loop would otherwise allocate in its first epochs: page-locked and device
    memory, whose allocation synchronises with the device and so would drain the queue. The read-back slots, and
    (sources: state_sources(), on rank 0) the checkpoints' buffers. device: the GPU's id (the caller's; this may
    run on another thread), None for a model on the host (nothing to reserve)."""
    import cupy


    if device is None:
        return
    with cupy.cuda.Device(device):
        reserve_slots()
        if sources is not None:
            snapshots.reserve(sources, SNAPSHOTS_IN_FLIGHT)


def state_sources(parts) -> dict:
    """{group: {name: (array, to_host)}}: every array a checkpoint holds, uncopied."""
    groups = {"model": parts.model.state_sources(), "optimizer": parts.optimizer.state_sources()}
    if parts.scaler is not None:
        groups["scaler"] = parts.scaler.state_sources()
    groups.update({field: net.state_sources() for field, net in parts.model_copies.items()})
    return groups


def stage_state(parts, snapshots) -> tuple:
    """(PendingSnapshot of every array a checkpoint holds, the host's part of the state) as the queue stands now:
    the arrays are copied in stream order, after the work queued so far."""
    scaler = parts.scaler
    groups = state_sources(parts)
    host = {"optimizer": parts.optimizer.state_header(),
            "schedule": parts.schedule.state_dict() if parts.schedule is not None else None,
            "scaler": scaler.state_header() if scaler is not None else None}
    return snapshots.take(groups), host


def record_event():
    """An event with timing, recorded on the current stream."""
    import cupy

    return cupy.cuda.get_current_stream().record(cupy.cuda.Event())
