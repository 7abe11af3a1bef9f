"""Gradient all-reduce buckets, planned on the host: which parameters' gradients travel together, and where
each lies in its bucket's flat buffer. Backward produces gradients from the last layer to the first, so buckets
are filled in reverse parameter order: the first bucket is complete, and its all-reduce can start, earliest.

Sizes are counted with each gradient's start aligned to ALIGN bytes inside the flat buffer (the alignment cuDNN
and NCCL kernels read fastest), so a bucket's buffer never exceeds bucket_bytes, except a bucket holding one
parameter larger than bucket_bytes on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._core.names import bounded_int

ALIGN = 256
MAX_BYTES = 2**62


def _aligned(n: int, align: int) -> int:
    return -(-n // align) * align


def _checked_sizes(sizes_bytes) -> list[int]:
    if isinstance(sizes_bytes, str | bytes) or not isinstance(sizes_bytes, Sequence):
        raise TypeError(f"sizes_bytes: expected a sequence of byte counts, got {type(sizes_bytes).__name__}")
    return [bounded_int(f"sizes_bytes[{i}]", s, 0, MAX_BYTES, "bytes") for i, s in enumerate(sizes_bytes)]


def plan_buckets(sizes_bytes: Sequence[int], bucket_bytes: int, reverse: bool = True,
                 align: int = ALIGN) -> list[list[int]]:
    """Parameter indices grouped into buckets, in the order they fill: parameters are taken last to first
    (reverse=True, the order backward produces gradients; False: first to last) and a bucket is closed when
    the next one would take its aligned size past bucket_bytes. Every index appears exactly once."""
    sizes = _checked_sizes(sizes_bytes)
    bucket_bytes = bounded_int("bucket_bytes", bucket_bytes, 1, MAX_BYTES, "bytes")
    align = bounded_int("align", align, 1, 1 << 20, "bytes")
    if not isinstance(reverse, bool):
        raise TypeError(f"reverse: expected a bool, got {reverse!r}")
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in (reversed(range(len(sizes))) if reverse else range(len(sizes))):
        need = _aligned(sizes[i], align)
        if current and used + need > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used += need
    if current:
        buckets.append(current)
    return buckets


def bucket_offsets(sizes_bytes: Sequence[int], bucket: Sequence[int], align: int = ALIGN) -> tuple[list[int], int]:
    """(offsets, total): the byte offset of each of bucket's parameters inside its flat buffer, in bucket's order,
    each a multiple of align, and the buffer's size (the end of the last one, rounded up to align)."""
    sizes = _checked_sizes(sizes_bytes)
    align = bounded_int("align", align, 1, 1 << 20, "bytes")
    offsets = []
    end = 0
    for i in bucket:
        i = bounded_int("bucket index", i, 0, len(sizes) - 1, "parameter indices")
        offsets.append(end)
        end += _aligned(sizes[i], align)
    return offsets, end
