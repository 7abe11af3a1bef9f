"""Test accuracy of trained runs under test-time views: plain, flip, and flip + 1-pixel translations.

    python .gpu/tta_views.py --json OUT.json RUN_DIR [RUN_DIR ...]

Each run is released (best.npz, no benchmark) into /tmp/tta_rel and served by CIFAR10Classifier's fp16 engine; the
views are made on the host from the uint8 test images (reflect or zero padding), logits averaged in float64.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

import numpy as np

from resnet_native.data.cifar10 import decode_source
from resnet_native.release.classifier import CIFAR10Classifier

p = argparse.ArgumentParser()
p.add_argument("--json", required=True)
p.add_argument("--data", default=".data/cifar10-jpeg.tar.xz")
p.add_argument("--budget-s", type=float, default=1e9)
p.add_argument("runs", nargs="+")
a = p.parse_args()
t0 = time.time()
data = decode_source(a.data)
x, y = data.test_images, data.test_labels.astype(np.int64)

def shift(img, dy, dx, mode):
    pad = np.pad(img, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="reflect" if mode == "reflect" else "constant")
    return np.ascontiguousarray(pad[:, 1 + dy:33 + dy, 1 + dx:33 + dx])


def flip(img):
    return np.ascontiguousarray(img[:, :, ::-1])


out = []
for i, run in enumerate(a.runs):
    if time.time() - t0 > a.budget_s:
        break
    name = f"r{i}"
    r = subprocess.run([sys.executable, "-m", "resnet_native.release", "--run", run, "--version", name, "--out",
                        "/tmp/tta_rel", "--no-benchmark"], capture_output=True, text=True)
    if r.returncode:
        print(run, "release failed", r.stderr[-800:])
        continue
    clf = CIFAR10Classifier(name, models_dir="/tmp/tta_rel", batch_size=1000)

    def L(img, clf=clf):  # noqa: N802
        return clf.logits(img).astype(np.float64)

    def acc(lg):
        return float((lg.argmax(1) == y).mean())

    v = {"plain": L(x), "flip": L(flip(x))}
    for mode in ("reflect", "zero"):
        for dy, dx in ((-1, -1), (1, 1), (-1, 1), (1, -1), (0, -1), (0, 1), (-1, 0), (1, 0)):
            s = shift(x, dy, dx, mode)
            v[f"{mode}{dy}{dx}"], v[f"{mode}{dy}{dx}f"] = L(s), L(flip(s))
    base = 0.5 * (v["plain"] + v["flip"])
    res = {"run": run, "plain": acc(v["plain"]), "flip": acc(base)}
    for mode in ("reflect", "zero"):
        diag = sum(v[f"{mode}{d}"] + v[f"{mode}{d}f"] for d in ("-1-1", "11")) / 4
        res[f"airbench_{mode}"] = acc(0.5 * base + 0.5 * diag)  # airbench's level 2 weights
        four = sum(v[f"{mode}{d}"] + v[f"{mode}{d}f"] for d in ("0-1", "01", "-10", "10")) / 8
        res[f"cross4_{mode}"] = acc(0.5 * base + 0.5 * four)
        allv = sum(v[k] for k in v if k.startswith(mode)) / 16
        res[f"all8_{mode}"] = acc(0.5 * base + 0.5 * allv)
        res[f"uniform10_{mode}"] = acc((2 * base + 8 * four) / 10)
    try:
        summary = json.load(open(pathlib.Path(run) / "summary.json"))
        res["summary"] = {k: summary.get(k) for k in ("test_acc", "test_acc_tta", "best_epoch")}
    except OSError:
        pass
    print(json.dumps(res))
    out.append(res)
    json.dump(out, open(a.json, "w"), indent=1)
keys = [k for k in out[0] if k not in ("run", "summary")] if out else []
for k in keys:
    vals = [r[k] for r in out]
    print(f"{k:20s} mean {100*np.mean(vals):.2f}  min {100*min(vals):.2f}  max {100*max(vals):.2f}")
