"""The optimizer's update alone: our multi-tensor AdamW, SGD and finite check over a model's parameters, against
PyTorch's fused optimizers, as bandwidth against the device's copy rate.

    python benchmarks/bench_optimizer.py [--models resnet18,resnet50] [--chunks 32768,default] [--json PATH]

For each model (its parameter shapes, as the trainer holds them: fp32 master weights and optimizer state, fp16
gradients and fp16 model copies) and each chunk size of the lists (the unit of work of one block; 'default' is
multi_tensor.CHUNK_ELEMENTS): one AdamW update with device lr / step / inverse scale / found_inf, as a captured
fp16 training step runs it; one Nesterov SGD update with weight decay; one check_finite over the gradients. Each is
timed as 20 calls captured in one CUDA graph (device time only). GB/s counts the bytes the update must move at
least (AdamW 28 per element: read and write the weight, m and v, read the fp16 gradient, write the fp16 copy;
SGD 20; the check 2), against a device-to-device copy's rate measured in the same process. PyTorch's rival:
torch.optim.AdamW / SGD with fused=True (capturable AdamW) on fp32 parameters with fp32 gradients, as autocast
training holds them (AdamW 28 bytes per element there too, SGD 24), captured in a CUDA graph the same way.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cupy_graphed_time, environment, format_table, torch_graphed_time, write_json  # noqa: E402

BYTES_PER_ELEMENT = {"adamw": 28, "sgd": 20, "check_finite": 2}
TORCH_BYTES_PER_ELEMENT = {"adamw": 28, "sgd": 24}
COLUMNS = [("model", "model"), ("chunk", "chunk"), ("op", "op"), ("elements", "elements"), ("blocks", "chunks"),
           ("us", "us"), ("gbs", "GB/s"), ("copy_pct", "% of copy"), ("torch_us", "torch us"),
           ("torch_gbs", "torch GB/s"), ("ratio", "torch/ours")]


def parameter_shapes(model_name: str) -> list:
    from resnet_native.nn.models.registry import create_model

    model = create_model(model_name, layout="NHWC", precision="fp16", seed=0)
    return [tuple(p.shape) for p in model.parameters()]


def copy_rate_gbs() -> float:
    """Bytes read plus bytes written per second by a 1 GiB device-to-device copy (captured, 20 calls)."""
    import cupy as cp

    src, dst = cp.ones(1 << 30, cp.uint8), cp.empty(1 << 30, cp.uint8)

    def copy():
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                    cp.cuda.get_current_stream().ptr)

    ms = cupy_graphed_time(copy)["median_ms"]
    return 2 * src.nbytes / ms / 1e6


def time_ours(shapes, chunk) -> dict:
    import cupy as cp
    import numpy as np

    from resnet_native.ops import multi_tensor as mt

    rng = np.random.default_rng(0)

    def arrays(dtype, scale=1.0):
        return [cp.asarray((rng.standard_normal(s) * scale).astype(dtype)) for s in shapes]

    kw = {} if chunk is None else {"chunk_elements": chunk}
    params, grads = mt.TensorList(arrays(np.float32), **kw), mt.TensorList(arrays(np.float16, 1e-2), **kw)
    m = mt.TensorList(arrays(np.float32, 1e-3), **kw)
    v = mt.TensorList([abs(a) for a in arrays(np.float32, 1e-4)], **kw)
    copies = mt.TensorList(arrays(np.float16), **kw)
    found_inf = cp.zeros((1,), cp.int32)
    lr, step, inv_scale = (cp.full((1,), x, cp.float32) for x in (1e-3, 10.0, 1.0 / 1024))

    def adamw():
        mt.adamw_step(params, grads, m, v, lr=lr, step=step, inv_scale=inv_scale, found_inf=found_inf,
                      weight_decay=0.05, model_copies=copies)

    def sgd():
        mt.sgd_step(params, grads, m, lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4, inv_scale=inv_scale,
                    found_inf=found_inf, model_copies=copies)

    def check():
        mt.check_finite(grads, found_inf)

    out = {"elements": sum(int(np.prod(s)) for s in shapes), "blocks": params.num_chunks}
    for name, fn in (("adamw", adamw), ("sgd", sgd), ("check_finite", check)):
        fn()
        out[name] = cupy_graphed_time(fn)["median_ms"] * 1e3
    assert int(found_inf.get()[0]) == 0, "a finite gradient was reported as inf/nan"
    return out


def time_torch(shapes) -> dict:
    import torch

    out = {}
    for name in ("adamw", "sgd"):
        params = [torch.randn(s, device="cuda", requires_grad=True) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-2
        if name == "adamw":
            opt = torch.optim.AdamW(params, lr=torch.tensor(1e-3, device="cuda"), weight_decay=0.05, fused=True,
                                    capturable=True)
        else:
            opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=True)
        try:
            out[name] = torch_graphed_time(opt.step)["median_ms"] * 1e3
        except Exception as e:  # a rival that cannot be captured is reported, not timed eagerly
            out[name] = None
            print(f"torch {name}: {type(e).__name__}: {e}", file=sys.stderr)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,resnet50")
    p.add_argument("--chunks", default="32768,default", help="chunk sizes of the lists ('default': the package's)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from resnet_native.ops import multi_tensor as mt

    copy_gbs = copy_rate_gbs()
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    rows = []
    for model in args.models.split(","):
        shapes = parameter_shapes(model)
        theirs = {} if args.no_torch else time_torch(shapes)
        for chunk_text in args.chunks.split(","):
            chunk = None if chunk_text == "default" else int(chunk_text)
            ours = time_ours(shapes, chunk)
            for op, per_element in BYTES_PER_ELEMENT.items():
                gbs = ours["elements"] * per_element / ours[op] / 1e3
                row = {"model": model, "chunk": chunk or mt.CHUNK_ELEMENTS, "op": op, "elements": ours["elements"],
                       "blocks": ours["blocks"], "us": ours[op], "gbs": gbs, "copy_pct": 100 * gbs / copy_gbs}
                if theirs.get(op) is not None:
                    row["torch_us"] = theirs[op]
                    row["torch_gbs"] = ours["elements"] * TORCH_BYTES_PER_ELEMENT[op] / theirs[op] / 1e3
                    row["ratio"] = theirs[op] / ours[op]
                rows.append(row)
    print(format_table(rows, COLUMNS, title="optimizer update, device time per call (20 calls in one CUDA graph)"))
    if args.json:
        write_json(args.json, {"environment": environment(), "args": vars(args), "copy_gbs": copy_gbs, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
