"""Seeded generators: one independent stream per (seed, epoch, purpose), the same on every rank and every run."""

from __future__ import annotations

import numpy as np


def epoch_rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    """The generator of one (seed, epoch, purpose): independent of every other epoch and purpose."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), int(stream)]))
