"""Batch norm on a GPU against a float64 NumPy reference on fresh random data: training forward (output, saved
and running statistics), backward (dx, dgamma, dbeta, dz), inference, both layouts, all dtypes, with and without
the residual z and ReLU; the fused cuDNN path where documented, equal to the unfused path; poisoned outputs."""

import numpy as np
import pytest
from device_values import TOLERANCE, check_close, host_values, poisoned, to_device

from resnet_native import reference
from resnet_native.ops import norm

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

DTYPES = ["fp32", "fp16", "bf16"]
LAYOUTS = ["NCHW", "NHWC"]
EPS = 1e-5


def per_channel(v):
    return v[None, :, None, None]


def f32(a):
    return cp.asarray(np.asarray(a, dtype=np.float32))


def nan_f32(c):
    return poisoned((c,), "fp32")


class Problem:
    """Random data for one batch-norm call, on the host (float64, NCHW) and on the device."""

    def __init__(self, rng, nchw, layout, dtype, residual):
        n, c, h, w = nchw
        self.layout, self.dtype, self.c = layout, dtype, c
        x = rng.standard_normal(nchw) * 2.0 + per_channel(rng.standard_normal(c) * 0.5)
        self.x, self.hx = to_device(x, dtype, layout)
        self.z, self.hz = to_device(rng.standard_normal(nchw), dtype, layout) if residual else (None, None)
        self.dy, self.hdy = to_device(rng.standard_normal(nchw), dtype, layout)
        self.hgamma = rng.uniform(0.5, 1.5, c)
        self.hbeta = rng.standard_normal(c) * 0.3
        self.hrm = rng.standard_normal(c) * 0.1
        self.hrv = rng.uniform(0.5, 2.0, c)
        # fp32 parameters: the reference uses their exact fp32 values.
        for name in ("gamma", "beta", "rm", "rv"):
            exact = getattr(self, "h" + name).astype(np.float32)
            setattr(self, "h" + name, exact.astype(np.float64))
            setattr(self, name, f32(exact))
        self.shape = tuple(self.x.shape)

    def check(self, got, expected, what, tol=None):
        """check_close of a device activation (in the problem's layout) or statistic against its reference."""
        check_close(got, expected, self.dtype if tol is None else tol, what, self.layout)


def train(p, relu, momentum=0.1, reserve=None):
    out = poisoned(p.shape, p.dtype)
    y, save_mean, save_invstd, reserve = norm.batch_norm_train(
        p.x, p.gamma, p.beta, p.rm, p.rv, layout=p.layout, momentum=momentum, eps=EPS, z=p.z, relu=relu, out=out,
        save_mean=nan_f32(p.c), save_invstd=nan_f32(p.c), reserve=reserve, dtype=p.dtype)
    assert y is out
    return y, save_mean, save_invstd, reserve


def backward(p, y, save_mean, save_invstd, reserve, relu, **kwargs):
    kwargs.setdefault("dgamma", nan_f32(p.c))
    kwargs.setdefault("dbeta", nan_f32(p.c))
    return norm.batch_norm_backward(
        p.x, p.dy, p.gamma, p.beta, save_mean, save_invstd, layout=p.layout, eps=EPS, y=y if relu else None,
        relu=relu, has_z=p.z is not None, reserve=reserve, dx=poisoned(p.shape, p.dtype),
        dz=poisoned(p.shape, p.dtype) if p.z is not None else None, dtype=p.dtype, **kwargs)


def forward_reference(p, relu, momentum=0.1):
    """The float64 reference of train() (NCHW): (y, save_mean, save_invstd, running_mean, running_var)."""
    running_mean, running_var = p.hrm.copy(), p.hrv.copy()
    y, mean, invstd, _ = reference.norm.batch_norm_train(p.hx, p.hgamma, p.hbeta, running_mean, running_var,
                                                         layout="NCHW", momentum=momentum, eps=EPS, z=p.hz, relu=relu)
    return y, mean, invstd, running_mean, running_var


def backward_reference(p, y, mean, invstd, relu, **kwargs):
    """The float64 reference of backward() (NCHW): (dx, dgamma, dbeta, dz). The ReLU mask is that of `y`, the
    device's own output (as float64 NCHW values), as the op takes it."""
    return reference.norm.batch_norm_backward(p.hx, p.hdy, p.hgamma, p.hbeta, mean, invstd, layout="NCHW", eps=EPS,
                                              y=y if relu else None, relu=relu, has_z=p.z is not None, **kwargs)


def check_training_step(p, relu, momentum=0.1, reserve=None):
    """Forward + backward of one problem against the reference; returns the device results and paths."""
    y, save_mean, save_invstd, reserve = train(p, relu, momentum, reserve)
    forward_path = norm.last_path()
    y_ref, mean, invstd, running_mean, running_var = forward_reference(p, relu, momentum)
    p.check(y, y_ref, f"y ({forward_path})")
    p.check(save_mean, mean, "save_mean")
    p.check(save_invstd, invstd, "save_invstd")
    p.check(p.rm, running_mean, "running_mean")
    p.check(p.rv, running_var, "running_var (unbiased)")

    dx, dgamma, dbeta, dz = backward(p, y, save_mean, save_invstd, reserve, relu)
    backward_path = norm.last_path()
    dx_ref, dgamma_ref, dbeta_ref, dz_ref = backward_reference(p, host_values(y, p.layout), mean, invstd, relu)
    if p.hx.size // p.c == 2:
        # Two values per channel: x_hat = +-1 up to eps, so dx is what is left after terms of the size of
        # gamma * invstd * dy cancel. Its error is bounded by theirs, not by its own (tiny) size.
        got = host_values(dx, p.layout)
        assert np.isfinite(got).all(), "dx: not written everywhere"
        terms = np.linalg.norm(per_channel(p.hgamma * invstd) * p.hdy)
        err = np.linalg.norm(got - dx_ref) / terms
        assert err <= TOLERANCE[p.dtype], f"dx ({backward_path}): error {err:.3g} of the cancelling terms' size"
    else:
        p.check(dx, dx_ref, f"dx ({backward_path})")
    p.check(dgamma, dgamma_ref, "dgamma")
    p.check(dbeta, dbeta_ref, "dbeta")
    if p.z is not None:
        p.check(dz, dz_ref, "dz")
    else:
        assert dz is None
    return dict(y=y, dx=dx, dgamma=dgamma, dbeta=dbeta, dz=dz, reserve=reserve, forward_path=forward_path,
                backward_path=backward_path)


def expected_fused(layout, dtype, relu, residual, c):
    """Where one *Ex call does the whole op: bn(x) in every dtype, relu(bn(x) [+ z]) in half precision with C % 4
    == 0 (cuDNN has no add-only op)."""
    if layout != "NHWC":
        return False
    return (not relu and not residual) or (relu and dtype in ("fp16", "bf16") and c % 4 == 0)


# ---- training ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nchw", [(4, 8, 5, 7), (1, 12, 3, 3), (3, 6, 4, 4)])
@pytest.mark.parametrize("relu, residual", [(False, False), (True, False), (True, True), (False, True)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_forward_and_backward_match_reference(layout, dtype, relu, residual, nchw, rng):
    p = Problem(rng, nchw, layout, dtype, residual)
    result = check_training_step(p, relu)
    documented = expected_fused(layout, dtype, relu, residual, nchw[1])
    for key in ("forward_path", "backward_path"):
        path = result[key]
        if documented:  # fused, unless cuDNN refused this shape (then the numbers above prove the fallback)
            assert path["fused"] or "refused" in path["detail"], f"{key}: {path}"
        else:
            assert not path["fused"], f"{key}: fused where cuDNN documents no fused kernel: {path}"
        if path["fused"]:
            assert path["mode"] == "persistent" and path["ex"], path
        # NHWC takes cuDNN's persistent NHWC kernels (a *Ex call) in every dtype, never the generic ones.
        assert path["ex"] == (layout == "NHWC") or "refused" in path["detail"], f"{key}: {path}"
        # NCHW runs spatial; NHWC persistent unless cuDNN refused it (then spatial).
        assert path["mode"] == "spatial" or layout == "NHWC", path
    assert result["forward_path"]["op"] == "train" and result["backward_path"]["op"] == "backward"


@pytest.mark.parametrize("relu, residual", [(False, False), (True, False), (True, True), (False, True)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nhwc_reserve_is_never_empty(dtype, relu, residual):
    """Every NHWC problem takes a *Ex call, whose forward records what it ran under its reserve buffer."""
    for c in (16, 6):
        assert norm.batch_norm_reserve_size((4, 8, 8, c), layout="NHWC", relu=relu, has_z=residual, dtype=dtype) >= 4


def test_momentum_and_a_second_step_update_running_stats(rng):
    p = Problem(rng, (8, 16, 6, 6), "NHWC", "fp16", residual=True)
    first = check_training_step(p, relu=True, momentum=0.3)
    # Fresh data, same buffers and the reserve from the first call: a second step of the same layer.
    q = Problem(rng, (8, 16, 6, 6), "NHWC", "fp16", residual=True)
    q.rm, q.rv, q.hrm, q.hrv = p.rm, p.rv, host_values(p.rm), host_values(p.rv)
    check_training_step(q, relu=True, momentum=0.3, reserve=first["reserve"])


def test_fused_path_equals_unfused_path(rng):
    nchw = (8, 32, 7, 7)
    results = []
    for mode in ("auto", "spatial"):  # auto: fused NHWC fp16; spatial: plain BN + kernels
        p = Problem(np.random.default_rng(1234), nchw, "NHWC", "fp16", residual=True)
        norm.set_mode(mode)
        try:
            results.append(check_training_step(p, relu=True))
        finally:
            norm.set_mode("auto")
    fused, unfused = results
    assert fused["forward_path"]["fused"] and fused["backward_path"]["fused"], (fused["forward_path"],
                                                                              fused["backward_path"])
    assert fused["reserve"] is not None
    assert not unfused["forward_path"]["fused"] and not unfused["backward_path"]["fused"]
    assert unfused["forward_path"]["mode"] == "spatial"
    for key in ("y", "dx", "dz", "dgamma", "dbeta"):
        check_close(fused[key], host_values(unfused[key]), "fp16", key)


@pytest.mark.parametrize("relu, residual", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("layout, dtype, nchw", [
    ("NHWC", "fp16", (4, 8, 5, 5)), ("NCHW", "fp32", (4, 8, 5, 5)), ("NHWC", "bf16", (4, 8, 5, 5)),
    ("NHWC", "fp16", (512, 64, 32, 32)), ("NHWC", "bf16", (512, 128, 16, 16))])  # a CIFAR ResNet's at batch 512
def test_backward_accumulates_parameter_gradients(layout, dtype, nchw, relu, residual, rng):
    """accumulate=True adds dgamma and dbeta into the arrays given (cuDNN's own blend, betaParamDiff = 1) on each
    path a training step takes: the fused *Ex kernels (BN, BN + ReLU, BN + add + ReLU) at a ResNet's batch shapes
    as well as small ones, and the plain call (NCHW fp32)."""
    p = Problem(rng, nchw, layout, dtype, residual=residual)
    y, save_mean, save_invstd, reserve = train(p, relu=relu)
    _, mean, invstd, _, _ = forward_reference(p, relu=relu)
    before_g, before_b = (rng.standard_normal(p.c).astype(np.float32) * 100 for _ in range(2))
    dgamma, dbeta = f32(before_g), f32(before_b)
    backward(p, y, save_mean, save_invstd, reserve, relu=relu, dgamma=dgamma, dbeta=dbeta, accumulate=True)
    path = norm.last_path()
    assert "accumulating" in path["detail"], path
    _, dgamma_ref, dbeta_ref, _ = backward_reference(p, host_values(y, layout), mean, invstd, relu=relu,
                                                     dgamma=before_g.astype(np.float64),
                                                     dbeta=before_b.astype(np.float64), accumulate=True)
    # Against the gradient's own size: the prior values (about 100) would hide an error in it.
    _, dgamma_own, dbeta_own, _ = backward_reference(p, host_values(y, layout), mean, invstd, relu=relu)
    for got, ref, own, name in ((dgamma, dgamma_ref, dgamma_own, "dgamma"), (dbeta, dbeta_ref, dbeta_own, "dbeta")):
        err = np.linalg.norm(host_values(got) - ref) / np.linalg.norm(own)
        assert err <= TOLERANCE[dtype], f"{name} accumulated ({path}): error {err:.3g} of the gradient's size"


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_zero_workspace_limit_takes_the_plain_calls_and_still_trains(dtype, rng):
    """The limit bounds the workspace a faster call may take, not the scratch the op needs: with a cap of 0 the
    *Ex calls (which need cuDNN workspace) give way to the plain ones, which still mask dy (ReLU) in pool
    scratch and accumulate the parameter gradients."""
    import resnet_native as rn

    p = Problem(rng, (4, 8, 5, 5), "NHWC", dtype, residual=False)
    rn.set_workspace_limit(0)
    try:
        y, save_mean, save_invstd, reserve = train(p, relu=True)
        forward_path = norm.last_path()
        before_g, before_b = (rng.standard_normal(p.c).astype(np.float32) for _ in range(2))
        dgamma, dbeta = f32(before_g), f32(before_b)
        dx, *_ = backward(p, y, save_mean, save_invstd, reserve, relu=True, dgamma=dgamma, dbeta=dbeta,
                          accumulate=True)
        backward_path = norm.last_path()
    finally:
        rn.set_workspace_limit(None)
    assert not forward_path["ex"] and not backward_path["ex"], (forward_path, backward_path)
    y_ref, mean, invstd, _, _ = forward_reference(p, relu=True)
    p.check(y, y_ref, "y")
    dx_ref, dgamma_ref, dbeta_ref, _ = backward_reference(p, host_values(y, p.layout), mean, invstd, relu=True,
                                                          dgamma=before_g.astype(np.float64),
                                                          dbeta=before_b.astype(np.float64), accumulate=True)
    p.check(dx, dx_ref, "dx")
    p.check(dgamma, dgamma_ref, "dgamma accumulated")
    p.check(dbeta, dbeta_ref, "dbeta accumulated")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_forced_persistent_mode_on_nchw(dtype, rng):
    p = Problem(rng, (4, 8, 6, 6), "NCHW", dtype, residual=True)
    norm.set_mode("persistent")
    try:
        result = check_training_step(p, relu=True)
    finally:
        norm.set_mode("auto")
    # Persistent ran, or cuDNN refused it and the op retried in spatial mode (last_path reports no more than the
    # mode that ran): what is checked is that either gives the reference's numbers, and no fusion.
    assert not result["forward_path"]["fused"]  # fusion is NHWC only


def test_bf16_fusion_disabled_keeps_the_ex_call_with_bn_ops(rng):
    p = Problem(rng, (4, 16, 5, 5), "NHWC", "bf16", residual=True)
    norm.set_fuse_bf16(False)
    try:
        result = check_training_step(p, relu=True)  # asserts the numbers
    finally:
        norm.set_fuse_bf16(True)
    for key in ("forward_path", "backward_path"):
        path = result[key]
        assert path["ex"] and not path["fused"] and "bf16 fusion disabled" in path["detail"], (key, path)


@pytest.mark.parametrize("residual", [False, True])
def test_backward_after_a_fused_forward_can_take_bn_ops(residual, rng):
    """The backward follows the forward's record: after a fused forward, a backward whose fused ops may not run
    (bf16 fusion switched off in between, as a refusal of the backward's fused call would) masks dy with the
    kernels and runs the *Ex call with BN ops."""
    p = Problem(rng, (4, 16, 5, 5), "NHWC", "bf16", residual=residual)
    y, save_mean, save_invstd, reserve = train(p, relu=True)
    assert norm.last_path()["fused"], norm.last_path()
    norm.set_fuse_bf16(False)
    try:
        dx, dgamma, dbeta, dz = backward(p, y, save_mean, save_invstd, reserve, relu=True)
    finally:
        norm.set_fuse_bf16(True)
    path = norm.last_path()
    assert path["ex"] and not path["fused"] and "relu_backward kernel" in path["detail"], path
    _, mean, invstd, _, _ = forward_reference(p, relu=True)
    dx_ref, dgamma_ref, dbeta_ref, dz_ref = backward_reference(p, host_values(y, p.layout), mean, invstd, relu=True)
    p.check(dx, dx_ref, "dx")
    p.check(dgamma, dgamma_ref, "dgamma")
    p.check(dbeta, dbeta_ref, "dbeta")
    if residual:
        p.check(dz, dz_ref, "dz")


def test_training_runs_on_the_current_cupy_stream(rng):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        p = Problem(rng, (16, 64, 14, 14), "NHWC", "fp16", residual=True)
        p.x = p.x * 1  # produced on the stream just before the op
        check_training_step(p, relu=True)
        stream.synchronize()


# ---- inference -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("relu, residual", [(False, False), (True, False), (True, True), (False, True)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_inference_matches_reference(layout, dtype, relu, residual, rng):
    p = Problem(rng, (3, 8, 5, 7), layout, dtype, residual)
    rm_before, rv_before = cp.asnumpy(p.rm).copy(), cp.asnumpy(p.rv).copy()
    out = poisoned(p.shape, dtype)
    y = norm.batch_norm_infer(p.x, p.gamma, p.beta, p.rm, p.rv, layout=layout, eps=EPS, z=p.z, relu=relu, out=out,
                              dtype=dtype)
    assert y is out
    want = reference.norm.batch_norm_infer(p.hx, p.hgamma, p.hbeta, p.hrm, p.hrv, layout="NCHW", eps=EPS, z=p.hz,
                                           relu=relu)
    p.check(y, want, f"inference y ({norm.last_path()})")
    assert np.array_equal(cp.asnumpy(p.rm), rm_before) and np.array_equal(cp.asnumpy(p.rv), rv_before)
    assert norm.last_path()["op"] == "infer"


def test_outputs_are_allocated_when_not_given(rng):
    p = Problem(rng, (2, 4, 3, 3), "NCHW", "fp32", residual=False)
    y, save_mean, save_invstd, reserve = norm.batch_norm_train(p.x, p.gamma, p.beta, p.rm, p.rv, layout="NCHW")
    assert y.shape == p.shape and save_mean.shape == (4,) and save_invstd.shape == (4,) and reserve is None
    dx, dgamma, dbeta, dz = norm.batch_norm_backward(p.x, p.dy, p.gamma, p.beta, save_mean, save_invstd,
                                                     layout="NCHW")
    assert dx.shape == p.shape and dgamma.shape == (4,) and dbeta.shape == (4,) and dz is None
    y_ref, mean, invstd, _, _ = forward_reference(p, relu=False)
    p.check(y, y_ref, "y")
    p.check(dx, backward_reference(p, None, mean, invstd, relu=False)[0], "dx")


def test_errors_with_real_device_arrays(rng):
    p = Problem(rng, (2, 4, 3, 3), "NCHW", "fp32", residual=False)
    with pytest.raises(ValueError, match=r"gamma: expected shape \(4,\), got \(5,\)"):
        norm.batch_norm_train(p.x, f32(np.ones(5)), p.beta, p.rm, p.rv, layout="NCHW")
    with pytest.raises(TypeError, match="x: expected a float16 array, got float32"):
        norm.batch_norm_train(p.x, p.gamma, p.beta, p.rm, p.rv, layout="NCHW", dtype="fp16")
    with pytest.raises(TypeError, match="beta: .*host memory"):
        norm.batch_norm_infer(p.x, p.gamma, np.zeros(4, np.float32), p.rm, p.rv, layout="NCHW")
    with pytest.raises(ValueError, match="y: the forward output is required with relu=True"):
        norm.batch_norm_backward(p.x, p.dy, p.gamma, p.beta, p.rm, p.rv, layout="NCHW", relu=True)
