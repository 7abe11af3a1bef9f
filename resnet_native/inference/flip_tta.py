"""Flip test-time augmentation on the engine: each chunk's staged input, mirrored, run through the same captured
forward again, its logits averaged with the first run's.

The mirror is taken after the input stage, from the staged buffer the graph reads (any input kind: uint8 images,
float batches in either layout, an 8-bit engine's padded codes), into a scratch buffer of the largest batch made
once with the engine, before the first replay: the forward reuses the input's buffer for later values
(buffers.py), so the staged input does not survive it. After the replay the mirror is staged again: two copies,
no allocation, no host synchronisation. Flipping the normalised values is the same as normalising the flipped
pixels, since the normalisation is per pixel.
"""

from __future__ import annotations

from .._core.names import TTA_MODES, choice
from ..ops import kernels


def tta_mode(value) -> str:
    """'none' or 'flip' (None: 'none'); ValueError naming `tta` otherwise."""
    return choice("tta", "none" if value is None else value, TTA_MODES)


class FlipAverage:
    """Scratch for mirroring the staged inputs of an engine whose largest staged input is `largest_input` (a
    (batch, ...) device array in the engine's layout: width is axis 2 of NHWC, axis 3 of NCHW)."""

    def __init__(self, largest_input, layout: str):
        import cupy

        self.scratch = cupy.empty_like(largest_input)
        self.width_axis = 2 if layout == "NHWC" else 3

    def keep_mirror(self, staged) -> None:
        """Keep the rows of `staged` (a leading slice of a staged input buffer) mirrored left to right, before the
        forward runs over it."""
        import cupy

        flipped = staged[:, :, ::-1] if self.width_axis == 2 else staged[:, :, :, ::-1]
        cupy.copyto(self.scratch[: staged.shape[0]], flipped)

    def stage_mirror(self, staged) -> None:
        """Write the kept mirror back into `staged` (the same slice keep_mirror read) for the second replay."""
        import cupy

        cupy.copyto(staged, self.scratch[: staged.shape[0]])

    @staticmethod
    def average(out, logits) -> None:
        """out = (out + logits) / 2 in float32, in place: out holds the first view's logits."""
        import cupy

        kernels.add(out, logits, out=out)
        cupy.multiply(out, 0.5, out=out)
