"""The GPU half of the reliability sweep, in one script: leak soak, memory pressure, and SIGKILLs of the real trainer.

    python tools/reliability.py soak     [--models 1000] [--steps 10000] [--json PATH]
    python tools/reliability.py pressure [--json PATH]
    python tools/reliability.py kill     --data .data/cifar10-jpeg.tar.xz [--kills 12] [--json PATH]
    python tools/reliability.py step     (a few small training steps, eager and captured: for compute-sanitizer)

soak      builds and drops --models ResNet-18s with an InferenceEngine each (fp16, NHWC, batch size 32),
          then runs --steps captured training steps of one ResNet-18 (batch 128); samples live cuDNN descriptors,
          the device's used memory and the process's RSS along the way, and reports each one's least-squares slope
          over the second half of the samples (per 100 models, per 1000 steps): flat is what passes.
pressure  one ResNet-18 fp16 training step under workspace caps from none down to 0 bytes (every convolution must
          still run, on an algorithm that fits), then with the device filled by raw cupy allocations: the running
          step must keep running (ops allocate nothing), a new model must fail with a clear out-of-memory
          exception, never a crash, and train once the memory is given back.
kill      trains a small run (recipe A's ResNet-18, --subset images, --epochs epochs, a checkpoint every
          epoch), SIGKILLs it at random points --kills times, resuming each time, then lets it finish. It checks
          that no temporary file is left once each resume starts, that last.npz is always complete (the epoch each
          resume starts at is recorded), that the finished run logged every epoch once, and that its final test
          accuracy is that of an uninterrupted run of the same seed: all runs are --deterministic with the
          first run's algorithms (--algos), and the gap may be at most 3x that between two uninterrupted runs
          (what noise is left; --accuracy-gap, default 0.001, when they agree exactly).
Every check that fails is reported with what it saw and the script exits 1; --json writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

FAILURES: list = []


def check(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def slope(samples: list) -> float:
    """Least-squares slope of the second half of [(x, y)] samples (the first half includes warm-up growth)."""
    half = samples[len(samples) // 2:]
    x, y = (np.array(v, dtype=np.float64) for v in zip(*half, strict=True))
    return float(np.polyfit(x, y, 1)[0]) if len(half) >= 2 else 0.0


def probe() -> dict:
    import cupy as cp

    import resnet_native as rn

    free, total = cp.cuda.runtime.memGetInfo()
    return {"descriptors": sum(rn.live_descriptors().values()), "device_mib": (total - free) / 2**20,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# ------------------------------------------------------------------------------------------------------------


def resnet18(args):
    """The fp16 NHWC CIFAR ResNet-18 the model-building checks use, with --algo and --engine. --algo heuristic
    skips the algorithm search, which under a sanitizer runs every candidate kernel slowly."""
    import resnet_native as rn

    return rn.ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=0, algo=args.algo, engine=args.engine)


def soak(args) -> dict:
    import gc

    import cupy as cp

    import resnet_native as rn

    x = cp.random.randint(0, 256, (32, 32, 32, 3)).astype(cp.uint8)
    per_model, t0 = [], time.perf_counter()
    for i in range(args.models):
        model = rn.ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=i).cuda().eval()
        engine = rn.InferenceEngine(model, batch_sizes=(32,), precision="fp16")
        engine(x).get()
        del model, engine
        if i % max(1, args.models // 50) == 0:
            gc.collect()
            per_model.append((i, probe()))
            print(f"soak: model {i} at {time.perf_counter() - t0:.1f} s: {per_model[-1][1]}", flush=True)
    model = resnet18(args)
    opt = rn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = rn.step.TrainStep(model, opt, scaler=rn.optim.GradScaler(), cuda_graph=True)
    xb = rn.kernels.cast(cp.random.standard_normal((128, 32, 32, 3), dtype=cp.float32),
                         cp.empty((128, 32, 32, 3), cp.float16))
    yb = cp.random.randint(0, 10, 128).astype(cp.int32)
    per_step = []
    for i in range(args.steps):
        step.run(xb, yb)
        if i % max(1, args.steps // 50) == 0:
            cp.cuda.Device().synchronize()
            per_step.append((i, probe()))
            if i % max(1, args.steps // 5) == 0:
                print(f"soak: step {i} at {time.perf_counter() - t0:.1f} s: {per_step[-1][1]}", flush=True)
    loss_sum, _, seen = step.read_totals()
    check(np.isfinite(loss_sum) and seen == args.steps * 128, f"soak: {args.steps} steps ran, loss finite")
    out = {"models": args.models, "steps": args.steps}
    for name, samples, unit in (("per_100_models", per_model, 100), ("per_1000_steps", per_step, 1000)):
        out[name] = {key: slope([(i, p[key]) for i, p in samples]) * unit for key in samples[0][1]}
        out[name + "_last"] = samples[-1][1]
        for key, value in out[name].items():
            # Flat: under one descriptor and 1 MiB of device memory per unit; RSS under 4 MiB (allocator noise).
            limit = {"descriptors": 1.0, "device_mib": 1.0, "rss_mib": 4.0}[key]
            check(abs(value) < limit, f"soak: {key} slope {value:.3f} {name.replace('_', ' ')} (limit {limit})")
    return out


def pressure(args) -> dict:
    import cupy as cp

    import resnet_native as rn

    model = resnet18(args)
    opt = rn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = rn.step.TrainStep(model, opt, scaler=rn.optim.GradScaler())
    x = rn.kernels.cast(cp.random.standard_normal((256, 32, 32, 3), dtype=cp.float32),
                        cp.empty((256, 32, 32, 3), cp.float16))
    y = cp.random.randint(0, 10, 256).astype(cp.int32)
    out = {"caps": {}}
    for cap in (None, 256 * 2**20, 16 * 2**20, 2**20, 0):
        rn.set_workspace_limit(cap)
        try:
            start = time.perf_counter()
            loss, _ = step(x, y)
            ok = bool(np.isfinite(float(loss)))
            out["caps"][str(cap)] = {"ok": ok, "s": time.perf_counter() - start,
                                     "peak_request": rn.workspace_stats()["peak_request"]}
            check(ok, f"pressure: a training step under a workspace cap of {cap} bytes")
        except Exception as e:  # noqa: BLE001 - the figure is what was raised
            out["caps"][str(cap)] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
            check(False, f"pressure: workspace cap {cap}: {type(e).__name__}: {str(e)[:200]}")
    rn.set_workspace_limit(None)
    rn.release_workspace()
    cp.get_default_memory_pool().free_all_blocks()
    step(x, y)  # the steady state again, its workspace regrown
    # Fill the device with cupy allocations that bypass cupy's pool (these bytes are really taken).
    free = cp.cuda.runtime.memGetInfo()[0]
    hogs, chunk = [], 1 << 30
    while chunk >= 1 << 20:
        try:
            hogs.append(cp.cuda.alloc(chunk))
        except cp.cuda.memory.OutOfMemoryError:
            chunk //= 2
    out["free_before_mib"], out["filled_mib"] = free / 2**20, sum(h.mem.size for h in hogs) / 2**20
    out["free_when_full_mib"] = cp.cuda.runtime.memGetInfo()[0] / 2**20
    # Ops never allocate: the step that already ran keeps running on a full device.
    try:
        loss, _ = step(x, y)
        full_ok = bool(np.isfinite(float(loss)))
    except Exception as e:  # noqa: BLE001 - the figure is what was raised
        full_ok, out["steady_state_error"] = False, f"{type(e).__name__}: {e}"[:400]
    check(full_ok, "pressure: the running step keeps running on a full device (it allocates nothing)")
    # A new model must allocate: a clear out-of-memory error, never a crash.
    error = None
    try:
        fresh = rn.ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=1)
        fresh_step = rn.step.TrainStep(fresh, rn.optim.SGD(fresh.parameters(), lr=0.01), scaler=rn.optim.GradScaler())
        fresh_step(x, y)
    except Exception as e:  # noqa: BLE001 - what a full device makes a new model raise
        error = e
    out["error"] = None if error is None else f"{type(error).__name__}: {error}"[:400]
    check(error is not None and ("memory" in str(error).lower() or isinstance(error, MemoryError)),
          f"pressure: a new model on a full device gives a clear out-of-memory error ({out['error']})")
    del hogs
    cp.get_default_memory_pool().free_all_blocks()
    fresh = rn.ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=1)
    fresh_step = rn.step.TrainStep(fresh, rn.optim.SGD(fresh.parameters(), lr=0.01), scaler=rn.optim.GradScaler())
    loss, _ = fresh_step(x, y)
    check(bool(np.isfinite(float(loss))), "pressure: a new model trains once the memory is given back")
    return out


# ------------------------------------------------------------------------------------------------------------


def trainer(args, out: Path, *extra) -> list:
    return [sys.executable, "-m", "resnet_native.train", "--recipe", "A", "--model", "resnet18", "--subset",
            str(args.subset), "--epochs", str(args.epochs), "--seed", "3", "--data", args.data, "--out", str(out),
            "--checkpoint-every", "1", "--no-progress", "--no-tensorboard", "--deterministic", *extra]


def final_accuracy(run: Path) -> float:
    return float(json.loads((run / "summary.json").read_text())["test_acc"])


def checkpoint_epoch(last: Path):
    """The epoch a resume from `last` starts at (None without a readable checkpoint)."""
    from resnet_native.formats.checkpoint import load_checkpoint

    try:
        return int(load_checkpoint(last)["rng"]["next_epoch"])
    except (OSError, ValueError, KeyError) as e:
        return f"unreadable: {e}"


def logged_epochs(run: Path) -> list:
    lines = (run / "metrics.csv").read_text().splitlines()[1:]
    return [int(line.split(",")[0]) for line in lines if line]


def temporaries(run: Path) -> list:
    return sorted(p.name for p in run.iterdir() if ".tmp" in p.name)


def kill(args) -> dict:
    rng = random.Random(args.seed)
    base = Path(args.workdir)
    reference, repeat, killed = base / "uninterrupted", base / "repeat", base / "killed"
    shutil.rmtree(base, ignore_errors=True)
    quiet = {"stdout": subprocess.DEVNULL}  # the epochs' lines; summary.json and metrics.csv hold the figures
    subprocess.run(trainer(args, reference), check=True, timeout=args.timeout_s, **quiet)
    # Every later run takes the reference's algorithms (another process would time its own, and round
    # differently): a second uninterrupted run measures what noise is left.
    algos = ["--algos", str(reference / "algos.json")]
    subprocess.run(trainer(args, repeat, *algos), check=True, timeout=args.timeout_s, **quiet)
    events = []
    proc = subprocess.Popen(trainer(args, killed, *algos), **quiet)
    start = time.monotonic()
    for k in range(args.kills):
        time.sleep(rng.uniform(0.5, args.max_wait_s))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = temporaries(killed) if killed.exists() else []
        last = killed / "last.npz"
        events.append({"kill": k, "at_s": round(time.monotonic() - start, 2), "temporaries_after_kill": left,
                       "resumes_at_epoch": checkpoint_epoch(last) if last.exists() else None})
        check(not isinstance(events[-1]["resumes_at_epoch"], str), f"kill {k}: last.npz is complete and readable")
        proc = subprocess.Popen(trainer(args, killed, *(["--resume"] if last.exists() else algos)), **quiet)
        # The resumed run's checkpoint writer removes what the killed one left once it starts (after the imports
        # and the data load): wait for that, up to a bound.
        deadline = time.monotonic() + args.cleanup_s
        while set(left) & set(temporaries(killed)) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        events[-1]["left_over_after_resume_start"] = sorted(set(left) & set(temporaries(killed)))
        check(not events[-1]["left_over_after_resume_start"],
              f"kill {k}: the resumed run removed the {len(left)} temporary file(s) the kill left")
    rc = proc.wait(timeout=args.timeout_s)
    check(len(events) == args.kills, f"kill: {len(events)} of {args.kills} kills landed before the run ended")
    check(rc == 0, f"kill: the run finished after {len(events)} kills (exit {rc})")
    check(not temporaries(killed), "kill: no temporary file at the end")
    if rc == 0:
        epochs = logged_epochs(killed)
        check(epochs == list(range(1, args.epochs + 1)), f"kill: every epoch logged once, in order ({epochs})")
    out = {"kills": len(events), "events": events}
    if rc == 0:
        out["reference_accuracy"], out["repeat_accuracy"] = final_accuracy(reference), final_accuracy(repeat)
        out["killed_accuracy"] = final_accuracy(killed)
        noise = abs(out["reference_accuracy"] - out["repeat_accuracy"])
        gap = abs(out["reference_accuracy"] - out["killed_accuracy"])
        allowed = max(3 * noise, args.accuracy_gap)
        out.update(noise=noise, gap=gap, allowed=allowed)
        check(gap <= allowed, f"kill: final accuracy {out['killed_accuracy']:.4f} against the uninterrupted "
              f"{out['reference_accuracy']:.4f} (gap {gap:.4f}; a repeat differs by {noise:.4f}; allowed "
              f"{allowed:.4f})")
    return out


def small_step(args) -> dict:
    import cupy as cp

    import resnet_native as rn

    model = resnet18(args)
    opt = rn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    step = rn.step.TrainStep(model, opt, scaler=rn.optim.GradScaler(), cuda_graph=True)
    shape = (8, args.image_size, args.image_size, 3)
    x = rn.kernels.cast(cp.random.standard_normal(shape, dtype=cp.float32), cp.empty(shape, cp.float16))
    y = cp.random.randint(0, 10, 8).astype(cp.int32)
    for phase in ("eager (warm-up)", "captured", "replayed"):
        step.run(x, y)
        cp.cuda.get_current_stream().synchronize()
        print(f"step: {phase} step done", flush=True)  # where a run under a sanitizer stopped
    loss_sum, _, seen = step.read_totals()
    check(np.isfinite(loss_sum) and seen == 24 and step.num_graphs == 1, "step: three steps, one captured graph")
    return {"loss_sum": loss_sum}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    model = argparse.ArgumentParser(add_help=False)  # the options of resnet18(), for every check that builds one
    model.add_argument("--algo", default="find", choices=("find", "heuristic"))
    model.add_argument("--engine", choices=("auto", "legacy", "graph"), help="conv engine (default: the model's)")
    s = sub.add_parser("soak", parents=[model])
    s.add_argument("--models", type=int, default=1000)
    s.add_argument("--steps", type=int, default=10000)
    pr = sub.add_parser("pressure", parents=[model])
    st = sub.add_parser("step", parents=[model])
    st.add_argument("--image-size", type=int, default=16, help="input height and width")
    k = sub.add_parser("kill")
    k.add_argument("--data", required=True)
    k.add_argument("--kills", type=int, default=12)
    k.add_argument("--subset", type=int, default=50000)
    k.add_argument("--epochs", type=int, default=30)
    k.add_argument("--max-wait-s", type=float, default=6.0)
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--accuracy-gap", type=float, default=0.001,
                   help="final-accuracy gap allowed when two uninterrupted runs agree exactly (10 of 10k images)")
    k.add_argument("--timeout-s", type=float, default=400.0)
    k.add_argument("--cleanup-s", type=float, default=20.0, help="how long a resumed run may take to remove leftovers")
    k.add_argument("--workdir", default="/tmp/rn_kill")
    for sp in (s, k, pr, st):
        sp.add_argument("--json")
    args = p.parse_args(argv)
    result = {"soak": soak, "pressure": pressure, "kill": kill, "step": small_step}[args.what](args)
    result["failures"] = FAILURES
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "events"}, indent=1, default=str))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main())
