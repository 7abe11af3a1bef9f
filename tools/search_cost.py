"""What a recipe's first training step spends choosing convolution algorithms, per engine and algorithm mode, and
what the choices give per step afterwards.

    python tools/search_cost.py --recipe B --engine auto --algo find [--steps 60] [--top 12]

Run each setting in a fresh process: the searches, cuDNN's module loads and the choices are per process. Builds
the recipe's model, optimizer and loss scaler, runs one eager training step at the recipe's batch on zeros (timed
with the device synchronised: searches, module loads and kernel compiles together), then reads every choice's
`search_ms` from the algorithm cache, then captures the step in a CUDA graph and times its replays (median of
--steps, CUDA events, after 10 warm-up replays). --algo heuristic runs it all within conv.untimed_search(): cuDNN's
heuristic ranking, nothing timed. With --engine auto, each problem has three entries (legacy, graph and auto's own,
whose search_ms includes the other two); the per-engine sums come from the engine-keyed entries. --algos loads
another process's choices first (loaded entries have search_ms 0), to time them here. One JSON line on
stdout; --top lists the slowest searches on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="B")
    p.add_argument("--engine", choices=("auto", "legacy", "graph"), default="auto")
    p.add_argument("--algo", choices=("find", "heuristic"), default="find")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--algos", metavar="FILE", help="load these choices first (a run's algos.json): no search, and "
                                                   "step_ms measures them")
    args = p.parse_args()

    t0 = time.perf_counter()
    import contextlib

    import cupy

    import resnet_native as rn
    from resnet_native.data.augment import storage_dtype
    from resnet_native.optim.step import TrainStep
    from resnet_native.training.builders import build_model, build_optimizer, build_scaler
    from resnet_native.training.config import TrainConfig, load_recipe

    cfg = TrainConfig.from_dict({**load_recipe(args.recipe), "engine": args.engine})
    rn.require_gpu()
    if args.algos:
        rn.conv.load_algorithm_cache(args.algos)
    out = {"recipe": args.recipe, "engine": args.engine, "algo": args.algo, "imports_s": time.perf_counter() - t0}
    searching = rn.conv.untimed_search if args.algo == "heuristic" else contextlib.nullcontext
    model = build_model(cfg)
    step = TrainStep(model, build_optimizer(cfg, model), label_smoothing=cfg.label_smoothing,
                     scaler=build_scaler(cfg), cuda_graph=True)
    b = cfg.batch_size
    x = cupy.zeros((b, 32, 32, 3) if cfg.layout == "NHWC" else (b, 3, 32, 32), dtype=storage_dtype(cfg.precision))
    labels = cupy.zeros((b,), dtype=cupy.int32)
    device = cupy.cuda.Device()
    device.synchronize()
    with searching():
        t1 = time.perf_counter()
        step.run(x, labels)  # the first call of a graphed step runs eagerly: it searches
        device.synchronize()
        out["first_step_s"] = time.perf_counter() - t1
        entries = rn.conv.algorithm_cache_entries()
        t1 = time.perf_counter()
        step.run(x, labels)  # captures
        device.synchronize()
        out["capture_s"] = time.perf_counter() - t1
        times = []
        for i in range(10 + args.steps):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            step.run(x, labels)
            end.record()
            end.synchronize()
            if i >= 10:
                times.append(cupy.cuda.get_elapsed_time(start, end))
    out["step_ms"] = statistics.median(times)

    by_engine: dict = {}  # by the engine each key asked for ('auto' included), not the one chosen
    for e in entries:
        by_engine.setdefault(rn._C.parse_conv_key(e["key"])["engine"], []).append(e)
    for engine, group in sorted(by_engine.items()):
        out[f"{engine}_problems"] = len(group)
        out[f"{engine}_search_s"] = sum(e["search_ms"] for e in group) / 1e3
    top = by_engine.get(args.engine, entries)
    if args.engine == "auto":
        out["auto_winners"] = {name: sum(e["engine"] == name for e in top) for name in ("legacy", "graph")}
    for e in sorted(top, key=lambda e: -e["search_ms"])[:args.top]:
        print(f"{e['search_ms']:8.1f} ms  {e['engine']:6s} {e['algo_name']:28s} time {e['time_ms']}  {e['key']}",
              file=sys.stderr)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
