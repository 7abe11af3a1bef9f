"""Markdown tables of the CUTLASS probe's per-layer times: plain against persistent instantiations (best of each
per shape and dtype), and with --cudnn (tools/conv_shapes_cudnn.py's JSON from the same device call) against
cuDNN's fp16 graph-engine convolutions. Rows are ResNet-18's shapes after the stem; the last rows sum count x ms.

    python tools/cutlass_probe/per_layer_table.py RUN/cutlass_probe.jsonl [--cudnn RUN/conv_shapes_cudnn.json]
"""

import argparse
import collections
import json

from summarize import best_by_column, read_records


def best_times(path):
    """{(layer, batch, dtype, persistent): (ms, kernel, count)}: summarize.py's fastest instantiation per column,
    those without a residual."""
    best, counts = best_by_column(read_records(path))
    return {
        (layer, n, dtype, persistent): (d[col][0], d[col][1], counts[layer])
        for (layer, n), d in best.items()
        for dtype in ("int8", "fp16")
        for persistent, col in ((False, f"cutlass_{dtype}"), (True, f"cutlass_{dtype}_p"))
        if col in d
    }


def shapes(best):
    """(layer, batch) in ResNet-18's order, batch by batch."""
    seen = []
    for layer, n, _, _ in best:
        if (layer, n) not in seen:
            seen.append((layer, n))
    return sorted(seen, key=lambda s: (s[1], seen.index(s)))


def persistent_table(best):
    print("| layer | batch | count | int8 ms (kernel) | int8 persistent ms (kernel) | persistent / plain "
          "| fp16 ms | fp16 persistent ms (kernel) | persistent / plain |")
    print("|---|---|---|---|---|---|---|---|---|")
    total = collections.Counter()
    for layer, n in shapes(best):
        i, ip = best[(layer, n, "int8", False)], best[(layer, n, "int8", True)]
        f, fp = best[(layer, n, "fp16", False)], best[(layer, n, "fp16", True)]
        for key, ms in (("i", i[0]), ("ip", ip[0]), ("f", f[0]), ("fp", fp[0])):
            total[(n, key)] += i[2] * ms
        print(f"| {layer} | {n} | {i[2]} | {i[0]:.4f} ({i[1]}) | {ip[0]:.4f} ({ip[1]}) | {ip[0] / i[0]:.2f} "
              f"| {f[0]:.4f} | {fp[0]:.4f} ({fp[1]}) | {fp[0] / f[0]:.2f} |")
    for n in sorted({n for n, _ in total}):
        t = {k: total[(n, k)] for k in ("i", "ip", "f", "fp")}
        print(f"| sum x count | {n} | | {t['i']:.3f} | {t['ip']:.3f} | {t['ip'] / t['i']:.2f} | {t['f']:.3f} "
              f"| {t['fp']:.3f} | {t['fp'] / t['f']:.2f} |")


def cudnn_table(best, cudnn_path):
    cudnn = {(r["layer"], r["batch"]): r for r in json.load(open(cudnn_path)) if r["precision"] == "fp16"}
    print("| layer | batch | count | cuDNN fp16 ms | CUTLASS fp16 ms | fp16 persistent ms | best fp16 / cuDNN "
          "| int8 ms | int8 persistent ms | cuDNN fp16 / best int8 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    total = collections.Counter()
    for layer, n in shapes(best):
        c = cudnn[(layer, n)]
        f, fp = best[(layer, n, "fp16", False)][0], best[(layer, n, "fp16", True)][0]
        i, ip = best[(layer, n, "int8", False)][0], best[(layer, n, "int8", True)][0]
        for key, ms in (("c", c["ms"]), ("f", f), ("fp", fp), ("bf", min(f, fp)), ("i", i), ("ip", ip),
                        ("bi", min(i, ip))):
            total[(n, key)] += c["count"] * ms
        print(f"| {layer} | {n} | {c['count']} | {c['ms']:.4f} | {f:.4f} | {fp:.4f} | {min(f, fp) / c['ms']:.2f} "
              f"| {i:.4f} | {ip:.4f} | {c['ms'] / min(i, ip):.2f} |")
    for n in sorted({n for n, _ in total}):
        t = {k: total[(n, k)] for k in ("c", "f", "fp", "bf", "i", "ip", "bi")}
        print(f"| sum x count | {n} | | {t['c']:.3f} | {t['f']:.3f} | {t['fp']:.3f} | {t['bf'] / t['c']:.2f} "
              f"| {t['i']:.3f} | {t['ip']:.3f} | {t['c'] / t['bi']:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", help="cutlass_probe.jsonl of run_on_gpu.sh")
    p.add_argument("--cudnn", help="conv_shapes_cudnn.json of the same device call")
    args = p.parse_args()
    best = best_times(args.probe)
    if args.cudnn:
        cudnn_table(best, args.cudnn)
    else:
        persistent_table(best)


if __name__ == "__main__":
    main()
