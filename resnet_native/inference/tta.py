"""Test-time augmentation on the engine: each chunk's staged input run through the same captured forward once per
view of its mode (data/tta_views.py), the logits weighted and summed.

The views are made after the input stage, from the staged buffer the graph reads (any input kind: uint8 images,
float batches in either layout, an 8-bit engine's padded codes): the normalisation is per pixel, so a view of the
normalised values is the normalised view. The staged chunk is kept in a scratch buffer of the largest batch, made
once with the engine, before the first replay (the forward reuses the input's buffer for later values,
buffers.py), and each further view is written from it into the input buffer: a copy or two a view, no allocation,
no host synchronisation. A shifted view's new pixels are black: `fill` is a black image's staged pixel, which the
input stage itself produced, so it is right for every input kind.
"""

from __future__ import annotations

from ..data.tta_views import tta_views, write_view
from ..ops import kernels


class ViewAverage:
    """The views of `mode` for an engine whose largest staged input is `largest_input` (a (batch, ...) device array
    in the engine's layout); `fill`: a black pixel as staged, broadcastable against a staged batch."""

    def __init__(self, mode: str, largest_input, layout: str, fill):
        import cupy

        self.views = tta_views(mode)
        self.scratch = cupy.empty_like(largest_input)
        self.layout, self.fill = layout, fill

    def keep(self, staged) -> None:
        """Keep the rows of `staged` (a leading slice of a staged input buffer) before the forward runs over it."""
        import cupy

        cupy.copyto(self.scratch[: staged.shape[0]], staged)

    def first(self, out, logits) -> None:
        """out = the first view's (the image's own) share of the mean: its weight times its logits, in float32."""
        kernels.scale(logits, self.views[0].weight, out=out)

    def stage(self, index: int, staged) -> None:
        """Write view `index` (1, 2, ...) of the kept rows into `staged` for the next replay."""
        write_view(self.scratch[: staged.shape[0]], staged, self.views[index], layout=self.layout, fill=self.fill)

    def add(self, index: int, out, logits) -> None:
        """out += view `index`'s weight times its logits (exact products: the weights are powers of two)."""
        kernels.add_scaled(out, logits, self.views[index].weight, out=out)
