"""Where an InferenceEngine's forward spends its device time, step by step.

    python tools/profile_infer.py [--model resnet50] [--batch 1] [--dtype fp16] [--iters 200] [--json PATH]

Each step of the engine's plan (a fused convolution, the pooling, the classifier cast) is captured alone in a CUDA
graph and replayed back to back between CUDA events: the median per replay is the step's device time with the
launch gaps a graph leaves. The whole forward's graph is timed the same way; the difference between it and the sum
of the steps is what chaining the steps in one graph saves (or costs). Each convolution's row names the engine and
algorithm its cache entry chose and whether its epilogue ran fused.
"""

import argparse
import json
import statistics
import sys

import cupy as cp

import resnet_native as rn
from resnet_native._core.capture import capture_graph
from resnet_native.inference import InferenceEngine


def replay_ms(graph, stream, iters: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean device time of `iters` back-to-back replays."""
    samples = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(iters):
            graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop) / iters)
    return statistics.median(samples)


def conv_choice(forward, binding, step) -> str:
    entry = forward.conv_calls[step.name].cached(binding.specs[step.name])
    if entry is None:
        return "?"
    return f"{entry['engine']}:{entry['algo_name']} {entry['fused_path'] or 'fused'}"


def profile(model_name: str, batch: int, dtype: str, iters: int) -> dict:
    model = getattr(rn, model_name.replace("resnet", "ResNet"))(num_classes=10, stem="cifar", layout="NHWC",
                                                               precision=dtype, seed=0)
    engine = InferenceEngine(model, batch_sizes=(batch,), precision=dtype)
    binding = engine._bindings[batch]
    forward = binding.forwards[batch]
    stream = cp.cuda.Stream(non_blocking=True)
    pool = cp.cuda.MemoryPool()
    rows = []
    with stream:
        for step, call in zip(engine.plan.steps, forward.calls, strict=True):
            graph = capture_graph(call, stream, pool).graph
            stream.synchronize()
            row = {"step": step.name, "kind": step.kind, "ms": replay_ms(graph, stream, iters)}
            if step.kind == "conv":
                c, h, w = engine.plan.values[step.x].shape
                k = engine.plan.values[step.out].shape[0]
                row["shape"] = f"{c}x{h}x{w} -> {k}, {step.kernel}x{step.kernel}/{step.stride}"
                row["choice"] = conv_choice(forward, binding, step)
            rows.append(row)
        whole = replay_ms(engine._graphs[batch], stream, iters)
    engine.close()
    total = sum(r["ms"] for r in rows)
    return {"model": model_name, "batch": batch, "dtype": dtype, "gpu": cp.cuda.runtime.getDeviceProperties(
        cp.cuda.runtime.getDevice())["name"].decode(), "steps": rows, "sum_of_steps_ms": total,
        "whole_graph_ms": whole}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=["resnet18", "resnet34", "resnet50", "resnet101"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--json")
    args = p.parse_args(argv)
    result = profile(args.model, args.batch, args.dtype, args.iters)
    width = max(len(r["step"]) for r in result["steps"])
    for r in sorted(result["steps"], key=lambda r: -r["ms"]):
        print(f"{r['step']:{width}}  {r['kind']:7}  {r['ms'] * 1e3:8.2f} us  {r.get('shape', ''):24}  "
              f"{r.get('choice', '')}")
    print(f"{args.model} b{args.batch} {args.dtype}: {len(result['steps'])} steps, sum of steps "
          f"{result['sum_of_steps_ms'] * 1e3:.1f} us, whole graph {result['whole_graph_ms'] * 1e3:.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
