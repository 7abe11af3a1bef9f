"""Where an own 3x3 int8 kernel reads its input from, tap by tap: a diagnosis for a kernel that fails its tests.

    python tools/own_conv_tap_check.py [--kernel s8_halo_c64] [--hw 12] [--channels 64]

For each of the nine taps (r, s) the filters are the identity on that tap alone (w[k, r, s, c] = 1 where k == c),
alpha 1, bias 0, no ReLU: the output must be the input shifted by (r - 1, s - 1), zeros outside the image. Each
tap prints the fraction of outputs right and, when some are wrong, the shift (dy, dx, dc) of the input that best
explains them, so an error in the window's layout, a descriptor or the epilogue's channel order shows as a
pattern rather than a count. The epilogue's arithmetic and the residual are tests/test_own_conv_gpu.py's.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np


def shifted(x, dy, dx, dc):
    """x moved by (dy, dx) pixels and dc channels (cyclic in channels), zeros from outside the image."""
    n, h, w, c = x.shape
    out = np.zeros_like(x)
    ys, yd = slice(max(dy, 0), h + min(dy, 0)), slice(max(-dy, 0), h + min(-dy, 0))
    xs, xd = slice(max(dx, 0), w + min(dx, 0)), slice(max(-dx, 0), w + min(-dx, 0))
    out[:, yd, xd, :] = x[:, ys, xs, :]
    return np.roll(out, -dc, axis=3)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", default="s8_halo_c64")
    parser.add_argument("--hw", type=int, default=12, help="H = W (12: partial 8x8 tiles)")
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args(argv)
    import cupy as cp

    from resnet_native.ops import own_conv

    c = args.channels
    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, (args.batch, args.hw, args.hw, c)).astype(np.int8)
    out = cp.empty(x.shape, cp.int8)
    ones, zeros = cp.ones(c, cp.float32), cp.zeros(c, cp.float32)
    for r, s in itertools.product(range(3), range(3)):
        w = np.zeros((c, 3, 3, c), np.int8)
        w[np.arange(c), r, s, np.arange(c)] = 1
        out.fill(99)
        own_conv.conv2d_s8(
            cp.asarray(x), cp.asarray(w), out, alpha=ones, bias=zeros, pad=1, stride=1, relu=False, kernel=args.kernel
        )
        got = out.get()
        want = shifted(x, r - 1, s - 1, 0)
        right = float(np.mean(got == want))
        line = f"tap ({r}, {s}): {right:.4f} right"
        if right < 1:
            candidates = itertools.product(range(-3, 4), range(-3, 4), range(-16, 17))
            dy, dx, dc = max(candidates, key=lambda d: np.mean(got == shifted(x, *d)))
            line += (
                f"; best explained by input shift ({dy}, {dx}) channels {dc:+d}: "
                f"{np.mean(got == shifted(x, dy, dx, dc)):.4f}; still 99 (unwritten): {np.mean(got == 99):.4f}"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
