"""Where a run's wall time goes: seconds summed per activity, the rest reported as 'other' (the summary's
"seconds")."""

from __future__ import annotations

import contextlib
import os
import time

MAX_PROCESS_AGE_S = 600.0  # older than this at the entry point means the clock reading is not this command's


def process_start() -> float:
    """The time.perf_counter() reading at this process's start, so that a command's wall time includes the
    interpreter's start and the imports, as a user timing the command sees it. On Linux from /proc (10 ms ticks);
    elsewhere, or when /proc gives no plausible age, now."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat") as f:  # the name in brackets may hold spaces: the fields after it
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks since boot
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0.0 <= age < MAX_PROCESS_AGE_S else now


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
