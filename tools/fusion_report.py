"""Summarises tools/probe_fusions.cpp's JSON lines: per layer, each pattern's best time, and per model the sums
weighted by how often each layer occurs, beside what the fused design would replace.

    python tools/fusion_report.py fusions.jsonl [--plans fusions_plans.jsonl.gz] [--markdown]

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

With FUSIONS_ENUM=all (every heuristics mode and every engine of cuDNN's list tried per graph) the report adds,
per model and dtype, which patterns reached a precompiled engine (one without cuDNN's runtime-compilation note)
and on how many layers, and the best fused time against the plain convolution it replaces, per layer and
count-weighted per step, both for the best plan of any kind and for the best precompiled one.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json

# Fused pattern -> the plain convolution it replaces (dx_apply replaces none: it is the pass the fusion adds).
REPLACES = {"fprop_genstats": "fprop", "sbr_fprop_gen": "fprop", "conv_genstats": "fprop", "sbrcs": "fprop",
            "dbarcs": "fprop", "dbarcs_relu": "fprop", "dgrad_drelu_dbn": "dgrad", "dgrad_drelu_bnbwdw": "dgrad",
            "sbr_wgrad": "wgrad", "convbn_wgrad": "wgrad", "dx_apply": None}
PATTERNS = ["fprop", "dgrad", "wgrad", *REPLACES]
PAIRS = [(fused, plain) for fused, plain in REPLACES.items() if plain]
# The samples' graphs equal to first-set ones, for the projection when only one of the two was run.
SAME_GRAPH = {"fprop_genstats": "conv_genstats", "sbr_wgrad": "convbn_wgrad"}


def load(*paths):
    """The probe's graph rows (older runs' rows have no kind), and its other lines by kind; .gz files read as such."""
    rows, other = [], collections.defaultdict(list)
    for path in paths:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
            read(fh, rows, other)
    return rows, other


def read(fh, rows, other):
    for line in fh:
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            kind = r.get("kind", "graph")
            (rows if kind == "graph" else other[kind]).append(r)


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


def ratio(a, b):
    return f"{a / b:.3f}" if b else "—"


def reach(rows, plans, markdown=False):
    """Per model and dtype, from an enumerated run: per fused pattern, the precompiled engines that took it, on how
    many layers one ran (checked and timed), and the count-weighted sums of the best fused plan, the best precompiled
    one and the plain convolution it replaces; then per layer the same times."""
    by = collections.defaultdict(lambda: collections.defaultdict(dict))  # (model, dtype) -> layer key -> pattern
    for r in rows:
        if r.get("enumerated"):
            by[(r["model"], r["dtype"])][(r["layer"], r["shape"], r["count"])][r["pattern"]] = r
    tried = collections.defaultdict(set)  # (model, dtype, pattern) -> precompiled engines built and timed
    for p in plans:
        if not p["rtc"] and p["built"] and p["ms"] >= 0:
            tried[(p["model"], p["dtype"], p["pattern"])].add(p["engine"])
    out = []
    sep = " | " if markdown else "  "

    def line(cells):
        out.append(("| " if markdown else "") + sep.join(cells) + (" |" if markdown else ""))

    for (model, dtype), layers in by.items():
        present = [p for p in REPLACES if any(p in v for v in layers.values())]
        out.append(f"\n{model} {dtype}: precompiled engines (no runtime-compilation note) per fused pattern; sums are "
                   "ms per step, count-weighted, over the layers where both times exist")
        head = ["pattern", "vs", "precompiled engines offered (timed)", "layers a precompiled plan ran on", "fused",
                "plain", "fused/plain", "precompiled", "plain (same layers)", "precompiled/plain"]
        line(head)
        if markdown:
            out.append("|" + "---|" * len(head))
        for pattern in present:
            plain = REPLACES[pattern]
            offered, ran, n = set(), 0, 0
            fused = pre = base = base_pre = 0.0
            for pats in layers.values():
                r = pats.get(pattern)
                if not r:
                    continue
                n += 1
                offered.update(int(e) for e in r["precompiled_engines"].split())
                ran += r["pre_ms"] >= 0
                b = pats.get(plain, {}).get("ms", -1) if plain else 0.0
                if r["ok"] and b >= 0:
                    fused, base = fused + r["ms"] * r["count"], base + b * r["count"]
                if r["pre_ms"] >= 0 and b >= 0:
                    pre, base_pre = pre + r["pre_ms"] * r["count"], base_pre + b * r["count"]
            timed = sorted(tried[(model, dtype, pattern)])
            engines = " ".join(map(str, sorted(offered))) or "none"
            if timed:
                engines += f" (timed: {' '.join(map(str, timed))})"
            line([pattern, plain or "—", engines, f"{ran}/{n}", f"{fused:.3f}", f"{base:.3f}" if plain else "—",
                  ratio(fused, base), f"{pre:.3f}" if ran else "—", f"{base_pre:.3f}" if ran and plain else "—",
                  ratio(pre, base_pre) if ran else "—"])
        out.append(f"\n{model} {dtype} per layer: best fused ms (P: a precompiled plan, R: runtime-compiled) / best "
                   "precompiled ms where a runtime-compiled plan was faster; plain convolutions in the first columns")
        head = ["layer", "shape", "N", "fprop", "dgrad", "wgrad", *present]
        line(head)
        if markdown:
            out.append("|" + "---|" * len(head))
        for (layer, shape, count), pats in layers.items():
            cells = [layer, shape, str(count)]
            for p in ["fprop", "dgrad", "wgrad", *present]:
                r = pats.get(p)
                if not r or not r["ok"]:
                    cells.append("—" if not r else "fail")
                    continue
                kind = "R" if r["rtc_ms"] >= 0 and r["ms"] == r["rtc_ms"] else "P"
                cell = f"{r['ms']:.3f}{kind if p in REPLACES else ''}"
                if kind == "R" and r["pre_ms"] >= 0:
                    cell += f"/{r['pre_ms']:.3f}"
                cells.append(cell)
            line(cells)
        bad = collections.Counter(r["pattern"] for pats in layers.values() for r in pats.values() if r["bad_output"])
        lite = sum(r["lite"] for pats in layers.values() for r in pats.values())
        skipped = sum("deadline" in r["error"] for pats in layers.values() for r in pats.values())
        if bad:
            out.append("  plans whose outputs failed the check (unwritten or not finite), per pattern: "
                       + ", ".join(f"{p} {c}" for p, c in bad.items()))
        if lite or skipped:
            out.append(f"  deadline: {lite} graphs with plans capped at 4, {skipped} skipped")
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
        key = f"{n}x{c_in}x{hw}x{hw} k{k} r{r} s{s}"
        if (key, pattern) not in conv and pattern in SAME_GRAPH:
            pattern = SAME_GRAPH[pattern]
        return conv[(key, pattern)]

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
    ap.add_argument("--plans", help="the enumeration's per-plan lines (fusions_plans.jsonl[.gz])")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--norm", help="bench_norm.py's JSON for the same batch and dtype: adds the projection")
    args = ap.parse_args()
    rows, other = load(args.jsonl, *([args.plans] if args.plans else []))
    for gpu, cc, cudnn, frontend in sorted({(d["gpu"], d["cc"], d["cudnn"], d["frontend"]) for d in other["device"]}):
        print(f"{gpu} (compute capability {cc}), cuDNN {cudnn}, cudnn-frontend {frontend}")
    print(report(rows, args.markdown))
    if any(r.get("enumerated") for r in rows):
        print(reach(rows, other["plan"], args.markdown))
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
