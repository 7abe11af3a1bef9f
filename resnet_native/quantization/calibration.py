"""Activation range observers: fed batches of NumPy arrays, each keeps a bounded summary and gives a threshold
(the amax the quantiser maps to its largest code) and from it a scale for int8 or FP8.

    MaxAbsObserver       the largest |x| seen: nothing is clipped, so one outlier spends the whole range on itself.
    PercentileObserver   the p-th percentile of |x| (e.g. 99.99): clips the rarest values, read from a histogram.
    EntropyObserver      TensorRT's int8 entropy calibration: the threshold whose 128-level quantisation of the
                         |x| histogram loses the least information (minimum KL divergence).

Memory is bounded whatever the number of batches: the histogram observers keep `bins` counts and nothing else
(HistogramObserver says how the range grows without moving a count into a wrong bin).
"""

from __future__ import annotations

import numpy as np

from .._core.names import bounded_int, choice
from .fp8 import E4M3_MAX
from .int8 import INT8_MAX
from .scales import scale_from_amax

QUANT_DTYPES = ("int8", "fp8")
QMAX = {"int8": INT8_MAX, "fp8": E4M3_MAX}
METHODS = ("max", "percentile", "entropy")
ENTROPY_BINS = 2048
ENTROPY_LEVELS = 128  # int8's non-negative levels: |x| quantised to 0..127
_KL_FLOOR = 1e-4


def _batch(x) -> np.ndarray:
    a = np.abs(np.asarray(x, np.float64)).ravel()
    if a.size == 0:
        raise ValueError("x: expected a non-empty batch")
    if not np.all(np.isfinite(a)):
        raise ValueError("x: expected finite values (an activation with a NaN or an infinity has no range)")
    return a


class _Observer:
    def threshold(self) -> float:
        raise NotImplementedError

    def scale(self, dtype: str = "int8") -> float:
        """threshold() / qmax of `dtype` ('int8': 127, 'fp8': 448); 1 for all-zero data."""
        return float(scale_from_amax(self.threshold(), QMAX[choice("dtype", dtype, QUANT_DTYPES)]))

    def _require_data(self, seen: bool) -> None:
        if not seen:
            raise ValueError(f"{type(self).__name__}: no batch observed yet (call observe(x) first)")


class MaxAbsObserver(_Observer):
    """The largest |x| over every batch observed."""

    def __init__(self):
        self.amax = None

    def observe(self, x) -> None:
        a = float(np.max(_batch(x)))
        self.amax = a if self.amax is None else max(self.amax, a)

    def threshold(self) -> float:
        self._require_data(self.amax is not None)
        return self.amax


class HistogramObserver(_Observer):
    """Counts of |x| in `bins` equal bins over [0, top], top doubling (bins summed pairwise) to cover new data.

    top starts at the first batch's max |x|; when a later batch exceeds it, top doubles as often as needed and
    adjacent bins are summed pairwise, so the old bin edges remain edges and no count lands in a wrong bin (the
    price is resolution: the data may come to fill only the lower half of the bins). The largest |x| is kept too:
    no threshold exceeds it."""

    def __init__(self, bins: int = ENTROPY_BINS):
        self.bins = bounded_int("bins", bins, 2, 1 << 20, "bins")
        if self.bins % 2:
            raise ValueError(f"bins: expected an even number of bins (they merge pairwise), got {bins}")
        self.counts = np.zeros(self.bins, np.int64)
        self.top = 0.0
        self.amax = 0.0  # the largest |x| itself: no threshold goes past it

    @property
    def width(self) -> float:
        return self.top / self.bins

    def observe(self, x) -> None:
        a = _batch(x)
        amax = float(np.max(a))
        self.amax = max(self.amax, amax)
        if self.top == 0.0:
            self.top = amax
        while amax > self.top:
            self.counts = np.concatenate([self.counts.reshape(-1, 2).sum(axis=1), np.zeros(self.bins // 2, np.int64)])
            self.top *= 2.0
        if self.top == 0.0:  # all zeros so far: everything is in bin 0 whatever top becomes
            self.counts[0] += a.size
            return
        index = np.minimum((a / self.width).astype(np.int64), self.bins - 1)
        self.counts += np.bincount(index, minlength=self.bins)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def threshold(self) -> float:
        self._require_data(self.total > 0)
        return self.amax


class PercentileObserver(HistogramObserver):
    """The `percentile`-th percentile of |x| (0 < percentile <= 100), interpolated linearly inside its bin."""

    def __init__(self, percentile: float = 99.99, bins: int = 8192):
        super().__init__(bins)
        p = float(percentile) if isinstance(percentile, int | float) and not isinstance(percentile, bool) else None
        if p is None or not 0 < p <= 100:
            raise ValueError(f"percentile: expected a number in (0, 100], got {percentile!r}")
        self.percentile = p

    def threshold(self) -> float:
        self._require_data(self.total > 0)
        cumulative = np.cumsum(self.counts)
        rank = self.percentile / 100.0 * cumulative[-1]
        i = int(np.searchsorted(cumulative, rank, side="left"))
        before = cumulative[i - 1] if i else 0
        inside = (rank - before) / self.counts[i] if self.counts[i] else 1.0
        return min(float((i + inside) * self.width), self.amax)


class EntropyObserver(HistogramObserver):
    """TensorRT's minimum-KL threshold over a 2048-bin |x| histogram (Migacz, "8-bit Inference with TensorRT",
    GTC 2017).

    For every candidate i from 128 to `bins` bins, P is the histogram's first i bins with everything above added to
    bin i - 1 (what clipping at the threshold does), Q is those i bins merged into 128 equal groups (the int8
    levels), each group's count spread evenly over its bins that were non-empty in P. The threshold is (i + 0.5)
    bin widths for the i minimising KL(P || Q). Empty bins of Q where P has counts get 1e-4 (relative to the
    candidate's total) so the divergence stays finite. The method models int8's uniform levels; FP8 uses the same
    threshold with qmax 448 (a heuristic there)."""

    def __init__(self, bins: int = ENTROPY_BINS, levels: int = ENTROPY_LEVELS):
        super().__init__(bins)
        self.levels = bounded_int("levels", levels, 2, self.bins, "levels")

    def divergences(self) -> np.ndarray:
        """KL(P || Q) of every candidate i = levels .. bins (index i - levels)."""
        self._require_data(self.total > 0)
        counts = self.counts.astype(np.float64)
        # The zero bin holds every value a ReLU zeroed (half of a post-ReLU tensor): counted as its neighbour, as
        # NVIDIA's pytorch-quantization does, or that spike alone decides the divergence and clips far too much.
        counts[0] = counts[1]
        tail = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # tail[i]: counts in bins i and above
        kl = np.empty(self.bins - self.levels + 1)
        for n, i in enumerate(range(self.levels, self.bins + 1)):
            p = counts[:i].copy()
            p[-1] += tail[i]
            nonzero = p > 0
            # Bin j of the candidate belongs to level j * levels // i: 128 groups of i / 128 bins (+-1).
            group = np.arange(i) * self.levels // i
            sums = np.bincount(group, weights=counts[:i], minlength=self.levels)
            filled = np.bincount(group, weights=nonzero, minlength=self.levels)
            q = np.where(nonzero, sums[group] / np.maximum(filled[group], 1), 0.0)
            p_sum, q_sum = p.sum(), q.sum()
            if q_sum == 0:
                kl[n] = np.inf
                continue
            pn, qn = p[nonzero] / p_sum, q[nonzero] / q_sum
            qn = np.maximum(qn, _KL_FLOOR / i)
            kl[n] = float(np.sum(pn * np.log(pn / qn)))
        return kl

    def threshold(self) -> float:
        if self.top == 0.0:
            self._require_data(self.total > 0)
            return 0.0
        best = self.levels + int(np.argmin(self.divergences()))
        return min((best + 0.5) * self.width, self.amax)


def make_observer(method: str, *, percentile: float = 99.99):
    """A fresh observer for `method` ('max', 'percentile' or 'entropy')."""
    choice("method", method, METHODS)
    if method == "max":
        return MaxAbsObserver()
    if method == "percentile":
        return PercentileObserver(percentile)
    return EntropyObserver()
