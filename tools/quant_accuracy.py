"""Test accuracy of a release through its float engine and its int8 / FP8 engines: the calibration's cost in points.

    python tools/quant_accuracy.py --release cifar10_models/version_A --data .data/cifar10-jpeg.tar.xz
                                   [--dtypes int8,fp8] [--quantize-from stem,layer3] [--limit N]
                                   [--engine-batch-sizes 256] [--quantized-kernels auto,own,cudnn] [--json PATH]

Every backend is CIFAR10Classifier(release, precision=...) on the CIFAR-10 test set (the first --limit images):
the release's own precision first (dtype=None), then each calibrated dtype the release carries
(calibration_<dtype>.json, from `release --int8 / --fp8`), once per --quantize-from (where the 8-bit part begins,
as InferenceEngine takes it; rows other than 'stem' are named <dtype>@<quantize_from>) and, for int8, once per
--quantized-kernels (rows other than 'auto' suffixed :own / :cudnn). Reported per row:
accuracy, the gap to the float engine in points, agreement of the predicted classes with it, and the backend that
ran (a GPU engine, or the host simulation without one). The release's metrics.json has the calibration method
each dtype kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def evaluate(release, data, dtypes, limit=None, engine_batch_sizes=(256,), quantize_from=("stem",),
             kernels=("auto",)) -> dict:
    from resnet_native.release.classifier import CIFAR10Classifier

    images, labels = data.test_images, np.asarray(data.test_labels)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    rows, reference = {}, None
    runs = [(None, "stem", "auto")] + [(dtype, q, k) for dtype in dtypes for q in quantize_from
                                       for k in (kernels if dtype == "int8" else ("auto",))]
    for dtype, where, kernel in runs:
        name = "float" if dtype is None else dtype if where == "stem" else f"{dtype}@{where}"
        name += "" if kernel == "auto" else f":{kernel}"
        start = time.perf_counter()
        clf = CIFAR10Classifier(release, precision=dtype, engine_batch_sizes=engine_batch_sizes, quantize_from=where,
                                quantized_kernels=kernel)
        built = time.perf_counter()
        predicted = clf.predict(images)
        row = {"backend": clf.backend, "quantize_from": clf.quantize_from, "quantized_kernels": kernel,
               "accuracy": float(np.mean(predicted == labels)),
               "build_seconds": built - start, "predict_seconds": time.perf_counter() - built}
        if reference is None:
            reference = (predicted, row["accuracy"])
        else:
            row["gap_points"] = 100.0 * (reference[1] - row["accuracy"])
            row["agreement"] = float(np.mean(predicted == reference[0]))
        rows[name] = row
        print(f"{name:18s} {row['backend']:18s} accuracy {row['accuracy']:.4f}"
              + (f"  gap {row['gap_points']:+.2f} points  agreement {row['agreement']:.4f}" if dtype else "")
              + f"  (built in {row['build_seconds']:.1f} s, predicted in {row['predict_seconds']:.1f} s)",
              flush=True)
    return {"images": int(len(labels)), "results": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--release", required=True, help="a release folder (or version name)")
    p.add_argument("--data", required=True, help="a CIFAR-10 source (its test set is evaluated)")
    p.add_argument("--dtypes", default="int8,fp8", help="comma-separated calibrated dtypes to evaluate")
    p.add_argument("--quantize-from", default="stem",
                   help="comma-separated parts where the 8-bit engines begin (stem, layer1 .. layer4, auto)")
    p.add_argument("--limit", type=int, help="evaluate only the first N test images")
    p.add_argument("--engine-batch-sizes", default="256",
                   help="comma-separated batch sizes the GPU engines are built for (each is a per-layer search)")
    p.add_argument("--quantized-kernels", default="auto",
                   help="comma-separated kernel choices of the int8 engines (auto, own, cudnn)")
    p.add_argument("--json", help="write the figures to PATH")
    args = p.parse_args(argv)
    from resnet_native.data import load_cifar10

    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    sizes = tuple(int(b) for b in args.engine_batch_sizes.split(",") if b)
    from resnet_native._core.names import choice
    from resnet_native.quantization.prefix import AUTO, QUANTIZE_FROM

    where = tuple(choice("--quantize-from", q, QUANTIZE_FROM + (AUTO,)) for q in args.quantize_from.split(",") if q)
    from resnet_native.inference.kernel_choice import QUANTIZED_KERNELS

    kernels = tuple(choice("--quantized-kernels", k, QUANTIZED_KERNELS) for k in args.quantized_kernels.split(",") if k)
    report = evaluate(args.release, load_cifar10(args.data), dtypes, args.limit, sizes, where, kernels)
    if args.json:
        from resnet_native._core.files import atomic_write_text

        atomic_write_text(args.json, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
