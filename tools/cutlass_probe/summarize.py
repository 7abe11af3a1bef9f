"""Summary of a cutlass_probe JSONL file (stdlib only): per layer and batch, the best CUTLASS kernel per type, cuDNN's
legacy fp16 / int8, their ratios, and ResNet-18 totals weighted by each shape's count in one forward pass.

    python3 tools/cutlass_probe/summarize.py cutlass_probe.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def read_records(path: str) -> list:
    """The JSON records of a probe run, one per line (other lines reported and skipped)."""
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"unparsed line: {line[:120]}")
    return rows


def column(r: dict) -> str:
    """A timed record's column: cutlass_<dtype>[_res][_p] (persistent instantiations, persistent_conv.cuh, are named
    *_p_* and *_pp_*) or cudnn_legacy_<dtype>."""
    if r["impl"] != "cutlass":
        return "cudnn_legacy_" + r["dtype"]
    persistent = "_p_" in r["kernel"] or "_pp_" in r["kernel"]
    return "cutlass_" + r["dtype"] + ("_res" if r["residual"] else "") + ("_p" if persistent else "")


def best_by_column(rows: list) -> tuple[dict, dict]:
    """best[(layer, n)][column] = (ms, kernel, sampled outputs passed), the fastest record of each column; and each
    layer's count in one ResNet-18 forward pass, in the order the layers come."""
    best: dict = defaultdict(dict)
    counts = {}
    for r in rows:
        if r["kind"] != "time":
            continue
        col, key = column(r), (r["layer"], r["n"])
        counts[r["layer"]] = r["count"]
        if col not in best[key] or r["ms"] < best[key][col][0]:
            best[key][col] = (r["ms"], r["kernel"], r.get("pass", True))
    return best, counts


def main(path: str) -> int:
    rows = read_records(path)
    for r in rows:
        if r["kind"] in ("device", "done"):
            print(json.dumps(r))
    checks = [r for r in rows if r["kind"] == "check"]
    bad = [r for r in checks if not r["pass"]]
    bad_times = [r for r in rows if r["kind"] == "time" and not r.get("pass", True)]
    print(f"checks: {len(checks)} run, {len(bad)} failed; timed runs whose sampled outputs failed: {len(bad_times)}"
          " (marked ! below)")
    for r in checks:
        if r["dtype"] == "int8":
            ok = "ok" if r["pass"] else "FAIL"
            print(f"  {r['kernel']:26s} {r['layer']:28s} max|d| {r['max_abs_diff']:g} "
                  f"(vs f64 {r['max_abs_diff_f64']:g}, {r['mismatches_f64']} of {r['checked']}) "
                  f"nonzero {r['nonzero']} {ok}")
        else:
            ok = "ok" if r["pass"] else "FAIL"
            print(f"  {r['kernel']:26s} {r['layer']:28s} max rel {r['max_rel_err']:.2e} {ok}")
    errors = [r for r in rows if r["kind"] == "error"]
    for r in errors:
        print("error:", json.dumps(r)[:300])

    best, counts = best_by_column(rows)
    cols = ["cutlass_int8", "cutlass_int8_p", "cutlass_int8_res", "cutlass_int8_res_p", "cutlass_fp16",
            "cutlass_fp16_p", "cutlass_fp16_res", "cudnn_legacy_fp16", "cudnn_legacy_int8"]
    print("\nmedian ms per call (best instantiation); x = cudnn_legacy_fp16 / that")
    print(f"{'layer':28s} {'n':>5s} " + " ".join(f"{c:>18s}" for c in cols))
    totals: dict = defaultdict(lambda: defaultdict(float))
    for (layer, n), d in sorted(best.items(), key=lambda kv: (kv[0][1], list(counts).index(kv[0][0]))):
        ref = d.get("cudnn_legacy_fp16", (None,))[0]
        cells = []
        for c in cols:
            if c in d:
                ms = d[c][0]
                totals[n][c] += ms * counts[layer]
                x = f" x{ref / ms:.2f}" if ref else ""
                cells.append(f"{ms:.4f}{x}{'' if d[c][2] else '!'}".rjust(18))
            else:
                cells.append("-".rjust(18))
        print(f"{layer:28s} {n:5d} " + " ".join(cells))
    print("\nResNet-18 convolutions after the stem, sum of count x best ms "
          "(a shape missing from a column leaves it short):")
    for n, t in sorted(totals.items()):
        ref = t.get("cudnn_legacy_fp16")
        print(f"  n={n}: " + ", ".join(f"{c} {v:.3f}" + (f" (x{ref / v:.2f})" if ref else "") for c, v in t.items()))
    print("\nwhich instantiation won:")
    for (layer, n), d in sorted(best.items()):
        print(f"  {layer:28s} {n:5d} " + ", ".join(f"{c}={v[1]}" for c, v in d.items() if c.startswith("cutlass")))
    return 1 if bad or bad_times else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
