"""AutoAugment on the host: the PIL reference against the batched NumPy path the workers run, per image, and the
worker pool's throughput for a whole training set (recipe B's case: 50,000 CIFAR images, crop and flip first).

    python benchmarks/bench_autoaugment.py [--images 50000] [--workers 0,2,N] [--json PATH]

Random uint8 images stand in for the data set (the ops' cost does not depend on the content: every op's work is the
same for any values). Each figure is the median of --repeats runs over the same sampled choices (epoch 0's),
after one warm-up run; worker figures time AutoAugmentWorkers.result() from a cold start of the epoch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, format_table, write_json  # noqa: E402


def median_seconds(fn, repeats):
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv=None):
    from resnet_native.data import autoaugment as aa
    from resnet_native.data import autoaugment_batched as ab

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=50000)
    p.add_argument("--per-image-sample", type=int, default=2000, help="images for the single-process figures")
    p.add_argument("--workers", default=f"0,2,{max(1, len(os.sched_getaffinity(0)) - 1)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args(argv)

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.images, 32, 32, 3), dtype=np.uint8)
    sample = images[: args.per_image_sample]
    choices = aa.sample_autoaugment(0, 0, len(sample), crop_padding=4, flip=True)
    rows = []
    for name, fn in (("PIL, one image at a time", aa.autoaugment_images_pil), ("batched NumPy", ab.autoaugment_batch)):
        s = median_seconds(lambda fn=fn: fn(sample, choices), args.repeats)
        rows.append({"path": name, "workers": 1, "images": len(sample), "seconds": s,
                     "us_per_image": s / len(sample) * 1e6, "images_per_s": len(sample) / s})
    for workers in (int(w) for w in args.workers.split(",")):
        with aa.AutoAugmentWorkers(images, seed=0, workers=workers, crop_padding=4, flip=True) as pool:
            epoch = iter(range(10**6))
            s = median_seconds(lambda pool=pool, epoch=epoch: pool.result(next(epoch)), args.repeats)
        rows.append({"path": "batched NumPy, AutoAugmentWorkers", "workers": max(workers, 1), "images": args.images,
                     "seconds": s, "us_per_image": s / args.images * 1e6, "images_per_s": args.images / s})
    columns = [("path", "path"), ("workers", "processes"), ("images", "images"), ("seconds", "s"),
               ("us_per_image", "us / image"), ("images_per_s", "images / s")]
    print(format_table(rows, columns))
    if args.json:
        write_json(args.json, {"environment": environment(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
