"""Argument validation of the batch-norm ops and their settings, on any machine (fake device arrays)."""

import numpy as np
import pytest
from fake_arrays import expect_device_stage, fake, transposed

from resnet_native.ops import norm


def train_args(shape=(2, 8, 5, 5), layout="NCHW", dtype="float16", c=None):
    c = c or (shape[1] if layout == "NCHW" else shape[3])
    x = fake(shape, dtype)
    params = [fake((c,)) for _ in range(4)]
    return x, params, dict(out=fake(shape, dtype), save_mean=fake((c,)), save_invstd=fake((c,)),
                           reserve=fake((64,)))


def test_train_validates_layout_rank_and_parameter_shapes():
    x, params, outs = train_args()
    with pytest.raises(ValueError, match="layout: expected 'NCHW' or 'NHWC'"):
        norm.batch_norm_train(x, *params, layout="CHWN", **outs)
    x3 = fake((2, 8, 5), "float16")
    with pytest.raises(ValueError, match="x: expected a 4-D activation"):
        norm.batch_norm_train(x3, *params, layout="NCHW", **outs)
    bad = [fake((7,)), *params[1:]]
    with pytest.raises(ValueError, match=r"gamma: expected shape \(8,\), got \(7,\)"):
        norm.batch_norm_train(x, *bad, layout="NCHW", **outs)
    # NHWC reads C from the last axis: the same arrays are now wrong.
    with pytest.raises(ValueError, match=r"gamma: expected shape \(5,\)"):
        norm.batch_norm_train(x, *params, layout="NHWC", **outs)
    half_gamma = [fake((8,), "float16"), *params[1:]]
    with pytest.raises(TypeError, match="gamma: expected a float32 array, got float16"):
        norm.batch_norm_train(x, *half_gamma, layout="NCHW", **outs)
    with pytest.raises(TypeError, match="running_var: .*host memory"):
        norm.batch_norm_train(x, *params[:3], np.ones(8, np.float32), layout="NCHW", **outs)


def test_train_validates_outputs_residual_and_hyperparameters():
    x, params, outs = train_args()
    with pytest.raises(ValueError, match="z and x must have the same shape"):
        norm.batch_norm_train(x, *params, layout="NCHW", z=fake((2, 8, 5, 4), "float16"), **outs)
    with pytest.raises(TypeError, match="z: expected a float16 array"):
        norm.batch_norm_train(x, *params, layout="NCHW", z=fake((2, 8, 5, 5), "float32"), **outs)
    with pytest.raises(ValueError, match="out must not share memory with x"):
        norm.batch_norm_train(x, *params, layout="NCHW", **{**outs, "out": x})
    with pytest.raises(ValueError, match="save_mean: expected a 1-D array"):
        norm.batch_norm_train(x, *params, layout="NCHW", **{**outs, "save_mean": fake((2, 4))})
    with pytest.raises(ValueError, match="momentum: expected a value in"):
        norm.batch_norm_train(x, *params, layout="NCHW", momentum=1.5, **outs)
    with pytest.raises(ValueError, match="eps: expected a finite value"):
        norm.batch_norm_train(x, *params, layout="NCHW", eps=-1.0, **outs)
    with pytest.raises(ValueError, match="x: expected a C-contiguous"):
        norm.batch_norm_train(transposed((2, 8, 5, 5), "float16"), *params, layout="NCHW", **outs)
    with expect_device_stage():
        norm.batch_norm_train(x, *params, layout="NCHW", z=fake((2, 8, 5, 5), "float16"), relu=True, **outs)
    bf16 = fake((2, 8, 5, 5), "uint16")
    with pytest.raises(TypeError, match="x: .*dtype='bf16'"):
        norm.batch_norm_train(bf16, *params, layout="NCHW", **outs)


def test_infer_validates_like_train():
    x, params, outs = train_args(shape=(2, 5, 5, 8), layout="NHWC", dtype="float32")
    with pytest.raises(ValueError, match="out and x must have the same shape"):
        norm.batch_norm_infer(x, *params, layout="NHWC", out=fake((2, 8, 5, 5)))
    with pytest.raises(ValueError, match=r"running_mean: expected shape \(8,\)"):
        norm.batch_norm_infer(x, params[0], params[1], fake((5,)), params[3], layout="NHWC", out=outs["out"])
    with expect_device_stage():
        norm.batch_norm_infer(x, *params, layout="NHWC", out=outs["out"], relu=True)


def backward_args(shape=(2, 8, 5, 5), dtype="float16"):
    c = shape[1]
    return dict(x=fake(shape, dtype), dy=fake(shape, dtype), gamma=fake((c,)), beta=fake((c,)),
                save_mean=fake((c,)), save_invstd=fake((c,))), dict(
        dx=fake(shape, dtype), dgamma=fake((c,)), dbeta=fake((c,)))


def test_backward_validates_its_arguments():
    ins, outs = backward_args()
    with pytest.raises(ValueError, match="y: the forward output is required with relu=True"):
        norm.batch_norm_backward(**ins, layout="NCHW", relu=True, **outs)
    with pytest.raises(ValueError, match="dz: given but has_z is False"):
        norm.batch_norm_backward(**ins, layout="NCHW", dz=fake((2, 8, 5, 5), "float16"), **outs)
    with pytest.raises(ValueError, match="accumulate: needs dgamma and dbeta"):
        norm.batch_norm_backward(**ins, layout="NCHW", accumulate=True, dx=outs["dx"])
    with pytest.raises(ValueError, match="dy and x must have the same shape"):
        norm.batch_norm_backward(**{**ins, "dy": fake((2, 8, 5, 6), "float16")}, layout="NCHW", **outs)
    with pytest.raises(ValueError, match="dx must not share memory with dy"):
        norm.batch_norm_backward(**ins, layout="NCHW", **{**outs, "dx": ins["dy"]})
    with pytest.raises(ValueError, match=r"dgamma: expected shape \(8,\)"):
        norm.batch_norm_backward(**ins, layout="NCHW", **{**outs, "dgamma": fake((9,))})
    with pytest.raises(ValueError, match="dz and x must have the same shape"):
        norm.batch_norm_backward(**ins, layout="NCHW", has_z=True, dz=fake((2, 8, 5, 4), "float16"), **outs)
    with expect_device_stage():
        norm.batch_norm_backward(**ins, layout="NCHW", y=fake((2, 8, 5, 5), "float16"), relu=True, has_z=True,
                                 dz=fake((2, 8, 5, 5), "float16"), reserve=fake((16,)), **outs)


def test_reserve_size_is_zero_where_the_plain_call_runs():
    # These paths never take a *Ex call, so the answer needs no cuDNN handle (and no GPU).
    assert norm.batch_norm_reserve_size((4, 16, 8, 8), layout="NCHW", relu=True, has_z=True, dtype="fp16") == 0
    # (NHWC takes a *Ex call in every dtype and variant: its reserve size is cuDNN's answer, tests/test_norm_gpu.py.)
    with pytest.raises(ValueError, match="dtype: expected one of"):
        norm.batch_norm_reserve_size((4, 8, 8, 16), layout="NHWC", dtype="int8")
    with pytest.raises(ValueError, match="x_shape: expected a 4-D"):
        norm.batch_norm_reserve_size((4, 8, 16), layout="NHWC", dtype="fp16")


def test_mode_and_fusion_settings_round_trip():
    assert norm.mode() == "auto"
    try:
        norm.set_mode("spatial")
        assert norm.mode() == "spatial"
        # Spatial mode never fuses, so even NHWC fp16 needs no reserve.
        assert norm.batch_norm_reserve_size((4, 8, 8, 16), layout="NHWC", relu=True, dtype="fp16") == 0
        norm.set_mode("persistent")
        assert norm.mode() == "persistent"
        with pytest.raises(ValueError, match="mode: expected 'auto', 'persistent' or 'spatial'"):
            norm.set_mode("fast")
    finally:
        norm.set_mode("auto")
    assert norm.fuse_bf16()
    try:
        norm.set_fuse_bf16(False)
        assert not norm.fuse_bf16()
    finally:
        norm.set_fuse_bf16(True)
    assert set(norm.last_path()) == {"op", "fused", "ex", "mode", "detail"}
