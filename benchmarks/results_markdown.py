"""Render benchmark JSON (bench_block.py, bench_model.py) as the Markdown tables kept in RESULTS.md.

    python benchmarks/results_markdown.py benchmarks/results/2026-11-30-h200

Numbers are copied from the JSON, never typed: RESULTS.md quotes this script's output.
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
            f"{r['c_in']}->{r['c_out']} k{r['kernel']} s{r['stride']} {r['hw']}px n{r['n']}",
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
    if (folder / "bench_model.json").exists():
        print("### Whole model\n\n" + model_table(json.loads((folder / "bench_model.json").read_text())) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
