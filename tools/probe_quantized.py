"""Which int8 / FP8 convolutions cuDNN runs on this GPU, and how fast against fp16 (one table, one device call).

    python tools/probe_quantized.py [--json PATH]

For each ResNet-50 (CIFAR) layer shape at batch 256 and each epilogue the quantised engine uses, the fused
quantised convolution (quantized_conv.conv2d, algo 'find') with an 8-bit and a float output, and the fp16
graph-engine convolution with bias + ReLU; median ms of 20 calls between CUDA events after warm-up, or cuDNN's
refusal. x_fp16 = fp16 time / quantised time. Beside them, cuDNN's legacy INT8x32 path (NCHW_VECT_C,
cudnnConvolutionBiasActivationForward, int8 output; layers with channel multiples of 32) on the same shapes.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys

import numpy as np

# (name, H, C, K, kernel, stride): ResNet-50's CIFAR layers (the stem padded to 16 channels).
SHAPES = [("stem", 32, 16, 64, 3, 1), ("l1.conv1", 32, 64, 64, 1, 1), ("l1.conv2", 32, 64, 64, 3, 1),
          ("l1.conv3", 32, 64, 256, 1, 1), ("l2.conv2.s2", 32, 128, 128, 3, 2), ("l3.conv2", 8, 256, 256, 3, 1),
          ("l4.conv2", 4, 512, 512, 3, 1), ("l4.conv3", 4, 512, 2048, 1, 1)]
BATCH = 256


def median_ms(call, runs=20):
    import cupy as cp

    for _ in range(3):
        call()
    times = []
    for _ in range(runs):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def main(argv=None) -> int:
    import cupy as cp

    from resnet_native.ops import conv, quantized_conv
    from resnet_native.quantization.fp8 import encode_e4m3

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="probe_quantized.json")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for name, h, c, k, r, stride in SHAPES:
        pad = r // 2
        ho = (h + 2 * pad - r) // stride + 1
        x16 = cp.asarray(rng.standard_normal((BATCH, h, h, c)).astype(np.float16))
        w16 = cp.asarray((rng.standard_normal((k, r, r, c)) * 0.05).astype(np.float16))
        b16 = cp.zeros(k, cp.float16)
        y16 = cp.empty((BATCH, ho, ho, k), cp.float16)
        spec16 = conv.ConvSpec(stride=stride, padding=pad, layout="NHWC", precision="fp16", engine="graph")
        fp16_ms = median_ms(functools.partial(conv.conv2d, x16, w16, spec16, bias=b16, activation="relu", out=y16))
        for precision in ("int8", "fp8"):
            if precision == "int8":
                xq = cp.asarray(rng.integers(-127, 128, (BATCH, h, h, c)).astype(np.int8))
                wq = cp.asarray(rng.integers(-127, 128, (k, r, r, c)).astype(np.int8))
            else:
                xq = cp.asarray(encode_e4m3(rng.standard_normal((BATCH, h, h, c))))
                wq = cp.asarray(encode_e4m3(rng.standard_normal((k, r, r, c))))
            spec = conv.ConvSpec(stride=stride, padding=pad, layout="NHWC", precision=precision, engine="graph")
            scale, bias = cp.full(k, 1e-3, cp.float32), cp.zeros(k, cp.float32)
            z = cp.zeros((BATCH, ho, ho, k), xq.dtype)
            # What the engine runs: 8-bit outputs of conv-BN-ReLU and of a block's last conv, and the last block's
            # float output.
            for out_name, out_dtype, epilogue in ((precision, xq.dtype, "scale+bias+relu"),
                                                  (precision, xq.dtype, "scale+bias+residual+relu"),
                                                  ("fp32", np.float32, "scale+bias+residual+relu")):
                out = cp.empty((BATCH, ho, ho, k), out_dtype)
                kw = dict(bias=bias, relu=epilogue.endswith("relu"),
                          z=z if "residual" in epilogue else None, gamma=0.5, out=out)
                row = dict(layer=name, precision=precision, out=out_name, epilogue=epilogue, fp16_ms=fp16_ms)
                try:
                    row["ms"] = median_ms(functools.partial(quantized_conv.conv2d, xq, wq, spec, scale, **kw))
                    row["x_fp16"] = fp16_ms / row["ms"]
                except Exception as e:  # the probe's answer: what cuDNN refuses
                    row["error"] = f"{type(e).__name__}: {str(e)[:700]}"
                rows.append(row)
                status = f"{row['ms']:.4f} ms  x{row['x_fp16']:.2f}" if "ms" in row else row["error"][:140]
                print(f"{name:12s} {precision:4s} out={out_name:5s} {epilogue:26s} fp16 {fp16_ms:.4f} ms  {status}",
                      flush=True)
    from resnet_native._core.loader import _C

    for name, h, c, k, r, stride in SHAPES:
        row = dict(layer=name, precision="int8x32 legacy", out="int8", epilogue="bias+relu")
        if c % 32 or k % 32:
            row["error"] = "channels not a multiple of 32"
        else:
            found = _C._testing.probe_legacy_int8x32(BATCH, c, h, h, k, r, stride, r // 2, True, 20)
            if found["supported"]:
                fp16 = next(x["fp16_ms"] for x in rows if x["layer"] == name)
                row.update(ms=found["ms"], x_fp16=fp16 / found["ms"])
            else:
                row["error"] = found["error"]
        rows.append(row)
        print(f"{name:12s} int8x32 legacy  " + (f"{row['ms']:.4f} ms  x{row['x_fp16']:.2f}" if "ms" in row
                                                else row["error"][:200]), flush=True)
    with open(args.json, "w") as f:
        json.dump({"batch": BATCH, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
