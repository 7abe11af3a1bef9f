"""Summarises tools/probe_fusions.cpp's JSON lines: per layer, each pattern's best time, and per model the sums
weighted by how often each layer occurs, beside what the fused design would replace.

    python tools/fusion_report.py fusions.jsonl [--markdown]

The comparisons (each a sum over the model's convolutions, count-weighted):
- forward: conv + genstats, and prologue + conv + genstats, against the plain conv;
- backward-data: dgrad + ReLU backward + BN weight gradients against the plain dgrad;
- backward-filter: wgrad with the prologue against the plain wgrad.
What the fusions would remove (cuDNN's batch-norm passes) is timed by benchmarks/bench_norm.py; with `--norm
bench_norm.json` (same batch and dtype) the report also projects the MLPerf design over the whole model: each
batch norm whose only consumer is a convolution (ResNet-50's bn1 and bn2, ResNet-18's bn1) applied in that
convolution's prologue, its statistics from the producer's epilogue, its backward from the consumer's dgrad
fusion plus one dx pass, the consumer's wgrad with the prologue. Every other batch norm keeps cuDNN's kernels and
is credited one pass of its forward (the statistics read) where its producer now has the statistics.
The projection is arithmetic on measured per-layer times, not a measured step.
"""

from __future__ import annotations

import argparse
import collections
import json

PATTERNS = ["fprop", "fprop_genstats", "sbr_fprop_gen", "dgrad", "dgrad_drelu_dbn", "wgrad", "sbr_wgrad", "dx_apply"]
PAIRS = [("fprop_genstats", "fprop"), ("sbr_fprop_gen", "fprop"), ("dgrad_drelu_dbn", "dgrad"),
         ("sbr_wgrad", "wgrad")]


def load(path):
    rows = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def fmt(ms):
    return "—" if ms is None else f"{ms:.3f}"


def report(rows, markdown=False):
    by_model = collections.defaultdict(dict)  # (model, dtype) -> {(layer, shape, count): {pattern: row}}
    for r in rows:
        by_model[(r["model"], r["dtype"])].setdefault((r["layer"], r["shape"], r["count"]), {})[r["pattern"]] = r
    out = []
    sep = " | " if markdown else "  "
    for (model, dtype), layers in by_model.items():
        present = [p for p in PATTERNS if any(p in v for v in layers.values())]
        out.append(f"\n{model} {dtype}: median ms of the fastest plan (x N = occurrences in the model)")
        head = ["layer", "shape", "N"] + present
        out.append(("| " if markdown else "") + sep.join(head) + (" |" if markdown else ""))
        if markdown:
            out.append("|" + "---|" * len(head))
        totals = collections.Counter()
        missing = collections.Counter()
        for (layer, shape, count), pats in layers.items():
            cells = [layer, shape, str(count)]
            for p in present:
                r = pats.get(p)
                ms = r["ms"] if r and r["ok"] else None
                cells.append(fmt(ms))
                if ms is None:
                    missing[p] += count
                else:
                    totals[p] += ms * count
            out.append(("| " if markdown else "") + sep.join(cells) + (" |" if markdown else ""))
        out.append("model sums (ms per step, count-weighted): " + ", ".join(
            f"{p} {totals[p]:.3f}" + (f" (missing {missing[p]} convs)" if missing[p] else "") for p in present))
        for fused, plain in PAIRS:
            if fused in present and plain in present and totals[plain] and not missing[fused]:
                out.append(f"  {fused} / {plain}: {totals[fused] / totals[plain]:.3f} "
                           f"(+{totals[fused] - totals[plain]:.3f} ms)")
        errors = {}
        for pats in layers.values():
            for p, r in pats.items():
                if not r["ok"] and p not in errors:
                    errors[p] = r["error"]
        for p, e in errors.items():
            out.append(f"  {p} failed on some layer: {e[:300]}")
    return "\n".join(out)


def blocks(model):
    """(c_in, width, hw_in, stride) per block, CIFAR stem, torchvision's layout."""
    bottleneck = model == "resnet50"
    counts = [3, 4, 6, 3] if bottleneck else [2, 2, 2, 2]
    c_in, hw = 64, 32
    for stage, width in enumerate([64, 128, 256, 512]):
        for b in range(counts[stage]):
            s = 2 if b == 0 and stage > 0 else 1
            yield c_in, width, hw, s
            c_in, hw = width * (4 if bottleneck else 1), hw // s


def project(rows, norm_rows, model, dtype):
    """(plain ms, fused ms, removed batch-norm ms) for one model, from per-layer times and bench_norm.py's rows."""
    conv = {(r["shape"], r["pattern"]): r["ms"] for r in rows
            if r["model"] == model and r["dtype"] == dtype and r["ok"]}
    bn = {(r["shape"], r["variant"]): (r["fwd_ms"], r["bwd_ms"]) for r in norm_rows if r["dtype"] == dtype}
    n = int(next(r["shape"] for r in rows if r["model"] == model).split("x")[0])

    def c(c_in, k, hw, r, s, pattern):
        return conv[(f"{n}x{c_in}x{hw}x{hw} k{k} r{r} s{s}", pattern)]

    def b(ch, hw, variant):
        return bn[(f"{n}x{ch}x{hw}x{hw}", variant)]

    added = removed = 0.0
    for c_in, w, hw, s in blocks(model):
        out = hw // s
        if model == "resnet50":
            # conv1 (1x1) -> bn1 -> conv2 (3x3, stride s) -> bn2 -> conv3 (1x1) -> bn3 + shortcut
            # conv1 produces bn1's statistics; conv2 consumes bn1 and produces bn2's statistics in one fused graph
            # (sbr_fprop_gen), so only conv1 pays the plain epilogue
            prod = [(c_in, w, hw, 1, 1)]
            cons = [(w, w, hw, 3, s), (w, 4 * w, out, 1, 1)]  # the consumers of bn1 and bn2
            fused_bns = [(w, hw), (w, out)]
            last_bn = (4 * w, out)
        else:
            # conv1 (3x3, stride s) -> bn1 -> conv2 (3x3) -> bn2 + shortcut
            prod, cons, fused_bns = [(c_in, w, hw, 3, s)], [(w, w, out, 3, 1)], [(w, out)]
            last_bn = (w, out)
        for p in prod:
            added += c(*p, "fprop_genstats") - c(*p, "fprop")
        for k in cons:
            added += (c(*k, "sbr_fprop_gen") - c(*k, "fprop") + c(*k, "dgrad_drelu_dbn") - c(*k, "dgrad")
                      + c(*k, "sbr_wgrad") - c(*k, "wgrad") + c(*k, "dx_apply"))
        for ch, h in fused_bns:
            fwd, bwd = b(ch, h, "bn_relu")
            removed += fwd + bwd
        # bn3 / bn2 (+ shortcut): one of the four passes of its forward (the statistics read) is no longer needed
        removed += b(*last_bn, "bn_add_relu")[0] / 4
    plain = sum(r["ms"] * r["count"] for r in rows if r["model"] == model and r["dtype"] == dtype and r["ok"]
                and r["pattern"] in ("fprop", "dgrad", "wgrad"))
    return plain, added, removed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--norm", help="bench_norm.py's JSON for the same batch and dtype: adds the projection")
    args = ap.parse_args()
    rows = load(args.jsonl)
    print(report(rows, args.markdown))
    if args.norm:
        with open(args.norm) as fh:
            norm_rows = json.load(fh)["rows"]
        print("\nProjection of the MLPerf design (arithmetic on the times above, not a measured step):")
        for model, dtype in sorted({(r["model"], r["dtype"]) for r in rows}):
            try:
                plain, added, removed = project(rows, norm_rows, model, dtype)
            except KeyError as e:
                print(f"  {model} {dtype}: no time for {e}")
                continue
            print(f"  {model} {dtype}: the fused convolutions and the dx passes add {added:.3f} ms per step, the "
                  f"batch-norm work they remove is {removed:.3f} ms: net {added - removed:+.3f} ms "
                  f"(plain convolutions {plain:.3f} ms)")


if __name__ == "__main__":
    main()
