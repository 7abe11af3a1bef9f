"""bench_block.py's report: the fusion summary of the block rows, the text tables' columns, and the printout."""

from __future__ import annotations

from common import format_table

# Small enough that the GPU finishes each call long before the host has issued the next one.
HOST_PROBE = {"n": 8, "hw": 8, "c": 64, "k": 64, "kernel": 1, "layout": "NHWC", "precision": "fp16"}


def host_probe_name() -> str:
    p = HOST_PROBE
    return (f"{p['layout']} {p['precision']} x=({p['n']}, {p['hw']}, {p['hw']}, {p['c']}) "
            f"w=({p['k']}, {p['kernel']}, {p['kernel']}, {p['c']})")


def fusion_summary(block_rows: list) -> list:
    """Per configuration: unfused / fused and add_tensor_cudnn / add_relu_kernel (above 1: the first is slower)."""
    by_config = {}
    for r in block_rows:
        if "median_ms" in r and r["engine"] == "legacy" and r["algo"] == "find":
            by_config.setdefault((r["block"], r["layout"], r["precision"]), {})[r["variant"]] = r["median_ms"]
    out = []
    for (block, layout, precision), t in by_config.items():
        row = {"block": block, "layout": layout, "precision": precision}
        if "fused" in t and "unfused" in t:
            row["unfused_over_fused"] = t["unfused"] / t["fused"]
        if "add_relu_kernel" in t and "add_tensor_cudnn" in t:
            row["cudnn_add_over_kernel_add"] = t["add_tensor_cudnn"] / t["add_relu_kernel"]
        if "fused" in t and "add_relu_kernel" in t:
            row["kernel_add_over_fused"] = t["add_relu_kernel"] / t["fused"]
        out.append(row)
    return out


BLOCK_COLUMNS = [("block", "block"), ("layout", "layout"), ("precision", "prec"), ("variant", "variant"),
                 ("algo", "algo"), ("engine", "engine"), ("median_ms", "ms"), ("torch_ms", "torch_ms"),
                 ("ratio", "ours/torch"), ("err", "err_vs_torch"), ("paths", "paths"), ("error", "error")]
FUSION_COLUMNS = [("block", "block"), ("layout", "layout"), ("precision", "prec"),
                  ("unfused_over_fused", "unfused/fused"), ("cudnn_add_over_kernel_add", "cudnnAdd/kernelAdd"),
                  ("kernel_add_over_fused", "kernelAdd/fused")]


def per_conv_columns(engines: list) -> list:
    cols = [("block", "block"), ("conv", "conv"), ("layout", "layout"), ("precision", "prec"),
            ("direction", "direction")]
    for engine in engines:
        cols += [(f"{engine}_ms", f"{engine}_ms"), (f"{engine}_graphed_ms", f"{engine}_graphed"),
                 (f"{engine}_algo", f"{engine}_algo")]
    cols += [("torch_ms", "torch_ms"), ("torch_graphed_ms", "torch_graphed")]
    cols += [(f"{engine}_ratio", f"{engine}/torch") for engine in engines]
    cols += [(f"{engine}_graphed_ratio", f"{engine}/torch graphed") for engine in engines]
    return cols


def host_overhead_columns(engines: list) -> list:
    cols = [("direction", "direction")]
    for engine in engines:
        cols += [(f"{engine}_us", f"{engine}_us"), (f"{engine}_bare_us", f"{engine}_bare_C_us"),
                 (f"{engine}_device_us", f"{engine}_device_us")]
    return cols + [("torch_us", "torch_us"), ("torch_device_us", "torch_device_us")]


def print_report(report: dict, engines: list, host_calls: int) -> None:
    """The run's tables as text on stdout."""
    env = report["environment"]
    print(f"GPU {env.get('gpu')}, cuDNN {env.get('cudnn')}, torch {env.get('torch')} (cuDNN {env.get('torch_cudnn')}),"
          f" engines {', '.join(engines)}, {report['elapsed_s']:.0f} s")
    print(format_table(report["block"], BLOCK_COLUMNS, "\nBlock forward (median ms; ratio = ours / torch)"))
    print(format_table(report["fusion_summary"], FUSION_COLUMNS,
                       "\nFusion (time ratios, legacy engine, algo find; above 1: the first is slower)"))
    if report["per_conv"]:
        print(format_table(report["per_conv"], per_conv_columns(engines),
                           "\nPer conv (median ms, algo find; ratio = engine / torch; graphed = replayed from a "
                           "CUDA graph, device time only)"))
    if report["host_overhead"]:
        print(format_table(report["host_overhead"], host_overhead_columns(engines),
                           f"\nHost cost of one call ({host_probe_name()}, {host_calls} calls without "
                           "synchronising; us per call; device_us from a CUDA graph replay)"))
    if report["skipped"]:
        print(f"\nskipped ({len(report['skipped'])}): " + "; ".join(report["skipped"]))
