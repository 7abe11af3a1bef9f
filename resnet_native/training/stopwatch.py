"""Where a run's wall time goes: seconds summed per activity, the rest reported as 'other' (the summary's
"seconds")."""

from __future__ import annotations

import contextlib
import time


class Stopwatch:
    """Seconds summed per activity: `with spent("evaluate"): ...`."""

    def __init__(self):
        self.seconds = {}

    @contextlib.contextmanager
    def __call__(self, what: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(what, time.perf_counter() - t0)

    def add(self, what: str, seconds: float) -> None:
        self.seconds[what] = self.seconds.get(what, 0.0) + seconds

    def add_untracked(self, what: str, since: float) -> None:
        """Count as `what` the seconds since `since` (a perf_counter time before every activity so far) that no
        activity took."""
        self.add(what, max(0.0, time.perf_counter() - since - sum(self.seconds.values())))

    def totals(self, *, wall: float) -> dict:
        """{activity: s}, and the rest of the wall time as 'other' (start-up, metrics, waiting for the checkpoint
        writer)."""
        out = {k: round(v, 3) for k, v in self.seconds.items()}
        out["other"] = round(wall - sum(out.values()), 3)
        return out
