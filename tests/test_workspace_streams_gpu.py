"""Several streams sharing the one workspace buffer of a device: its users are ordered (core/workspace.h's
WorkspaceOrder, cuda_graph.launch_ordered), so convolutions and batch norms on two streams at once, and two
InferenceEngines replaying on two streams at once, give the results one stream gives."""

import numpy as np
import pytest

import resnet_native as rn
from resnet_native.ops import conv, norm
from resnet_native.ops.conv import ConvSpec

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

# Large enough that the chosen algorithms take workspace and run long enough to overlap; deterministic, so that
# every run of a problem gives the same bits.
X_SHAPE, W_SHAPE = (64, 64, 56, 56), (64, 64, 3, 3)
SPEC = ConvSpec(padding=1, layout="NCHW", precision="fp16", algo="find", deterministic=True)


def _waits() -> int:
    return rn.workspace_stats()["stream_waits"]


def _problem(rng):
    x = cp.asarray(rng.standard_normal(X_SHAPE).astype(np.float16))
    w = cp.asarray((rng.standard_normal(W_SHAPE) * 0.05).astype(np.float16))
    dy = cp.asarray(rng.standard_normal(conv.conv_output_shape(X_SHAPE, W_SHAPE, SPEC)).astype(np.float16))
    return x, w, dy


def _three(x, w, dy, outs):
    conv.conv2d(x, w, SPEC, out=outs[0])
    conv.conv2d_backward_data(dy, w, SPEC, X_SHAPE, out=outs[1])
    conv.conv2d_backward_filter(x, dy, SPEC, W_SHAPE, out=outs[2])


def _outputs():
    """Poisoned y, dx, dw (fp16 storage)."""
    return [cp.full(shape, np.nan, np.float16)
            for shape in (conv.conv_output_shape(X_SHAPE, W_SHAPE, SPEC), X_SHAPE, W_SHAPE)]


def test_convolutions_on_two_streams_at_once_match_one_stream(rng):
    problems = [_problem(rng) for _ in range(2)]
    want = []
    for p in problems:  # one stream, one after the other (and the algorithm searches done)
        outs = _outputs()
        _three(*p, outs)
        want.append([o.get() for o in outs])
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    got = [_outputs() for _ in problems]
    cp.cuda.Device().synchronize()  # the inputs and poisoned outputs, made on the default stream, are ready
    before = _waits()
    for _ in range(5):  # interleaved: each launch may overlap the other stream's previous ones
        for s, p, outs in zip(streams, problems, got, strict=True):
            with s:
                _three(*p, outs)
    cp.cuda.Device().synchronize()
    assert _waits() - before >= 2 * 5 - 1  # every switch of stream waited for the other stream's last user
    for ws, gs in zip(want, got, strict=True):
        for a, b in zip(ws, gs, strict=True):
            np.testing.assert_array_equal(b.get(), a)


def test_one_stream_never_waits(rng):
    x, w, dy = _problem(rng)
    outs = _outputs()
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        _three(x, w, dy, outs)  # the first use on this stream may wait once for the last user elsewhere
        before = _waits()
        for _ in range(3):
            _three(x, w, dy, outs)
    assert _waits() == before


def test_a_new_stream_at_a_reused_address_still_waits(rng):
    """Streams are told apart by id, not handle value: a stream created where a destroyed one was must still wait
    for the work its predecessor left running."""
    x, w, dy = _problem(rng)
    outs = _outputs()
    cp.cuda.Device().synchronize()
    for _ in range(3):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            before = _waits()
            _three(x, w, dy, outs)
            assert _waits() == before + 1
        del s


def test_batch_norm_training_on_two_streams_at_once_matches_one_stream(rng):
    shape = (64, 28, 28, 64)  # NHWC fp16: the *Ex calls, which take workspace
    xs = [cp.asarray(rng.standard_normal(shape).astype(np.float16)) for _ in range(2)]
    dys = [cp.asarray(rng.standard_normal(shape).astype(np.float16)) for _ in range(2)]
    c = shape[-1]

    def step(x, dy):
        gamma, beta = cp.ones(c, np.float32), cp.zeros(c, np.float32)
        rm, rv = cp.zeros(c, np.float32), cp.ones(c, np.float32)
        y, mean, invstd, reserve = norm.batch_norm_train(x, gamma, beta, rm, rv, layout="NHWC", relu=True,
                                                         dtype="fp16")
        dx, dgamma, dbeta, _ = norm.batch_norm_backward(x, dy, gamma, beta, mean, invstd, layout="NHWC", y=y,
                                                        relu=True, reserve=reserve, dtype="fp16")
        return y, dx, dgamma, dbeta

    want = [[a.get() for a in step(x, dy)] for x, dy in zip(xs, dys, strict=True)]
    cp.cuda.Device().synchronize()
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    results = [[], []]
    for _ in range(4):
        for i, s in enumerate(streams):
            with s:
                results[i].append(step(xs[i], dys[i]))
    cp.cuda.Device().synchronize()
    for i in range(2):  # a tolerance: cuDNN's batch-norm reductions need not be bit-reproducible; a race is far off
        for got in results[i]:
            for a, b in zip(want[i], got, strict=True):
                np.testing.assert_allclose(b.get().astype(np.float64), a.astype(np.float64), rtol=1e-3, atol=1e-3)


def test_two_engines_replaying_on_two_streams_at_once_match_one_stream():
    models = [rn.ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=s).cuda().eval() for s in (1, 2)]
    engines = [rn.InferenceEngine(m, batch_sizes=(256,), precision="fp16") for m in models]
    x = cp.random.default_rng(0).integers(0, 256, (256, 32, 32, 3), dtype=np.uint8)
    want = [e(x).get() for e in engines]
    cp.cuda.Device().synchronize()
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    outs = [[], []]
    before = _waits()
    for _ in range(10):
        for i, (e, s) in enumerate(zip(engines, streams, strict=True)):
            with s:
                outs[i].append(e(x))
    cp.cuda.Device().synchronize()
    assert _waits() - before >= 2 * 10 - 1  # every replay after the other engine's waited for it
    for i in range(2):
        for got in outs[i]:
            np.testing.assert_array_equal(got.get(), want[i])
