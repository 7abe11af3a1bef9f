"""NCHW / NHWC conversions the reference ops share: they compute in NCHW order (filters in KCRS) and give results in
the caller's layout. Activations are (N, C, H, W) in NCHW and (N, H, W, C) in NHWC; filters (K, C/g, R, S) and
(K, R, S, C/g), which convert the same way."""


def to_nchw(a, layout: str):
    """An array in `layout` as an NCHW (or KCRS) view; NCHW arrays unchanged."""
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


def from_nchw(a, layout: str):
    """An NCHW (or KCRS) array as a view in `layout`."""
    return a if layout == "NCHW" else a.transpose(0, 2, 3, 1)


def shape_to_nchw(shape, layout: str) -> tuple:
    n, a, b, c = (int(s) for s in shape)
    return (n, a, b, c) if layout == "NCHW" else (n, c, a, b)


def shape_from_nchw(nchw, layout: str) -> tuple:
    n, c, h, w = nchw
    return tuple(nchw) if layout == "NCHW" else (n, h, w, c)


__all__ = ["from_nchw", "shape_from_nchw", "shape_to_nchw", "to_nchw"]
