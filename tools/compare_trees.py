"""Compare benchmark JSON files of two trees run in the same device call: per row, the median time of each tree's
runs and the ratio (current / baseline; below 1 is faster). Used by tools/gpu_check.sh's `baseline` stage.

    python tools/compare_trees.py --baseline old_1.json old_2.json --current new_1.json new_2.json [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

# The time each benchmark reports per row, and the fields that name a row.
TIME_FIELDS = ("ours_graph_ms", "median_ms")
KEY_FIELDS = ("model", "image", "dtype", "batch", "impl")


def row_times(paths) -> dict:
    """{row key: [time of each file]} over the files' rows that carry a time field."""
    times = {}
    for path in paths:
        with open(path) as f:
            rows = json.load(f)["rows"]
        for row in rows:
            field = next((f for f in TIME_FIELDS if row.get(f) is not None), None)
            if field is None:
                continue
            key = tuple((k, row[k]) for k in KEY_FIELDS if k in row) + (("time", field),)
            times.setdefault(key, []).append(float(row[field]))
    return times


def compare(baseline, current) -> list:
    old, new = row_times(baseline), row_times(current)
    out = []
    for key in sorted(set(old) & set(new), key=str):
        o, n = statistics.median(old[key]), statistics.median(new[key])
        out.append({**dict(key), "baseline_ms": o, "current_ms": n, "ratio": n / o,
                    "baseline_runs": old[key], "current_runs": new[key]})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", nargs="+", required=True)
    p.add_argument("--current", nargs="+", required=True)
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = compare(args.baseline, args.current)
    for r in rows:
        name = " ".join(f"{k}={r[k]}" for k in KEY_FIELDS if k in r)
        print(f"{name:60s} baseline {r['baseline_ms']:9.4f} ms  current {r['current_ms']:9.4f} ms  "
              f"ratio {r['ratio']:.3f}")
    if rows:
        ratios = [r["ratio"] for r in rows]
        print(f"rows {len(rows)}: ratio median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
              f"max {max(ratios):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
