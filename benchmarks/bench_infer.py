"""Inference latency and throughput: resnet_native's InferenceEngine against its eager eval graph and PyTorch.

    python benchmarks/bench_infer.py [--models resnet18,resnet50] [--batches 1,8,32,256,1024] [--dtypes fp16,bf16]
                                     [--compile r50:1024:fp16,r18:1:bf16 | all] [--quick] [--budget-s 300]
                                     [--algo-cache PATH] [--json PATH] [--markdown PATH]
                                     [--quant-dtypes int8,fp8] [--quantize-from stem,layer1,layer2,auto]
                                     [--quantized-kernels auto,cudnn,own]

Rows per (model, dtype, batch), all in one run on one device, CIFAR-sized inputs (32x32, the CIFAR stem):
  engine          InferenceEngine(model, batch_sizes=--batches): one CUDA graph per batch size, normalised input
  engine_uint8    the same engine fed uint8 pixels (the normalisation is its input stage)
  int8 / fp8      (--quant-dtypes) the quantised engine of the same weights, calibrated (max |x|) on 4 images,
                  fed uint8 pixels; x_fp16 is the fp16 engine_uint8's time over its own.
                  --quantize-from: one engine per value (default 'stem': every conv quantised); a value other
                  than 'stem' names its rows engine_uint8_from_<value> (the stem and the stages before it in fp16,
                  quantize_from='auto': per batch size the fastest candidate, 'float' (the fp16 plan) among
                  them; the choices and times under "engines", with quantize_from_source 'cache' when
                  --algo-cache already held them).
                  --quantized-kernels: one int8 engine per value (default 'auto': each convolution's kernel timed,
                  cuDNN's or the package's own); 'cudnn' / 'own' suffix the row name with _cudnn / _own, and the
                  engines' entries hold each choice and its times
  eager           the model's eval-mode graph, model.forward(x)
  torch_eager     torchvision's resnet with the CIFAR stem (conv1 3x3/1 pad 1, maxpool = Identity), eval,
                  channels_last, converted to the dtype, cudnn.benchmark, under inference_mode
  torch_graph     that model's forward captured in a torch CUDA graph: copy into the static input, replay, clone
  torch_compile   torch.compile(mode="max-autotune") of it, only for the configurations --compile names (each
                  compiles for minutes); its compile time is reported separately. TORCHINDUCTOR_CACHE_DIR defaults
                  to --inductor-cache, so a second run reuses the compiled kernels.
Latency: CUDA events around every call after warm-up, calls issued back to back, inputs rotated among a few
batches; median and p99 of the per-call samples, images/s from the median. FLOPs are counted from the shapes
(2*N*K*C*R*S*P*Q per convolution, the classifier included) and compared with the dense fp16/bf16 floor
(--peak-tflops, 790 for an H200): floor_ms is the time the FLOPs take at that rate. Memory: for PyTorch the caching
allocator's peak for that configuration; for ours what the engine holds (its pool and the cuDNN workspace), and for
the eager graph cupy's pool plus the workspace after the run. Ratios are engine / torch_graph and engine /
torch_compile median latencies (below 1: ours is faster). With PyTorch present the engine's logits are also
checked against PyTorch's fp32 forward of the same weights (max |difference| / max |logit|).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Budget, cupy_clock, environment, format_table, latency, torch_clock, write_json  # noqa: E402
from common import markdown_table as common_markdown_table

MODELS = {"resnet18": "ResNet18", "resnet50": "ResNet50"}
SHORT = {"r18": "resnet18", "r50": "resnet50"}
DTYPES = ("fp16", "bf16")
QUANT_DTYPES = ("int8", "fp8")
# resnet_native.quantization.prefix's QUANTIZE_FROM and AUTO, and inference.kernel_choice's QUANTIZED_KERNELS
# (spelled out: the parser runs without the package)
QUANTIZE_FROM = ("stem", "layer1", "layer2", "layer3", "layer4")
AUTO = "auto"
QUANTIZED_KERNELS = ("auto", "cudnn", "own")  # inference.kernel_choice's
BATCHES = (1, 8, 32, 256, 1024)
ROTATE = 4  # distinct input batches cycled through while timing
COLUMNS = [("model", "model"), ("dtype", "dtype"), ("batch", "batch"), ("impl", "impl"), ("median_ms", "median ms"),
           ("p99_ms", "p99 ms"), ("images_per_s", "images/s"), ("tflops", "TFLOP/s"), ("floor_pct", "% floor"),
           ("peak_mem_mb", "mem MB"), ("vs_torch_graph", "/torch graph"), ("vs_torch_compile", "/compile"),
           ("x_fp16", "x fp16 engine")]


# ------------------------------------------------------------------------------------------------------------
# Rates and ratios (the timing itself: common.latency)


def with_rates(row: dict, flops: int, peak_tflops: float) -> dict:
    """images/s, achieved TFLOP/s, its share of the floor and the floor's time, from the median latency."""
    seconds = row["median_ms"] / 1e3
    row["images_per_s"] = row["batch"] / seconds
    row["tflops"] = flops / seconds / 1e12
    row["floor_pct"] = 100.0 * row["tflops"] / peak_tflops
    row["floor_ms"] = flops / (peak_tflops * 1e12) * 1e3
    return row


def add_ratios(rows: list) -> None:
    """vs_torch_graph / vs_torch_compile on the engine rows: their median over PyTorch's, same configuration."""
    by_config = {}
    for r in rows:
        by_config.setdefault((r["model"], r["dtype"], r["batch"]), {})[r["impl"]] = r
    for (model, dtype, batch), impls in by_config.items():
        fp16 = by_config.get((model, "fp16", batch), {}).get("engine_uint8")
        if dtype in QUANT_DTYPES and fp16:
            for name, r in impls.items():
                if name.startswith("engine_uint8"):
                    r["x_fp16"] = fp16["median_ms"] / r["median_ms"]
        for name in ("engine", "engine_uint8"):
            if name not in impls:
                continue
            for rival, key in (("torch_graph", "vs_torch_graph"), ("torch_compile", "vs_torch_compile")):
                if rival in impls:
                    impls[name][key] = impls[name]["median_ms"] / impls[rival]["median_ms"]


# ------------------------------------------------------------------------------------------------------------
# Ours


def _storage_batch(rng, n, dtype):
    """A normalised-looking NHWC batch on the device in the storage dtype (bf16: uint16 bits)."""
    import cupy as cp

    from resnet_native.ops import kernels

    x32 = cp.asarray(rng.standard_normal((n, 32, 32, 3), dtype=np.float32))
    out = cp.empty(x32.shape, dtype=cp.float16 if dtype == "fp16" else cp.uint16)
    return kernels.cast(x32, out)


def build_ours(name, dtype, batches, algo_cache):
    """(model, engine, build seconds)."""
    import resnet_native as rn
    from resnet_native.inference import InferenceEngine

    model = getattr(rn, MODELS[name])(num_classes=10, stem="cifar", layout="NHWC", precision=dtype, seed=0)
    model.cuda().eval()
    start = time.perf_counter()
    engine = InferenceEngine(model, batch_sizes=batches, precision=dtype, algorithm_cache=algo_cache)
    return model, engine, time.perf_counter() - start


def build_quantized(name, dtype, batches, algo_cache, rng, quantize_from="stem", kernels="auto"):
    """(engine, build seconds, calibration seconds): the int8 / fp8 engine of build_ours' weights (seed 0),
    calibrated by max |x| on 4 random images (the speed does not depend on the scales), 8-bit from
    `quantize_from` on, its convolutions' kernels chosen by `kernels` (InferenceEngine's quantized_kernels)."""
    import resnet_native as rn
    from resnet_native.data.augment import normalize_on_host
    from resnet_native.inference import InferenceEngine
    from resnet_native.inference.simulate import calibrate

    model = getattr(rn, MODELS[name])(num_classes=10, stem="cifar", layout="NHWC", precision="fp16", seed=0)
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    pixels = rng.integers(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    start = time.perf_counter()
    calibration = calibrate(state, normalize_on_host(pixels, layout="NCHW", dtype="fp32"), "max", dtype=dtype)
    calibrated = time.perf_counter()
    engine = InferenceEngine(model, batch_sizes=batches, precision=dtype, calibration=calibration,
                             algorithm_cache=algo_cache, quantize_from=quantize_from, quantized_kernels=kernels)
    return engine, time.perf_counter() - calibrated, calibrated - start


def quantized_impl(quantize_from: str, kernels: str = "auto") -> str:
    """The row name of a quantised engine: engine_uint8 as before for 'stem', else suffixed by where it starts,
    then by the kernel choice unless 'auto'."""
    name = "engine_uint8" if quantize_from == "stem" else f"engine_uint8_from_{quantize_from}"
    return name if kernels == "auto" else f"{name}_{kernels}"


def kernel_report(engine) -> dict:
    """What the engine's kernel choice did: {kernel: count}, and per 'step@batch' its kernel, source and times."""
    choice = engine.kernel_choice
    return {"kernels": choice.summary(),
            "per_step": {f"{step}@{batch}": {"kernel": kernel, "source": choice.sources.get((step, batch)),
                                             "times_ms": choice.times.get((step, batch))}
                         for (step, batch), kernel in choice.kernels.items()}}


def time_quantized(engine, batch, rng, iters, warmup, impl="engine_uint8") -> list:
    import cupy as cp

    import resnet_native as rn

    pixels = [cp.asarray(rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)) for _ in range(ROTATE)]
    held = (engine.memory_bytes + rn.workspace_stats()["size"]) / 2**20
    return [dict(impl=impl, peak_mem_mb=held, **latency(lambda i: engine(pixels[i % ROTATE]), iters=iters,
                                                        warmup=warmup, **cupy_clock()))]


def time_ours(model, engine, batch, dtype, rng, iters, warmup) -> list:
    import cupy as cp

    import resnet_native as rn

    xs = [_storage_batch(rng, batch, dtype) for _ in range(ROTATE)]
    pixels = [cp.asarray(rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)) for _ in range(ROTATE)]
    clock = cupy_clock()
    held = (engine.memory_bytes + rn.workspace_stats()["size"]) / 2**20
    rows = [dict(impl="engine", peak_mem_mb=held, **latency(lambda i: engine(xs[i % ROTATE]), iters=iters,
                                                              warmup=warmup, **clock)),
            dict(impl="engine_uint8", peak_mem_mb=held, **latency(lambda i: engine(pixels[i % ROTATE]),
                                                                    iters=iters, warmup=warmup, **clock))]
    eager = latency(lambda i: model.forward(xs[i % ROTATE]), iters=iters, warmup=warmup, **clock)
    pool = cp.get_default_memory_pool().total_bytes() + rn.workspace_stats()["size"]
    rows.append(dict(impl="eager", peak_mem_mb=pool / 2**20, **eager))
    return rows


# ------------------------------------------------------------------------------------------------------------
# PyTorch


def torch_model(torch, name, dtype, state):
    """torchvision's resnet with the CIFAR stem and our weights, eval, channels_last, in `dtype` (None: fp32)."""
    import torchvision

    model = getattr(torchvision.models, name)(num_classes=10)
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, None: torch.float32}[dtype]
    return model.cuda().eval().to(memory_format=torch.channels_last, dtype=torch_dtype)


def _torch_inputs(torch, batch, dtype):
    torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    return [torch.randn(batch, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last, dtype=torch_dtype)
            for _ in range(ROTATE)]


def _peak_mb(torch, fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() / 2**20


def time_torch(torch, model, batch, dtype, iters, warmup) -> list:
    xs = _torch_inputs(torch, batch, dtype)
    clock = torch_clock(torch)
    rows = []
    with torch.inference_mode():
        eager, mem = _peak_mb(torch, lambda: latency(lambda i: model(xs[i % ROTATE]), iters=iters, warmup=warmup,
                                                     **clock))
        rows.append(dict(impl="torch_eager", peak_mem_mb=mem, **eager))

        def graphed():
            static_x = xs[0].clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(static_x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = model(static_x)

            def call(i):
                static_x.copy_(xs[i % ROTATE])
                graph.replay()
                return static_y.clone()

            return latency(call, iters=iters, warmup=warmup, **clock)

        result, mem = _peak_mb(torch, graphed)
        rows.append(dict(impl="torch_graph", peak_mem_mb=mem, **result))
    return rows


def time_torch_compile(torch, model, batch, dtype, iters, warmup) -> dict:
    xs = _torch_inputs(torch, batch, dtype)
    compiled = torch.compile(model, mode="max-autotune", dynamic=False)  # one static graph per batch size

    def call(i):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(xs[i % ROTATE])

    with torch.inference_mode():
        start = time.perf_counter()
        call(0)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        result, mem = _peak_mb(torch, lambda: latency(call, iters=iters, warmup=warmup, **torch_clock(torch)))
    return dict(impl="torch_compile", peak_mem_mb=mem, compile_s=compile_s, **result)


def logits_error(torch, engine, reference_model, x) -> float:
    """max |engine(x) - PyTorch fp32(x)| / max |PyTorch fp32(x)| on one storage-dtype batch x."""
    import cupy as cp

    from resnet_native.ops import kernels

    ours = cp.asnumpy(engine(x))
    x32 = kernels.cast(x, cp.empty(x.shape, dtype=cp.float32))
    with torch.inference_mode():
        nchw = torch.from_dlpack(x32).permute(0, 3, 1, 2)  # NHWC memory: a channels_last NCHW tensor
        theirs = reference_model(nchw).float().cpu().numpy()
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30))


# ------------------------------------------------------------------------------------------------------------
# The run


def parse_compile(text: str, models, dtypes, batches) -> set:
    """--compile: 'all', or comma-separated model:batch:dtype with r18 / r50 for the models; '' for none."""
    if not text:
        return set()
    if text == "all":
        return {(m, b, d) for m in models for b in batches for d in dtypes}
    chosen = set()
    for part in text.split(","):
        fields = part.strip().split(":")
        if len(fields) != 3 or SHORT.get(fields[0], fields[0]) not in MODELS or not fields[1].isdigit() \
                or fields[2] not in DTYPES:
            raise ValueError(f"--compile: expected 'all' or model:batch:dtype items like r50:1024:fp16, got {part!r}")
        chosen.add((SHORT.get(fields[0], fields[0]), int(fields[1]), fields[2]))
    return chosen


def _csv(text, kind=str):
    return tuple(kind(v) for v in text.split(",") if v)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,resnet50", help="comma-separated: resnet18, resnet50")
    p.add_argument("--batches", help=f"comma-separated batch sizes (default {','.join(map(str, BATCHES))}; "
                                     "--quick 1,32,256)")
    p.add_argument("--dtypes", help="comma-separated: fp16, bf16 (default both; --quick fp16)")
    p.add_argument("--quant-dtypes", default=",".join(QUANT_DTYPES),
                   help="comma-separated quantised engines to time: int8, fp8 ('' for none)")
    p.add_argument("--quantize-from", default="stem",
                   help="comma-separated: where the quantised engines' 8-bit part begins, one engine (and row) per "
                        "value: stem, layer1 .. layer4, auto (default stem)")
    p.add_argument("--quantized-kernels", default="auto",
                   help="comma-separated: which kernels the int8 engines' convolutions run, one engine (and row) per "
                        "value: auto, cudnn, own (default auto; fp8 engines take auto only)")
    p.add_argument("--compile", default="", help="torch.compile rows: 'all' or model:batch:dtype items, e.g. "
                                                 "r50:1024:fp16,r18:1:bf16 (default none: minutes each)")
    p.add_argument("--iters", type=int, help="timed calls per row (default 200; --quick 30)")
    p.add_argument("--warmup", type=int, help="untimed calls first (default 20; --quick 5)")
    p.add_argument("--quick", action="store_true", help="fewer batch sizes, dtypes and iterations")
    p.add_argument("--budget-s", type=float, default=0.0, help="start no new configuration after this many seconds "
                                                               "(0: no limit)")
    p.add_argument("--peak-tflops", type=float, default=790.0, help="dense fp16/bf16 floor (H200: 790)")
    p.add_argument("--algo-cache", metavar="PATH", help="the engines' algorithm-cache file (loaded, then saved)")
    p.add_argument("--inductor-cache", default=os.path.join(".cache", "torchinductor"),
                   help="TORCHINDUCTOR_CACHE_DIR unless already set")
    p.add_argument("--no-torch", action="store_true", help="skip every PyTorch row")
    p.add_argument("--json", metavar="PATH", default="bench_infer.json", help="results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="the table as Markdown (default: the JSON path with .md)")
    return p


def resolve_args(argv=None):
    args = build_parser().parse_args(argv)
    args.models = _csv(args.models)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; expected some of {sorted(MODELS)}")
    args.batches = _csv(args.batches, int) if args.batches else ((1, 32, 256) if args.quick else BATCHES)
    args.dtypes = _csv(args.dtypes) if args.dtypes else (("fp16",) if args.quick else DTYPES)
    if any(d not in DTYPES for d in args.dtypes):
        raise SystemExit(f"--dtypes: expected some of {DTYPES}, got {args.dtypes}")
    args.quant_dtypes = _csv(args.quant_dtypes) if args.quant_dtypes else ()
    if any(d not in QUANT_DTYPES for d in args.quant_dtypes):
        raise SystemExit(f"--quant-dtypes: expected some of {QUANT_DTYPES}, got {args.quant_dtypes}")
    args.quantize_from = _csv(args.quantize_from) or ("stem",)
    known = QUANTIZE_FROM + (AUTO,)
    if any(q not in known for q in args.quantize_from):
        raise SystemExit(f"--quantize-from: expected some of {known}, got {args.quantize_from}")
    args.quantized_kernels = _csv(args.quantized_kernels) or ("auto",)
    if any(k not in QUANTIZED_KERNELS for k in args.quantized_kernels):
        raise SystemExit(f"--quantized-kernels: expected some of {QUANTIZED_KERNELS}, got {args.quantized_kernels}")
    args.iters = args.iters or (30 if args.quick else 200)
    args.warmup = args.warmup or (5 if args.quick else 20)
    try:
        args.compile = parse_compile(args.compile, args.models, args.dtypes, args.batches)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    args.markdown = args.markdown or os.path.splitext(args.json)[0] + ".md"
    return args


def markdown_table(rows: list) -> str:
    return common_markdown_table(rows, COLUMNS, digits=3)


def main(argv=None) -> int:
    args = resolve_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(args.inductor_cache))
    torch = None
    if not args.no_torch:
        try:
            import torch

            torch.backends.cudnn.benchmark = True
        except ImportError as e:
            print(f"PyTorch rows skipped: {e}", file=sys.stderr)
    budget = Budget(args.budget_s)
    rng = np.random.default_rng(0)
    rows, engines, skipped = [], {}, []
    for name in args.models:
        for dtype in args.dtypes:
            if budget.exhausted():
                skipped += [f"{name}:{b}:{dtype}" for b in args.batches]
                continue
            model, engine, build_s = build_ours(name, dtype, args.batches, args.algo_cache)
            engines[f"{name}:{dtype}"] = {"build_s": build_s, "memory_mb": engine.memory_bytes / 2**20,
                                          "fused_paths": sorted({p for p in engine.fused_paths.values()}),
                                          "unfused": sum(p.startswith("unfused") for p in engine.fused_paths.values())}
            rivals = reference = None
            if torch is not None:
                state = model.state_dict()
                rivals, reference = torch_model(torch, name, dtype, state), torch_model(torch, name, None, state)
            for batch in args.batches:
                if budget.exhausted():
                    skipped.append(f"{name}:{batch}:{dtype}")
                    continue
                config = dict(model=name, dtype=dtype, batch=batch)
                found = time_ours(model, engine, batch, dtype, rng, args.iters, args.warmup)
                if torch is not None:
                    found += time_torch(torch, rivals, batch, dtype, args.iters, args.warmup)
                    if (name, batch, dtype) in args.compile:
                        found.append(time_torch_compile(torch, rivals, batch, dtype, args.iters, args.warmup))
                    found[0]["max_rel_err"] = logits_error(torch, engine, reference, _storage_batch(rng, batch, dtype))
                flops = engine.plan.conv_flops(batch)
                rows += [with_rates(dict(config, **r), flops, args.peak_tflops) for r in found]
                print(format_table([r for r in rows if r["model"] == name and r["batch"] == batch
                                    and r["dtype"] == dtype], COLUMNS[3:10]), flush=True)
            engine.close()
            if torch is not None:
                torch.cuda.empty_cache()
        for dtype, quantize_from, kernels in ((d, q, k) for d in args.quant_dtypes for q in args.quantize_from
                                              for k in args.quantized_kernels if k == "auto" or d == "int8"):
            tag = (f"{name}:{dtype}" + ("" if quantize_from == "stem" else f":{quantize_from}")
                   + ("" if kernels == "auto" else f":{kernels}"))
            if budget.exhausted():
                skipped += [f"{tag}:{b}" for b in args.batches]
                continue
            engine, build_s, calibrate_s = build_quantized(name, dtype, args.batches, args.algo_cache, rng,
                                                           quantize_from, kernels)
            engines[tag] = {"build_s": build_s, "calibrate_s": calibrate_s, "memory_mb": engine.memory_bytes / 2**20,
                            "quantize_from": engine.quantize_from,
                            "quantize_from_by_batch": engine.quantize_from_by_batch,
                            "quantize_from_times": engine.quantize_from_times,
                            "quantize_from_source": engine.quantize_from_source, **kernel_report(engine)}
            print(f"{tag}: built in {build_s:.1f} s, kernels {engines[tag]['kernels']}", flush=True)
            for batch in args.batches:
                if budget.exhausted():
                    skipped.append(f"{tag}:{batch}")
                    continue
                found = time_quantized(engine, batch, rng, args.iters, args.warmup,
                                       quantized_impl(quantize_from, kernels))
                rows += [with_rates(dict(model=name, dtype=dtype, batch=batch, **r), engine.plan.conv_flops(batch),
                                    args.peak_tflops) for r in found]
                print(format_table(rows[-1:], COLUMNS[3:10]), flush=True)
            engine.close()
    add_ratios(rows)
    print(format_table(rows, COLUMNS, title="inference (CUDA-event latency per call)"))
    payload = {"environment": environment(), "args": {k: (sorted(v) if isinstance(v, set) else v)
                                                      for k, v in vars(args).items()},
               "engines": engines, "rows": rows, "skipped": skipped, "wall_s": budget.elapsed()}
    write_json(args.json, payload)
    from resnet_native._core.files import atomic_write_text

    atomic_write_text(args.markdown, markdown_table(rows))
    if skipped:
        print(f"budget reached: skipped {', '.join(skipped)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
