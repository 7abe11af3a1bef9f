"""A kernel timeline of the trainer's epochs, and where the GPU idles between its operations.

    python tools/epoch_timeline.py --report timeline.txt [trainer arguments, e.g. --recipe B --data D --epochs 12]

The GPU image has no Nsight Systems; PyTorch's profiler (CUPTI) records every kernel, memset and copy of the
process, ours and cupy's included, graph replays node by node. The trainer (python -m resnet_native.train, the
arguments given) runs under it; epochs `--first` to `--first + --epochs-traced - 1` (as queued by the host) are
traced. The report gives the traced span, the GPU's busy time and the idle gaps between operations (by size, by
the pair of operations around them, the largest), how far ahead of the GPU the host launches the captured steps,
and the GPU time per operation name. CUPTI adds time of its own at every operation: compare timelines with each
other, and take step times from benchmarks/bench_model.py. torch is needed (the GPU machine has it).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import tempfile

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
GAP_BUCKETS_US = (2, 5, 20, 100, 1000, float("inf"))


def trace_epochs(train_args: list, first: int, epochs: int, trace_path: str) -> None:
    """Run the trainer with its epochs first..first+epochs-1 profiled into a Chrome trace at trace_path."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from resnet_native.training import loop
    from resnet_native.training.cli import main

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   # Queuing epoch e is profiler step e + 1: steps first + 1 .. first + epochs are recorded.
                   schedule=schedule(wait=first, warmup=1, active=epochs, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(trace_path))
    queue_epoch, finish_epoch = loop.Trainer._queue_epoch, loop.Trainer._finish_epoch

    def queued(self, parts, epoch, *args, **kwargs):
        prof.step()  # one profiler step per epoch queued
        with torch.profiler.record_function(f"queue epoch {epoch}"):
            return queue_epoch(self, parts, epoch, *args, **kwargs)

    def finished(self, q, **kwargs):
        with torch.profiler.record_function(f"finish epoch {q.epoch}"):
            return finish_epoch(self, q, **kwargs)

    loop.Trainer._queue_epoch, loop.Trainer._finish_epoch = queued, finished
    try:
        prof.start()
        main(train_args)
        prof.stop()
    finally:
        loop.Trainer._queue_epoch, loop.Trainer._finish_epoch = queue_epoch, finish_epoch


def gaps_between(ops: list) -> tuple:
    """(gaps, end): the idle intervals of the GPU between `ops` (sorted by start), each (length us, previous op's
    name, next op's name, start us), and the end of the last op."""
    gaps, end, prev = [], ops[0]["ts"] + ops[0]["dur"], ops[0]
    for op in ops[1:]:
        if op["ts"] > end + 0.5:
            gaps.append((op["ts"] - end, prev["name"][:60], op["name"][:60], end))
        if op["ts"] + op["dur"] > end:
            end, prev = op["ts"] + op["dur"], op
    return gaps, end


def report(events: list) -> list:
    """The report's lines for a Chrome trace's events."""
    ops = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES), key=lambda e: e["ts"])
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    marks = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    if not ops:
        return ["no GPU operations were traced"]
    t0 = ops[0]["ts"]
    lines = [f"GPU operations {len(ops)}, runtime calls {len(calls)}"]
    lines += [f"  host {e['name']}: at {(e['ts'] - t0) / 1e3:9.2f} ms, {e['dur'] / 1e3:8.2f} ms" for e in marks]
    gaps, end = gaps_between(ops)
    idle = sum(g[0] for g in gaps)
    lines.append(f"span {(end - t0) / 1e3:.2f} ms: busy {(end - t0 - idle) / 1e3:.2f} ms, idle {idle / 1e3:.2f} ms "
                 f"in {len(gaps)} gaps")
    low = 0.0
    for high in GAP_BUCKETS_US:
        inside = [g[0] for g in gaps if low <= g[0] < high]
        lines.append(f"  gaps {low:g}-{high:g} us: {len(inside):7d}, {sum(inside) / 1e3:8.2f} ms")
        low = high
    pairs = collections.defaultdict(lambda: [0, 0.0])
    for length, before, after, _ in gaps:
        pairs[(before, after)][0] += 1
        pairs[(before, after)][1] += length
    lines.append("idle by the operations around it (count, ms): before -> after")
    for (before, after), (n, total) in sorted(pairs.items(), key=lambda kv: -kv[1][1])[:20]:
        lines.append(f"  {n:6d} {total / 1e3:8.2f}  {before} -> {after}")
    lines.append("largest gaps (us, at ms): before -> after")
    for length, before, after, at in sorted(gaps, reverse=True)[:10]:
        lines.append(f"  {length:9.0f} at {(at - t0) / 1e3:9.2f}  {before} -> {after}")
    lines += launch_lead(ops, calls)
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for op in ops:
        by_name[(op["cat"], op["name"][:90])][0] += 1
        by_name[(op["cat"], op["name"][:90])][1] += op["dur"]
    lines.append(f"GPU time by operation (total {sum(v[1] for v in by_name.values()) / 1e3:.2f} ms):")
    for (cat, name), (n, total) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:40]:
        lines.append(f"  {n:6d} {total / 1e3:9.2f} ms  {cat}: {name}")
    return lines


def launch_lead(ops: list, calls: list) -> list:
    """How long each captured step waited on the GPU after the host launched it (the host's lead), and how long
    the launch call itself took (it blocks once the launch queue is full)."""
    first = {}
    for op in ops:
        first.setdefault(op.get("args", {}).get("correlation"), op["ts"])
    launches = [c for c in calls if "GraphLaunch" in c["name"] and c.get("args", {}).get("correlation") in first]
    if not launches:
        return ["no graph launches traced"]
    lead = sorted(first[c["args"]["correlation"]] - (c["ts"] + c["dur"]) for c in launches)
    took = sorted(c["dur"] for c in launches)

    def at(values, q):
        return values[int(q * (len(values) - 1))]

    return [f"graph launches {len(launches)}: GPU start after the launch returned, us: min {lead[0]:.0f}, median "
            f"{at(lead, 0.5):.0f}, max {lead[-1]:.0f}; the launch call took median {at(took, 0.5):.0f} us, max "
            f"{took[-1]:.0f} us"]


def main(argv=None) -> None:
    # No abbreviations: the trainer's own arguments (--epochs) pass through untouched.
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--report", required=True, help="where the report goes (also printed)")
    p.add_argument("--first", type=int, default=4, help="first epoch traced (0-based, as queued; default 4)")
    p.add_argument("--epochs-traced", type=int, default=3, help="epochs traced (default 3)")
    p.add_argument("--trace", help="keep the Chrome trace here (default: a temporary file, removed)")
    args, train_args = p.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or str(pathlib.Path(tmp) / "trace.json")
        trace_epochs(train_args, args.first, args.epochs_traced, trace)
        events = json.loads(pathlib.Path(trace).read_text())["traceEvents"]
    text = "\n".join(report(events)) + "\n"
    pathlib.Path(args.report).write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
