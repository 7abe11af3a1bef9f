"""Load test of the HTTP server on loopback: dynamic batching against one engine call per image.

    python benchmarks/bench_serve.py --fake-engine-ms 20,0.1 [--clients 32] [--client-processes 2] [--requests 500]
                                     [--time-limit-s 60] [--max-batch N] [--max-delay-ms 0]
                                     [--modes batched,server_batch_1,sequential]
                                     [--out serve.json]
    python benchmarks/bench_serve.py --release cifar10_models/version_A ...      # on a GPU: its InferenceEngine
    python benchmarks/bench_serve.py --model resnet18 ...                       # GPU: an untrained network's engine

Modes, each against the same engine, one after the other:
  batched          the server (in this process, 127.0.0.1, a free port, its own event loop in a thread) with a
                   Batcher(max_batch, max_delay_ms); --clients aiohttp clients each POST one PNG at a time, spread
                   over --client-processes processes (default 2) so that they do not compete with the server for
                   its interpreter
  server_batch_1   the same server and clients with Batcher(max_batch=1, max_delay_ms=0): HTTP without batching
  sequential       no HTTP: engine(image[None]) for one image after another, the floor of one call per image
A mode stops after --requests requests or when its share of --time-limit-s is spent, whichever comes first (the
time limit is split evenly among the modes still to run), so the whole run is bounded. Throughput is successful
images per second of the mode's wall time; latency is per request (client-side, from sending to the whole
answer; for sequential, one engine call), p50 and p99 by nearest rank. A few warm-up requests per server mode
(connections opened, the first batch run) are not counted.

--fake-engine-ms A,B serves resnet_native.serve.FakeEngine: each call sleeps A ms plus B ms per image, the cost
shape of a GPU engine (large fixed cost per call, small per image), for machines without a GPU. --release serves a
real release: its InferenceEngine on a GPU, else the host path (slow: use few requests). --model serves the
InferenceEngine of a freshly initialised ResNet (fp16, NHWC, CIFAR stem, --engine-batches): the same speed as a
trained one, without a training run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, format_table, package_env, percentile, write_json  # noqa: E402
from common import markdown_table as common_markdown_table

MODES = ("batched", "server_batch_1", "sequential")
COLUMNS = [("mode", "mode"), ("max_batch", "max batch"), ("max_delay_ms", "max delay ms"), ("clients", "clients"),
           ("ok", "requests"), ("failed", "failed"), ("images_per_s", "images/s"), ("p50_ms", "p50 ms"),
           ("p99_ms", "p99 ms"), ("mean_batch", "mean batch"), ("wall_s", "wall s"), ("stopped_by", "stopped by")]
DISTINCT_IMAGES = 64
SERVE_MODELS = {"resnet18": "ResNet18", "resnet50": "ResNet50"}


def summarize(mode: str, latencies_s: list, failed: int, wall_s: float, stopped_by: str, **extra) -> dict:
    ms = [s * 1e3 for s in latencies_s]
    return {"mode": mode, "ok": len(ms), "failed": failed, "wall_s": wall_s,
            "images_per_s": len(ms) / wall_s if wall_s > 0 else None, "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99), "mean_ms": sum(ms) / len(ms) if ms else None, "stopped_by": stopped_by,
            **extra}


def make_images(n: int = DISTINCT_IMAGES, seed: int = 0) -> tuple:
    """(n uint8 (32, 32, 3) images, their PNG encodings)."""
    from PIL import Image

    images = np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    pngs = []
    for im in images:
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    return images, pngs


# ------------------------------------------------------------------------------------------------------------
# Modes


def run_sequential(engine, images, requests: int, deadline: float) -> dict:
    """One engine call per image, one after the other."""
    latencies, start = [], time.perf_counter()
    stopped_by = "requests"
    for i in range(requests):
        if time.monotonic() > deadline:
            stopped_by = "time_limit"
            break
        t = time.perf_counter()
        out = engine(images[i % len(images)][None])
        if hasattr(out, "get") and not isinstance(out, np.ndarray):
            out.get()  # a cupy result: the call is done when its logits are on the host, as the batcher's are
        latencies.append(time.perf_counter() - t)
    return summarize("sequential", latencies, 0, time.perf_counter() - start, stopped_by, max_batch=1, clients=1,
                     mean_batch=1.0)


async def _load(url: str, pngs: list, requests: int, clients: int, deadline: float) -> tuple:
    """`clients` concurrent clients POSTing PNGs until `requests` are sent or the deadline passes."""
    import aiohttp

    latencies, failed, sent = [], [0], [0]
    timeout = aiohttp.ClientTimeout(total=max(5.0, deadline - time.monotonic() + 30.0))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:

        async def client():
            while sent[0] < requests and time.monotonic() < deadline:
                body = pngs[sent[0] % len(pngs)]
                sent[0] += 1
                t = time.perf_counter()
                async with session.post(url, data=body, headers={"Content-Type": "image/png"}) as r:
                    await r.read()
                    ok = r.status == 200
                if ok:
                    latencies.append(time.perf_counter() - t)
                else:
                    failed[0] += 1

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - start
    return latencies, failed[0], wall, "requests" if sent[0] >= requests else "time_limit"


def _load_process(url: str, pngs: list, requests: int, clients: int, deadline: float) -> tuple:
    return asyncio.run(_load(url, pngs, requests, clients, deadline))


def _load_from(processes: int, url: str, pngs: list, requests: int, clients: int, deadline: float) -> tuple:
    """_load's results with the clients and requests split among `processes` client processes (0: in this one,
    sharing the server's interpreter). time.monotonic is the system's clock, so the deadline holds in each."""
    if processes == 0:
        return asyncio.run(_load(url, pngs, requests, clients, deadline))
    import concurrent.futures
    import multiprocessing

    shares = [(requests // processes + (i < requests % processes), clients // processes + (i < clients % processes))
              for i in range(processes)]
    shares = [(r, c) for r, c in shares if r and c]
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(shares), mp_context=spawn) as pool:
        parts = list(pool.map(_load_process, *zip(*[(url, pngs, r, c, deadline) for r, c in shares], strict=True)))
    latencies = [t for part in parts for t in part[0]]
    stopped = "time_limit" if any(part[3] == "time_limit" for part in parts) else "requests"
    return latencies, sum(part[1] for part in parts), max(part[2] for part in parts), stopped


def run_server(mode: str, engine, classes, pngs, *, requests: int, clients: int, deadline: float, max_batch,
               max_delay_ms: float, client_processes: int = 0) -> dict:
    """The HTTP server with a Batcher of these settings, loaded by `clients` concurrent clients."""
    from resnet_native.serve import Batcher, make_app
    from resnet_native.serve.server import ServerThread

    with Batcher(engine, max_batch=max_batch, max_delay_ms=max_delay_ms) as batcher:
        with ServerThread(make_app(batcher, classes)) as server:
            url = server.url + "/predict"
            warm = min(clients, 16)
            asyncio.run(_load(url, pngs, warm, warm, deadline))
            before = batcher.counters()
            latencies, failed, wall, stopped_by = _load_from(client_processes, url, pngs, requests, clients, deadline)
            after = batcher.counters()
    batches = after["batches"] - before["batches"]
    served = after["completed"] - before["completed"]
    return summarize(mode, latencies, failed, wall, stopped_by, max_batch=batcher.max_batch,
                     max_delay_ms=batcher.max_delay_ms, clients=clients,
                     mean_batch=served / batches if batches else None, batches=batches,
                     client_processes=client_processes)


def run_server_workers(mode: str, args, pngs, *, workers: int, requests: int, clients: int, deadline: float,
                       max_batch, max_delay_ms: float, client_processes: int = 0) -> dict:
    """As run_server, against python -m resnet_native.serve --workers N in a child process (the engine in its main
    process). mean_batch and batches come from the server's final counters, the warm-up requests included."""
    import json
    import signal
    import subprocess
    import tempfile

    source = ["--fake-engine-ms", args.fake_engine_ms] if args.fake_engine_ms else ["--release", args.release]
    cmd = [sys.executable, "-m", "resnet_native.serve", *source, "--workers", str(workers), "--port", "0",
           "--max-delay-ms", str(max_delay_ms), "--max-queue", str(max(1024, 4 * clients))]
    if max_batch is not None:
        cmd += ["--max-batch", str(max_batch)]
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=cwd, env=package_env())
        try:
            listening = json.loads(proc.stdout.readline() or "{}")
            if listening.get("event") != "listening":
                raise RuntimeError(f"bench_serve: the --workers {workers} server did not start ({proc.wait(30)})")
            url = listening["url"] + "/predict"
            warm = min(clients, 16)
            asyncio.run(_load(url, pngs, warm, warm, deadline))
            latencies, failed, wall, stopped_by = _load_from(client_processes, url, pngs, requests, clients, deadline)
            proc.send_signal(signal.SIGTERM)
            stopped = {}
            for line in proc.stdout:
                if line.startswith("{") and json.loads(line).get("event") == "stopped":
                    stopped = json.loads(line)["batcher"]
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    batches, served = stopped.get("batches", 0), stopped.get("completed", 0)
    return summarize(mode, latencies, failed, wall, stopped_by, max_batch=max_batch, max_delay_ms=max_delay_ms,
                     clients=clients, mean_batch=served / batches if batches else None, batches=batches,
                     client_processes=client_processes, workers=workers)


# ------------------------------------------------------------------------------------------------------------
# The run


def load_engine(args):
    """(engine, classes, description) for --release or --fake-engine-ms."""
    if args.fake_engine_ms is not None:
        from resnet_native.serve import FakeEngine

        engine = FakeEngine.from_spec(args.fake_engine_ms)
        return engine, tuple(str(i) for i in range(engine.num_classes)), repr(engine)
    if args.model is not None:
        import resnet_native as rn
        from resnet_native.inference import InferenceEngine

        model = getattr(rn, SERVE_MODELS[args.model])(num_classes=10, stem="cifar", layout="NHWC",
                                                      precision="fp16", seed=0)
        engine = InferenceEngine(model.cuda().eval(), batch_sizes=args.engine_batches, precision="fp16")
        return engine, tuple(str(i) for i in range(10)), f"{args.model} (untrained), {engine!r}"
    from resnet_native.serve.cli import load_model

    engine, classes, model = load_model(args.release)
    return engine, classes, model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Load test of python -m resnet_native.serve on loopback.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--release", help="a release folder: its InferenceEngine on a GPU, else the host path")
    src.add_argument("--model", choices=sorted(SERVE_MODELS), help="a freshly initialised network's engine (GPU)")
    src.add_argument("--fake-engine-ms", metavar="A,B", help="a fake engine: A ms per call + B ms per image")
    p.add_argument("--engine-batches", type=lambda v: tuple(int(b) for b in v.split(",")),
                   default=(1, 8, 32, 64, 128, 256), help="--model: the engine's captured batch sizes")
    p.add_argument("--clients", type=int, default=32, help="concurrent HTTP clients (default 32)")
    p.add_argument("--client-processes", type=int, default=2,
                   help="processes the clients run in, so they do not share the server's interpreter (0: this one)")
    p.add_argument("--requests", type=int, default=500, help="requests per mode (default 500)")
    p.add_argument("--time-limit-s", type=float, default=60.0, help="wall-time limit of the whole run (default 60)")
    p.add_argument("--max-batch", type=int, default=None, help="the batched mode's max_batch (default: the engine's)")
    p.add_argument("--max-delay-ms", type=float, default=0.0, help="the batched mode's max_delay_ms (default 0)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--workers", type=int, default=1,
                   help="batched and server_batch_1: HTTP worker processes (python -m resnet_native.serve --workers "
                        "N in a child process; default 1: the in-process server); --fake-engine-ms or --release")
    p.add_argument("--out", default="bench_serve.json", help="the JSON results file (default bench_serve.json)")
    return p


def resolve_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    args.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error(f"--modes: expected a comma-separated subset of {', '.join(MODES)}, got {','.join(args.modes)!r}")
    for name in ("clients", "requests"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected a positive number, got {getattr(args, name)}")
    if not 0 <= args.client_processes <= args.clients:
        p.error(f"--client-processes: expected 0 to --clients ({args.clients}), got {args.client_processes}")
    if args.workers < 1:
        p.error(f"--workers: expected a positive number, got {args.workers}")
    if args.workers > 1 and args.model is not None:
        p.error("--workers: the server runs as a child process, of --fake-engine-ms or --release, not --model")
    if not args.time_limit_s > 0:
        p.error(f"--time-limit-s: expected a positive number, got {args.time_limit_s}")
    if args.fake_engine_ms is not None:
        from resnet_native.serve import FakeEngine

        try:
            FakeEngine.from_spec(args.fake_engine_ms)
        except ValueError as e:
            p.error(f"--fake-engine-ms: {e}")
    return args


def markdown_table(rows: list) -> str:
    return common_markdown_table(rows, COLUMNS, digits=1)


def main(argv=None) -> dict:
    args = resolve_args(argv)
    start = time.monotonic()
    engine, classes, description = load_engine(args)
    images, pngs = make_images()
    rows = []
    for i, mode in enumerate(args.modes):
        # This mode's share of what is left, so a slow mode cannot eat the later modes' time.
        deadline = time.monotonic() + (start + args.time_limit_s - time.monotonic()) / (len(args.modes) - i)
        if mode == "sequential":
            rows.append(run_sequential(engine, images, args.requests, deadline))
        else:
            batched = mode == "batched"
            if args.workers > 1:
                max_batch = (args.max_batch or getattr(engine, "batch_sizes", (None,))[-1]) if batched else 1
                rows.append(run_server_workers(mode, args, pngs, workers=args.workers, requests=args.requests,
                                               clients=args.clients, deadline=deadline, max_batch=max_batch,
                                               max_delay_ms=args.max_delay_ms if batched else 0.0,
                                               client_processes=args.client_processes))
                print(format_table(rows[-1:], COLUMNS), flush=True)
                continue
            rows.append(run_server(mode, engine, classes, pngs, requests=args.requests, clients=args.clients,
                                   deadline=deadline, max_batch=args.max_batch if batched else 1,
                                   max_delay_ms=args.max_delay_ms if batched else 0.0,
                                   client_processes=args.client_processes))
        print(format_table(rows[-1:], COLUMNS), flush=True)
    by_mode = {r["mode"]: r for r in rows}
    speedup = None
    if "batched" in by_mode and "sequential" in by_mode and by_mode["sequential"]["images_per_s"]:
        speedup = by_mode["batched"]["images_per_s"] / by_mode["sequential"]["images_per_s"]
    payload = {"environment": environment(), "engine": description,
               "args": {k: v for k, v in vars(args).items()}, "modes": by_mode, "rows": rows,
               "batched_over_sequential": speedup, "wall_s": time.monotonic() - start}
    write_json(args.out, payload)
    print()
    print(markdown_table(rows), end="")
    if speedup is not None:
        print(f"\nbatched / sequential throughput: {speedup:.1f}x")
    return payload


if __name__ == "__main__":
    main()
    sys.exit(0)
