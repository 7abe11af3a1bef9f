"""Test-time augmentation's views of a batch of images: which views each mode averages the logits of, with what
weights, and one function that writes a view of a batch into a buffer (host or device, either layout).

'flip' averages each image and its mirror. 'flip-shift' gives that pair half the weight and the pair shifted one
pixel diagonally each way (up-left and down-right) the other half, airbench's choice. The pixels a shift brings in
are black: what the training crop's zero padding showed the network, and worth more than reflected edges (the lab
notes' ablation). The first view of every mode is the image itself, so a caller's plain pass is its first view.
"""

from __future__ import annotations

import dataclasses

from .._core.names import TTA_MODES, choice
from .._core.placement import array_module


@dataclasses.dataclass(frozen=True)
class View:
    """out[y, x] = image[y + dy, m(x) + dx], m mirroring when `mirror` (m(x) = W - 1 - x), black outside; `weight`
    its logits' share of the mean (a power of two, so scaling a logit by it is exact)."""

    dy: int
    dx: int
    mirror: bool
    weight: float

    @property
    def identity(self) -> bool:
        return self.dy == 0 and self.dx == 0 and not self.mirror


_PAIR = (View(0, 0, False, 0.5), View(0, 0, True, 0.5))
VIEWS = {
    "none": (View(0, 0, False, 1.0),),
    "flip": _PAIR,
    "flip-shift": tuple(dataclasses.replace(v, weight=v.weight / 2) for v in _PAIR)
    + tuple(View(d, d, mirror, 0.125) for d in (-1, 1) for mirror in (False, True)),
}
assert tuple(VIEWS) == TTA_MODES and all(v[0].identity and sum(x.weight for x in v) == 1.0 for v in VIEWS.values())


def tta_mode(value) -> str:
    """'none', 'flip' or 'flip-shift' (None: 'none'); ValueError naming `tta` otherwise."""
    return choice("tta", "none" if value is None else value, TTA_MODES)


def tta_views(mode) -> tuple[View, ...]:
    """The views of TTA mode `mode` (None: 'none'), the image itself first; ValueError naming `tta` otherwise."""
    return VIEWS[tta_mode(mode)]


def write_view(src, dst, view: View, *, layout: str = "NHWC", fill=0) -> None:
    """dst = `view` of the batch src (N, H, W, C) for NHWC, (N, C, H, W) for NCHW, NumPy or cupy alike (dst of the
    same shape, not overlapping src). `fill`: what a pixel shifted in holds in dst's terms (0: a black uint8 pixel;
    for a normalised buffer, a black pixel's normalised values, broadcastable against dst). No allocation on the
    device: a fill and a strided copy."""
    xp = array_module(dst)
    h_axis, w_axis = (1, 2) if layout == "NHWC" else (2, 3)
    height, width = src.shape[h_axis], src.shape[w_axis]
    base = src
    dx = view.dx
    if view.mirror:  # out[y, x] = mirrored[y + dy, x - dx]: the mirror turns a shift to the right into one left
        base = src[:, :, ::-1] if w_axis == 2 else src[:, :, :, ::-1]
        dx = -dx
    if view.dy == 0 and dx == 0:
        xp.copyto(dst, base)
        return
    xp.copyto(dst, fill)

    def span(shift, size):  # (destination, source) slices along one axis
        return slice(max(0, -shift), size - max(0, shift)), slice(max(0, shift), size + min(0, shift))

    (dy_dst, dy_src), (dx_dst, dx_src) = span(view.dy, height), span(dx, width)
    index_dst, index_src = [slice(None)] * 4, [slice(None)] * 4
    index_dst[h_axis], index_dst[w_axis], index_src[h_axis], index_src[w_axis] = dy_dst, dx_dst, dy_src, dx_src
    xp.copyto(dst[tuple(index_dst)], base[tuple(index_src)])


def view_images(images, view: View):
    """A new uint8 (N, H, W, 3) array where `images` is (NumPy or cupy): `view` of the images, shifted-in pixels
    black."""
    out = array_module(images).empty_like(images)
    write_view(images, out, view)
    return out
