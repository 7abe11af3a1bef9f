"""Where a fresh machine's warm start goes: the priming's phases, alone and beside a decode of the CIFAR-10 source.

    CUPY_CACHE_DIR=$(mktemp -d) python tools/warm_start_timing.py --data .data/cifar10-jpeg.tar.xz \
        --decode {none,nice,plain} [--recipe B] [--nice 10]

Runs what training/warm_start.prime_first_steps runs (the recipe's throwaway model, one eager training step per
training batch shape, one forward per evaluation batch shape), timing each phase with the device synchronised.
With --decode nice|plain a forked child decodes the source meanwhile (decode_source, every core; 'nice' lowers
its priority by --nice) and its own wall time is printed too. Run each mode in a fresh process with
an empty CUPY_CACHE_DIR: cupy's kernel compiles are part of what a fresh machine pays. One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time


def decode(path, niceness, queue):
    from resnet_native.data.cifar10 import decode_source

    if niceness:
        os.nice(niceness)
    t0 = time.perf_counter()
    decode_source(path)
    queue.put(time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--decode", choices=["none", "nice", "plain"], default="none")
    p.add_argument("--recipe", default="B")
    p.add_argument("--nice", type=int, default=10)
    args = p.parse_args()

    t_import = time.perf_counter()
    import cupy

    from resnet_native.data.augment import storage_dtype
    from resnet_native.step import TrainStep
    from resnet_native.training import warm_start
    from resnet_native.training.builders import build_model, build_optimizer, build_scaler, partial_batch_search
    from resnet_native.training.config import TrainConfig, load_recipe

    cfg = TrainConfig.from_dict(load_recipe(args.recipe))
    out = {"decode": args.decode, "imports_s": time.perf_counter() - t_import}
    queue = multiprocessing.get_context("fork").SimpleQueue()
    child = None
    if args.decode != "none":
        niceness = args.nice if args.decode == "nice" else 0
        child = multiprocessing.get_context("fork").Process(target=decode, args=(args.data, niceness, queue))
        child.start()
    t_prime = time.perf_counter()

    def phase(name, fn, *fn_args):
        t0 = time.perf_counter()
        result = fn(*fn_args)
        cupy.cuda.Device().synchronize()
        out[name + "_s"] = time.perf_counter() - t0
        return result

    phase("context", lambda: cupy.zeros(1))
    model = phase("build_model", lambda: build_model(cfg))
    step = phase("train_step", lambda: TrainStep(model, build_optimizer(cfg, model), scaler=build_scaler(cfg),
                                                 label_smoothing=cfg.label_smoothing, cuda_graph=False))
    dtype = storage_dtype(cfg.precision)
    for b in warm_start.batch_shapes(warm_start.TRAIN_IMAGES, cfg.batch_size):
        x, y = cupy.zeros((b, 32, 32, 3), dtype=dtype), cupy.zeros((b,), dtype=cupy.int32)
        with partial_batch_search(b, cfg.batch_size):
            phase(f"step_{b}", step.run, x, y)
            phase(f"step_{b}_again", step.run, x, y)  # the same shape once searched: its plain cost
    model.eval()
    for b in warm_start.batch_shapes(warm_start.TEST_IMAGES, cfg.eval_batch_size):
        x = cupy.zeros((b, 32, 32, 3), dtype=dtype)
        with partial_batch_search(b, cfg.eval_batch_size):
            phase(f"forward_{b}", lambda x: model.forward(x, train=False, copy=False), x)
    out["priming_s"] = time.perf_counter() - t_prime
    if child is not None:
        out["decode_s"] = queue.get()
        child.join()
        out["both_s"] = time.perf_counter() - t_prime
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
