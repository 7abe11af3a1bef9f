"""How the engine covers a caller's batch with its captured batch sizes."""

from __future__ import annotations

import bisect


def batch_chunks(n: int, batch_sizes: tuple, split: bool) -> list:
    """[(start, count, captured batch size)] covering a batch of n: one chunk padded to the smallest captured size
    that holds it, or (split) chunks of the largest size and the rest padded likewise."""
    if n == 0:
        return []
    largest = batch_sizes[-1]
    if n > largest and not split:
        raise ValueError(f"x: a batch of {n} is over the largest captured batch size {largest} and split=False "
                         f"(pass split=True, or build the engine with a batch size of at least {n})")
    chunks, start = [], 0
    while n - start > largest:
        chunks.append((start, largest, largest))
        start += largest
    rest = n - start
    chunks.append((start, rest, batch_sizes[bisect.bisect_left(batch_sizes, rest)]))
    return chunks
