"""Session 22, call 3: eager forward latency and a cProfile of it (run once per tree, PYTHONPATH picking the tree)."""
import cProfile
import io
import pstats
import time

import cupy as cp
import numpy as np

import resnet_native as rn

print("package", rn.__file__)
for name, batch in (("ResNet18", 1), ("ResNet50", 256)):
    model = getattr(rn, name)(num_classes=10, stem="cifar", layout="NHWC", precision="fp16", seed=0)
    model.cuda().eval()
    x = cp.asarray(np.random.default_rng(0).standard_normal((batch, 32, 32, 3)).astype(np.float16))
    for _ in range(20):
        model.forward(x)
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(50):
        t = time.perf_counter()
        model.forward(x)
        cp.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t)
    print(name, batch, "median ms", round(1e3 * sorted(ts)[25], 3))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        model.forward(x)
    cp.cuda.Device().synchronize()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    print("calls", st.total_calls)
    st.sort_stats("tottime").print_stats(14)
    print(s.getvalue()[-3800:])
