"""Render benchmark JSON (bench_block.py, bench_model.py) as the Markdown tables kept in docs/lab-notes/RESULTS.md.

    python benchmarks/results_markdown.py docs/lab-notes/results/2026-11-30-h200

Numbers are copied from the JSON, never typed: docs/lab-notes/RESULTS.md quotes this script's output.
"""

import json
import pathlib
import sys


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(x):
    return "-" if x is None else f"{x:.3f}"


def ratio(x):
    return "-" if x is None else f"{x:.2f}"


def block_tables(d):
    by_key = {}
    for r in d["block"]:
        by_key.setdefault((r["block"], r["layout"], r["precision"]), []).append(r)
    rows = []
    for (block, layout, prec), rs in by_key.items():

        def pick(variant, engine, algo="find", rs=rs):
            for r in rs:
                if r["variant"] == variant and r["engine"] == engine and r["algo"] == algo and "median_ms" in r:
                    return r["median_ms"]
            return None

        torch_ms = next((r.get("torch_ms") for r in rs if r.get("torch_ms")), None)
        legacy, graph = pick("fused", "legacy"), pick("fused", "graph")
        best = min(x for x in (legacy, graph) if x is not None)
        rows.append(
            [
                block,
                layout,
                prec,
                ms(pick("unfused", "legacy")),
                ms(legacy),
                ms(pick("fused", "legacy", "heuristic")),
                ms(pick("fused", "legacy", "fixed")),
                ms(graph),
                ms(torch_ms),
                ratio(best / torch_ms if torch_ms else None),
            ]
        )
    header = [
        "block",
        "layout",
        "prec",
        "unfused legacy",
        "fused legacy find",
        "fused legacy heur.",
        "fused legacy fixed",
        "fused graph find",
        "torch",
        "best/torch",
    ]
    fusion = [
        [
            f["block"],
            f["layout"],
            f["precision"],
            ratio(f["unfused_over_fused"]),
            ratio(f["cudnn_add_over_kernel_add"]),
            ratio(f["kernel_add_over_fused"]),
        ]
        for f in d["fusion_summary"]
    ]
    fusion_header = [
        "block",
        "layout",
        "prec",
        "unfused / fused",
        "cudnnAddTensor / add_relu kernel",
        "kernel add / fused residual",
    ]
    return table(header, rows), table(fusion_header, fusion)


def per_conv_table(d):
    rows = [
        [
            r["block"],
            r["conv"],
            r["layout"],
            r["precision"],
            shape_cell(r),
            r["direction"],
            ms(r.get("legacy_ms")),
            r.get("legacy_algo", "-"),
            ms(r.get("graph_ms")),
            r.get("graph_algo", "-"),
            ms(r.get("torch_ms")),
            ratio(r.get("legacy_ratio")),
            ratio(r.get("graph_ratio")),
        ]
        for r in d["per_conv"]
    ]
    header = [
        "block",
        "conv",
        "layout",
        "prec",
        "shape",
        "direction",
        "legacy ms",
        "legacy algo",
        "graph ms",
        "graph engine",
        "torch ms",
        "legacy/torch",
        "graph/torch",
    ]
    return table(header, rows)


def shape_cell(r):
    return f"{r['c_in']}->{r['c_out']} k{r['kernel']} s{r['stride']} {r['hw']}px n{r['n']}"


def graphed_cell(r, who):
    """A *_graphed_ms value, 'failed' when its capture failed, '-' when not measured."""
    if r.get(f"{who}_graphed_ms") is not None:
        return ms(r[f"{who}_graphed_ms"])
    return "failed" if r.get(f"{who}_graphed_error") else "-"


def loop_over_graphed(r, who):
    loop, graphed = r.get(f"{who}_ms"), r.get(f"{who}_graphed_ms")
    return ratio(loop / graphed if loop is not None and graphed else None)


def per_conv_graphed_table(d):
    """Device time per conv (CUDA graph replay) next to the back-to-back loop; None when the run had none.

    loop/graphed well above 1 means the loop timing was host time, not GPU time."""
    rows = [r for r in d["per_conv"] if any(k.endswith(("_graphed_ms", "_graphed_error")) for k in r)]
    if not rows:
        return None
    engines = d.get("engines") or ["legacy", "graph"]
    header = ["block", "conv", "layout", "prec", "shape", "direction"]
    header += [f"{e} graphed ms" for e in engines] + ["torch graphed ms"]
    header += [f"{e}/torch graphed" for e in engines]
    header += [f"{e} loop/graphed" for e in engines] + ["torch loop/graphed"]
    out = []
    for r in rows:
        out.append(
            [r["block"], r["conv"], r["layout"], r["precision"], shape_cell(r), r["direction"]]
            + [graphed_cell(r, e) for e in engines]
            + [graphed_cell(r, "torch")]
            + [ratio(r.get(f"{e}_graphed_ratio")) for e in engines]
            + [loop_over_graphed(r, e) for e in engines + ["torch"]]
        )
    return table(header, out)


def us(x):
    return "-" if x is None else f"{x:.1f}"


def host_overhead_table(d):
    """The host's cost of one call of a tiny conv; None when the run did not measure it."""
    rows = d.get("host_overhead") or []
    if not rows:
        return None
    engines = d.get("engines") or ["legacy", "graph"]
    header = ["direction"]
    for e in engines:
        header += [f"{e} us", f"{e} bare _C us", f"{e} device us"]
    header += ["torch us", "torch device us"]
    out = []
    for r in rows:
        cells = [r["direction"]]
        for e in engines:
            cells += [us(r.get(f"{e}_us")), us(r.get(f"{e}_bare_us")), us(r.get(f"{e}_device_us"))]
        out.append(cells + [us(r.get("torch_us")), us(r.get("torch_device_us"))])
    return f"{rows[0]['problem']}, {rows[0]['calls']} calls without synchronising\n\n" + table(header, out)


def model_table(rows):
    out = [
        [
            r["model"],
            r["batch"],
            r["dtype"],
            r["layout"],
            ms(r["train_ms"]),
            f"{r['batch'] / r['train_ms'] * 1e3:.0f}",
            ms(r.get("torch_train_ms")),
            ratio(r["train_ms"] / r["torch_train_ms"] if r.get("torch_train_ms") else None),
            ms(r["infer_ms"]),
            ms(r.get("torch_infer_ms")),
            ratio(r["infer_ms"] / r["torch_infer_ms"] if r.get("torch_infer_ms") else None),
        ]
        for r in rows
    ]
    header = [
        "model",
        "batch",
        "dtype",
        "layout",
        "train step ms",
        "img/s",
        "torch ms",
        "ours/torch",
        "infer ms",
        "torch ms",
        "ours/torch",
    ]
    return table(header, out)


def main(folder):
    folder = pathlib.Path(folder)
    if (folder / "bench_block.json").exists():
        d = json.loads((folder / "bench_block.json").read_text())
        print(f"Environment: {d['environment']}\n")
        blocks, fusion = block_tables(d)
        print("### Block forward (median ms)\n\n" + blocks + "\n\n### Fusion ratios\n\n" + fusion + "\n")
        print("### Per conv (median ms, algo find)\n\n" + per_conv_table(d) + "\n")
        graphed = per_conv_graphed_table(d)
        if graphed:
            print("### Per conv, device time (CUDA graph replay, median ms per call)\n\n" + graphed + "\n")
        host = host_overhead_table(d)
        if host:
            print("### Host cost of one call (us per call; device us from a CUDA graph replay)\n\n" + host + "\n")
    if (folder / "bench_model.json").exists():
        print("### Whole model\n\n" + model_table(json.loads((folder / "bench_model.json").read_text())) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
