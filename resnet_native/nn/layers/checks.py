"""Argument checks shared by the layers: clear ValueError/TypeError naming the argument, raised before any op
runs (choices of names: _core.names.choice; ints: _core.names.whole_number)."""


def channel_axis(layout: str) -> int:
    return 1 if layout == "NCHW" else 3


def check_activation(name, x, layout, channels=None) -> None:
    """Unless x is a 4-D activation in `layout` (NCHW: (N,C,H,W), NHWC: (N,H,W,C)) with `channels`
    channels."""
    shape = getattr(x, "shape", None)
    if shape is None or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
    if len(shape) != 4:
        raise ValueError(f"{name}: expected a 4-D {layout} array, got shape {tuple(shape)}")
    axis = channel_axis(layout)
    if channels is not None and shape[axis] != channels:
        raise ValueError(
            f"{name}: expected {channels} channels ({layout}: shape[{axis}]), got shape {tuple(shape)}"
        )


def check_same_shape(name, a, other_name, b) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{name}: shape {tuple(a.shape)} differs from {other_name}'s {tuple(b.shape)}")
