"""Activation buffers shared by liveness: values whose lifetimes do not overlap take turns in one buffer.

A value lives from the step that writes it (the input: before the first step) to the last step that reads it (the
logits: past the last step, the caller reads them). Two values may share a buffer only when one's life ends before
the other's begins; a step's output is therefore never in the buffer of one of its own inputs, which the ops
require (an output must not overlap its inputs). Assignment is greedy in step order, best fit by size: a value
takes the smallest free buffer that holds it, else grows the largest free one, else opens a new buffer. Sizes are
bytes per sample: every value scales with the batch, so one assignment serves every batch size, and buffers
allocated for the largest batch serve the smaller ones through their leading bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BufferAssignment:
    buffer_of: tuple  # value index -> buffer index
    sizes: tuple  # buffer index -> bytes per sample (the largest value it holds)

    @property
    def bytes_per_sample(self) -> int:
        return sum(self.sizes)


def live_ranges(plan) -> list:
    """[(first, last)] per value of the plan: the step that writes it (-1: the input) and the last step that
    reads it (len(steps): the logits, read after the forward)."""
    n_steps = len(plan.steps)
    first = [None] * len(plan.values)
    last = [None] * len(plan.values)
    first[plan.input] = -1
    for i, step in enumerate(plan.steps):
        if first[step.out] is not None:
            raise ValueError(f"plan: value {step.out} is written twice (step {step.name})")
        first[step.out] = i
        for v in step.inputs:
            if first[v] is None:
                raise ValueError(f"plan: step {step.name} reads value {v} before it is written")
            last[v] = i
    last[plan.output] = n_steps
    ranges = []
    for v, (f, ls) in enumerate(zip(first, last, strict=True)):
        if f is None:
            raise ValueError(f"plan: value {v} is never written")
        ranges.append((f, f if ls is None else ls))
    return ranges


def assign_buffers(sizes, ranges) -> BufferAssignment:
    """Buffers for values of `sizes` (bytes per sample) live over `ranges` ([(first, last)], inclusive)."""
    if len(sizes) != len(ranges):
        raise ValueError(f"sizes and ranges: expected one of each per value, got {len(sizes)} and {len(ranges)}")
    buffer_sizes = []
    busy_until = []  # buffer index -> last step of the value in it
    buffer_of = [None] * len(sizes)
    for v in sorted(range(len(sizes)), key=lambda i: ranges[i][0]):
        first, last = ranges[v]
        need = int(sizes[v])
        free = [b for b in range(len(buffer_sizes)) if busy_until[b] < first]
        fitting = [b for b in free if buffer_sizes[b] >= need]
        if fitting:
            b = min(fitting, key=lambda i: buffer_sizes[i])
        elif free:
            b = max(free, key=lambda i: buffer_sizes[i])
            buffer_sizes[b] = need
        else:
            b = len(buffer_sizes)
            buffer_sizes.append(need)
            busy_until.append(last)
        busy_until[b] = last
        buffer_of[v] = b
    return BufferAssignment(tuple(buffer_of), tuple(buffer_sizes))


def plan_buffers(plan) -> BufferAssignment:
    """assign_buffers for every value of the plan."""
    return assign_buffers([v.bytes_per_sample for v in plan.values], live_ranges(plan))
