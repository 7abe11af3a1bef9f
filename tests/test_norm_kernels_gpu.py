"""Which cuDNN batch-norm kernels a whole NHWC training step launches, read from the GPU itself (CUPTI, through
torch.profiler, which records every kernel of the process whoever launched it).

On NHWC every batch norm must run in cuDNN's persistent NHWC kernels, in every precision: the generic
`bn_*_1C11_singleread` kernels that cuDNN's non-Ex calls pick there are several times slower (they made bf16
training 7-12x slower than PyTorch) and must never appear. The paths (resnet_native.norm.last_path) say the same
from our side; this test checks what the GPU ran.
"""

import collections

import pytest

import resnet_native as rn

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch", reason="torch.profiler reads the kernel names")

GENERIC = "singleread"


def bn_kernels_of_one_step(precision: str) -> collections.Counter:
    model = rn.ResNet18(num_classes=10, stem="cifar", layout="NHWC", precision=precision, seed=0)
    opt = rn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = rn.step.TrainStep(model, opt, scaler=rn.optim.GradScaler() if precision == "fp16" else None)
    x = rn.kernels.cast(cp.random.standard_normal((8, 16, 16, 3), dtype=cp.float32),
                        cp.empty((8, 16, 16, 3), dtype=model.input_dtype))
    y = cp.random.randint(0, 10, 8).astype(cp.int32)
    step.run(x, y)  # algorithm search and buffers outside the profile
    cp.cuda.Device().synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step.run(x, y)
        cp.cuda.Device().synchronize()
    names = collections.Counter()
    for event in prof.events():
        lowered = event.name.lower()
        if event.device_type == torch.autograd.DeviceType.CUDA and ("batchnorm" in lowered or "bn_" in lowered):
            names[event.name.split("<")[0]] += 1
    return names


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_every_nhwc_batch_norm_runs_in_the_persistent_nhwc_kernels(precision):
    names = bn_kernels_of_one_step(precision)
    # ResNet-18: 20 batch norms, each a forward and a backward kernel at least.
    assert sum(names.values()) >= 40, f"{precision}: too few batch-norm kernels recorded: {dict(names)}"
    generic = {name: n for name, n in names.items() if GENERIC in name}
    assert not generic, f"{precision}: cuDNN's generic batch-norm kernels ran: {generic} (all: {dict(names)})"
    assert all("nhwc" in name.lower() for name in names), f"{precision}: {dict(names)}"
