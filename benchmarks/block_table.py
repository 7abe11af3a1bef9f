"""Table 1 of bench_block.py: the block forward on resnet_native (each variant, algorithm mode and engine) next to
the same block in PyTorch eager, with the fused path each conv took."""

from __future__ import annotations

import math
import sys

import numpy as np
from bench_block import ALGOS, CUPY_DTYPES, KERNEL_DTYPES, activation_shape, as_float32, to_device, to_layout
from block_shapes import BlockShape, ConvShape
from common import cupy_time, torch_time, write_json

# ----------------------------------------------------------------------------------------------------------------
# The block on resnet_native


class OurBlock:
    def __init__(self, shape: BlockShape, layout: str, precision: str, rng):
        import cupy as cp

        self.shape, self.layout, self.precision = shape, layout, precision
        self.convs = shape.convs()
        self.x_host = rng.standard_normal((shape.n, shape.c_in, shape.hw, shape.hw)).astype(np.float32)
        self.host = {}
        self.w, self.b, self.out = {}, {}, {}
        for c in self.convs:
            w = rng.standard_normal((c.c_out, c.c_in, c.kernel, c.kernel)) * math.sqrt(2.0 / (c.c_in * c.kernel**2))
            b = 0.1 * rng.standard_normal(c.c_out)
            self.host[c.name] = (w.astype(np.float32), b.astype(np.float32))
            self.w[c.name] = to_device(to_layout(self.host[c.name][0], layout), precision)
            self.b[c.name] = to_device(self.host[c.name][1], precision)
            self.out[c.name] = cp.empty(activation_shape(shape.n, c.c_out, c.hw_out, layout), CUPY_DTYPES[precision])
        self.x = to_device(to_layout(self.x_host, layout), precision)
        self.specs = {}

    def spec(self, c: ConvShape, algo: str, engine: str):
        from resnet_native.ops.conv import ConvSpec

        key = (c.name, algo, engine)
        if key not in self.specs:
            self.specs[key] = ConvSpec(stride=c.stride, padding=c.pad, layout=self.layout, precision=self.precision,
                                       algo=algo, engine=engine)
        return self.specs[key]

    def forward(self, variant: str, algo: str, engine: str):
        from resnet_native.ops import conv

        *head, last = [c for c in self.convs if c.name != "proj"]
        shortcut = self.x
        if self.convs[0].name == "proj":
            p = self.convs[0]
            shortcut = conv.conv2d(self.x, self.w["proj"], self.spec(p, algo, engine), bias=self.b["proj"],
                                   out=self.out["proj"])
        h = self.x
        for c in head:
            h = conv.conv2d(h, self.w[c.name], self.spec(c, algo, engine), bias=self.b[c.name], activation="relu",
                            out=self.out[c.name])
        y = self.out[last.name]
        spec = self.spec(last, algo, engine)
        if variant in ("fused", "unfused"):
            conv.conv2d(h, self.w[last.name], spec, bias=self.b[last.name], z=shortcut, activation="relu", out=y)
        elif variant == "add_relu_kernel":
            from resnet_native.ops import kernels  # written separately: imported only where used

            conv.conv2d(h, self.w[last.name], spec, bias=self.b[last.name], out=y)
            kernels.add_relu(y, shortcut, out=y, dtype=KERNEL_DTYPES[self.precision])
        elif variant == "add_tensor_cudnn":
            from resnet_native.ops import kernels

            conv.conv2d(h, self.w[last.name], spec, bias=self.b[last.name], out=y)
            kernels.add_tensor_cudnn(y, shortcut, out=y, layout=self.layout, dtype=KERNEL_DTYPES[self.precision])
            kernels.relu(y, out=y, dtype=KERNEL_DTYPES[self.precision])
        else:
            raise ValueError(f"unknown variant {variant!r}")
        return y

    def runner(self, variant: str, algo: str, engine: str):
        from resnet_native.ops import conv

        if variant == "unfused":

            def run():
                with conv.fusion_disabled():
                    return self.forward(variant, algo, engine)

            return run
        return lambda: self.forward(variant, algo, engine)

    def fused_paths(self, variant: str, algo: str, engine: str) -> dict:
        """Which path each conv's fused call took (as the algorithm cache records it)."""
        from resnet_native.ops import conv

        paths = {}
        for c in self.convs:
            spec = self.spec(c, algo, engine)
            residual = c.epilogue == "residual" and variant in ("fused", "unfused")
            relu = c.epilogue == "relu" or residual
            fused = conv.fused_name(bias=True, z=residual, activation="relu" if relu else "identity")
            x_shape = activation_shape(self.shape.n, c.c_in, c.hw_in, self.layout)
            w_shape = to_layout(np.empty((c.c_out, c.c_in, c.kernel, c.kernel), np.float32), self.layout).shape
            entry = conv.last_algorithm(x_shape, w_shape, spec, fused=fused)
            paths[c.name] = {
                "path": "disabled" if variant == "unfused" else (entry or {}).get("fused_path", "?"),
                "algo": (entry or {}).get("algo_name"),
                "engine": (entry or {}).get("engine"),
            }
        return paths


def short_paths(paths: dict) -> str:
    def letter(p):
        if p == "fused":
            return "F"
        if p == "disabled":
            return "-"
        return "U" if str(p).startswith("unfused") else "?"

    return " ".join(f"{name}:{letter(v['path'])}" for name, v in paths.items())


# ----------------------------------------------------------------------------------------------------------------
# The same block in PyTorch


TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_settings(torch, precision: str) -> None:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"


class TorchBlock:
    def __init__(self, ours: OurBlock, torch):
        self.torch = torch
        dtype = getattr(torch, TORCH_DTYPES[ours.precision])
        fmt = torch.channels_last if ours.layout == "NHWC" else torch.contiguous_format
        self.layers = {}
        for c in ours.convs:
            layer = torch.nn.Conv2d(c.c_in, c.c_out, c.kernel, c.stride, c.pad, bias=True)
            w, b = ours.host[c.name]
            with torch.no_grad():
                layer.weight.copy_(torch.from_numpy(w))
                layer.bias.copy_(torch.from_numpy(b))
            self.layers[c.name] = layer.to(device="cuda", dtype=dtype, memory_format=fmt).eval()
        self.x = torch.from_numpy(ours.x_host).to(device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        self.names = [c.name for c in ours.convs if c.name != "proj"]
        self.has_projection = "proj" in self.layers

    def forward(self):
        torch = self.torch
        with torch.inference_mode():
            shortcut = self.layers["proj"](self.x) if self.has_projection else self.x
            h = self.x
            for name in self.names[:-1]:
                h = torch.relu_(self.layers[name](h))
            y = self.layers[self.names[-1]](h)
            y += shortcut
            return torch.relu_(y)


def error_vs_torch(ours_y, torch_y, ours: OurBlock) -> float:
    """||ours - torch|| / ||torch||, computed on the GPU in float32."""
    import cupy as cp

    t = torch_y.float()
    if ours.layout == "NHWC":
        t = t.permute(0, 2, 3, 1)
    t = cp.from_dlpack(t.contiguous())
    o = as_float32(ours_y, ours.precision)
    return float(cp.linalg.norm(o - t) / cp.linalg.norm(t))


# ----------------------------------------------------------------------------------------------------------------
# Sections


def block_section(args, blocks, engines, torch, budget, report):
    import cupy as cp

    rng = np.random.default_rng(0)
    for shape in blocks.values():
        for layout in args.layouts:
            for precision in args.precisions:
                config = f"{shape.name} {layout} {precision}"
                if budget.exhausted():
                    report["skipped"].append(f"block {config}: budget")
                    continue
                print(f"[block] {config}", file=sys.stderr, flush=True)
                ours = OurBlock(shape, layout, precision, rng)
                torch_row, torch_y = None, None
                if torch is not None:
                    torch_row = {"block": shape.name, "layout": layout, "precision": precision, "variant": "torch",
                                 "algo": "benchmark", "engine": "torch"}
                    try:
                        torch_settings(torch, precision)
                        tb = TorchBlock(ours, torch)
                        torch_row.update(torch_time(tb.forward, warmup=args.warmup, repeats=args.repeats))
                        torch_y = tb.forward()
                        torch.cuda.synchronize()
                    except Exception as e:  # a failing row is reported, the run goes on
                        torch_row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows = []
                for engine in engines:
                    for variant in args.variants:
                        if engine != "legacy" and variant != "fused":
                            continue  # fusion control and the add variants concern the legacy engine
                        algos = args.algos if variant == "fused" else ["find"]
                        if engine != "legacy":
                            algos = [a for a in algos if a != "fixed"]  # fixed names legacy algorithms
                        for algo in algos:
                            rows.append(run_block_variant(args, ours, variant, algo, engine, torch_row, torch_y))
                if torch_row is not None:
                    rows.append(torch_row)
                report["block"].extend(rows)
                del ours
                cp.get_default_memory_pool().free_all_blocks()
                if torch is not None:
                    torch.cuda.empty_cache()
                if args.json:
                    write_json(args.json, report)


def run_block_variant(args, ours, variant, algo, engine, torch_row, torch_y):
    row = {"block": ours.shape.name, "layout": ours.layout, "precision": ours.precision, "variant": variant,
           "algo": algo, "engine": engine}
    if variant in ("add_relu_kernel", "add_tensor_cudnn") and not kernels_available():
        row["error"] = "skipped: resnet_native.kernels is not available"
        return row
    try:
        fn = ours.runner(variant, ALGOS[algo], engine)
        row.update(cupy_time(fn, warmup=args.warmup, repeats=args.repeats))
        paths = ours.fused_paths(variant, ALGOS[algo], engine)
        row["paths"] = short_paths(paths)
        row["conv_paths"] = paths
        if torch_row is not None and "median_ms" in torch_row:
            row["torch_ms"] = torch_row["median_ms"]
            row["ratio"] = row["median_ms"] / torch_row["median_ms"]
        if torch_y is not None:
            row["err"] = error_vs_torch(fn(), torch_y, ours)
    except Exception as e:  # a failing row is reported, the run goes on
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def kernels_available() -> bool:
    try:
        from resnet_native.ops import kernels

        return hasattr(kernels, "add_relu") and hasattr(kernels, "add_tensor_cudnn") and hasattr(kernels, "relu")
    except ImportError:
        return False

