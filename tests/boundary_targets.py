"""The array arguments the boundary fuzz (test_boundary_fuzz_cpu.py) feeds: every array argument of every op, with
what it accepts (dtypes, shapes, writability) and a call that passes it alongside valid others."""

import dataclasses
from dataclasses import dataclass

from fake_arrays import fake

from resnet_native import _C
from resnet_native.ops import conv, kernels, norm, pool
from resnet_native.ops import multi_tensor as mt

# ---- the arguments under test ------------------------------------------------------------------------------------
S = (2, 3, 4, 5)  # elementwise operands
X, W, Y = (2, 3, 8, 8), (4, 3, 3, 3), (2, 4, 8, 8)  # conv (padding 1)
C3 = (3,)
SPEC = conv.ConvSpec(padding=1)
F4 = frozenset({"f4"})
FLOATS_AND_BF16_BITS = frozenset({"f4", "f2", "bf16", "u2", "i2", "V2"})
I4 = frozenset({"i4"})
F8 = frozenset({"f8"})
U1 = frozenset({"u1"})


@dataclass(frozen=True)
class Target:
    """One array argument: how to call its op with everything else valid, and what it accepts."""

    label: str
    name: str  # the argument name every error must start with
    call: object = None  # call(bad)
    shape: tuple = S  # a shape the argument accepts
    dtype: str = "float32"  # a dtype it accepts (the base every malformed description starts from)
    accepted: frozenset = F4  # element kinds it accepts through __cuda_array_interface__ ('f4', 'u2', ...)
    accepted_dlpack: frozenset | None = None  # through DLPack (None: the same)
    optional: bool = False  # None is a valid value
    writable: bool = False  # an output: read-only descriptions are malformed for it
    number_ok: bool = False  # a device scalar: a Python number is a valid value
    table: bool = False  # takes a TensorList: nothing generated here is one
    host_dispatch: bool = False  # a NumPy array here selects the op's host reference (not generated)
    name_pattern: str | None = None  # a regex instead of the name (lists)

    def dlpack_kinds(self):
        return self.accepted if self.accepted_dlpack is None else self.accepted_dlpack


def valid(target):
    return fake(target.shape, target.dtype)


def family(label, fn, specs):
    """One target per (name, shape, options) of an op called as fn(*arrays), the others valid."""
    targets = [Target(f"{label}:{name}", name, shape=shape, **opts) for name, shape, opts in specs]
    out = []
    for i, target in enumerate(targets):
        def call(bad, i=i):
            args = [valid(t) for t in targets]
            args[i] = bad
            return fn(*args)
        out.append(dataclasses.replace(target, call=call))
    return out


OUT = dict(optional=True, writable=True)


def _targets():
    t = [Target("_parse_tensor:x", "x", lambda b: _C._testing.parse_tensor(b, "x", "fp32", check_device=False))]
    # kernels (dtype fp32 named: every operand must be float32)
    for op in ("add", "add_relu"):
        fn = getattr(kernels, op)
        t += family(f"kernels.{op}", lambda a, b, out, fn=fn: fn(a, b, out=out, dtype="fp32"),
                    [("a", S, {}), ("b", S, {}), ("out", S, OUT)])
    t += family("kernels.relu", lambda x, out: kernels.relu(x, out=out, dtype="fp32"),
                [("x", S, dict(host_dispatch=True)), ("out", S, OUT)])
    for op in ("relu_backward", "add_relu_backward"):
        fn = getattr(kernels, op)
        t += family(f"kernels.{op}", lambda dy, y, out, fn=fn: fn(dy, y, out=out, dtype="fp32"),
                    [("dy", S, {}), ("y", S, {}), ("out", S, OUT)])
    t += family("kernels.add_tensor_cudnn",
                lambda a, b, out: kernels.add_tensor_cudnn(a, b, out=out, layout="NCHW", dtype="fp32"),
                [("a", S, {}), ("b", S, {}), ("out", S, OUT)])
    t += family("kernels.add_scaled", lambda a, b, out: kernels.add_scaled(a, b, 0.5, out=out, dtype="fp32"),
                [("a", S, {}), ("b", S, {}), ("out", S, OUT)])
    t += family("kernels.scale", lambda x, out: kernels.scale(x, 0.5, out=out, dtype="fp32"),
                [("x", S, dict(host_dispatch=True)), ("out", S, OUT)])
    t += family("kernels.cast", kernels.cast,  # uint16 is bf16 here: any float or 16-bit kind is taken
                [("x", S, dict(accepted=FLOATS_AND_BF16_BITS)),
                 ("out", S, dict(accepted=FLOATS_AND_BF16_BITS, dtype="float16", writable=True))])

    # convolutions (NCHW fp32, padding 1)
    t += family("conv.conv2d", lambda x, w, bias, z, out: conv.conv2d(x, w, SPEC, bias=bias, z=z, out=out),
                [("x", X, {}), ("w", W, {}), ("bias", (4,), dict(optional=True)), ("z", Y, dict(optional=True)),
                 ("out", Y, OUT)])
    t += family("conv.conv2d_backward_data", lambda dy, w, out: conv.conv2d_backward_data(dy, w, SPEC, X, out=out),
                [("dy", Y, {}), ("w", W, {}), ("out", X, OUT)])
    t += family("conv.conv2d_backward_filter",
                lambda x, dy, out: conv.conv2d_backward_filter(x, dy, SPEC, W, out=out),
                [("x", X, {}), ("dy", Y, {}), ("out", W, OUT)])
    # dy's dtype is read from its typestr (float32, float16, or 16-bit bf16 bits); a DLPack dy without a
    # .dtype is taken as float32
    t += family("conv.conv2d_backward_bias", lambda dy, out: conv.conv2d_backward_bias(dy, "NCHW", out=out),
                [("dy", Y, dict(accepted=frozenset({"f4", "f2", "u2", "i2", "V2"}), accepted_dlpack=F4,
                                host_dispatch=True)),
                 ("out", (4,), OUT)])

    # batch norm (NCHW fp32: x (2, 3, 4, 5), per-channel (3,))
    stat = dict(writable=True)
    t += family("norm.batch_norm_train",
                lambda x, g, b, m, v, z, out, sm, si, r: norm.batch_norm_train(
                    x, g, b, m, v, z=z, out=out, save_mean=sm, save_invstd=si, reserve=r, layout="NCHW",
                    dtype="fp32", relu=True),
                [("x", S, dict(host_dispatch=True)), ("gamma", C3, {}), ("beta", C3, {}), ("running_mean", C3, stat),
                 ("running_var", C3, stat), ("z", S, dict(optional=True)), ("out", S, OUT), ("save_mean", C3, OUT),
                 ("save_invstd", C3, OUT), ("reserve", (64,), OUT)])
    t += family("norm.batch_norm_infer",
                lambda x, g, b, m, v, z, out: norm.batch_norm_infer(x, g, b, m, v, z=z, out=out, layout="NCHW",
                                                                    dtype="fp32"),
                [("x", S, dict(host_dispatch=True)), ("gamma", C3, {}), ("beta", C3, {}), ("running_mean", C3, {}),
                 ("running_var", C3, {}), ("z", S, dict(optional=True)), ("out", S, OUT)])
    t += family("norm.batch_norm_backward",
                lambda x, dy, g, b, sm, si, y, r, dx, dg, db, dz: norm.batch_norm_backward(
                    x, dy, g, b, sm, si, y=y, reserve=r, dx=dx, dgamma=dg, dbeta=db, dz=dz, layout="NCHW",
                    dtype="fp32", relu=True, has_z=True),
                [("x", S, {}), ("dy", S, {}), ("gamma", C3, {}), ("beta", C3, {}), ("save_mean", C3, {}),
                 ("save_invstd", C3, {}), ("y", S, {}), ("reserve", (64,), dict(optional=True)), ("dx", S, OUT),
                 ("dgamma", C3, OUT), ("dbeta", C3, OUT), ("dz", S, OUT)])

    # synchronized batch norm (the same shapes; sums (2, 3); count 40 = this rank's N * H * W)
    S2 = (2, 3)
    t += family("norm.sync_bn_sums",
                lambda x, shift, sums: norm.sync_bn_sums(x, shift, sums=sums, layout="NCHW", dtype="fp32"),
                [("x", S, dict(host_dispatch=True)), ("shift", C3, {}), ("sums", S2, OUT)])
    t += family("norm.sync_bn_forward",
                lambda x, sums, g, b, m, v, z, out, sm, si: norm.sync_bn_forward(
                    x, sums, g, b, m, v, count=40, z=z, out=out, save_mean=sm, save_invstd=si, layout="NCHW",
                    dtype="fp32", relu=True),
                [("x", S, dict(host_dispatch=True)), ("sums", S2, {}), ("gamma", C3, {}), ("beta", C3, {}),
                 ("running_mean", C3, stat), ("running_var", C3, stat), ("z", S, dict(optional=True)),
                 ("out", S, OUT), ("save_mean", C3, OUT), ("save_invstd", C3, OUT)])
    t += family("norm.sync_bn_grad_sums",
                lambda x, dy, sm, si, y, sums, dg, db, dz: norm.sync_bn_grad_sums(
                    x, dy, sm, si, y=y, sums=sums, dgamma=dg, dbeta=db, dz=dz, layout="NCHW", dtype="fp32",
                    relu=True, has_z=True),
                [("x", S, {}), ("dy", S, {}), ("save_mean", C3, {}), ("save_invstd", C3, {}), ("y", S, {}),
                 ("sums", S2, OUT), ("dgamma", C3, OUT), ("dbeta", C3, OUT), ("dz", S, OUT)])
    t += family("norm.sync_bn_backward",
                lambda x, dy, g, sm, si, sums, y, dx: norm.sync_bn_backward(
                    x, dy, g, sm, si, sums, count=40, y=y, dx=dx, layout="NCHW", dtype="fp32", relu=True),
                [("x", S, {}), ("dy", S, {}), ("gamma", C3, {}), ("save_mean", C3, {}), ("save_invstd", C3, {}),
                 ("sums", S2, {}), ("y", S, {}), ("dx", S, OUT)])

    # pooling (NCHW: x (2, 3, 8, 8), kernel 2 -> (2, 3, 4, 4))
    P, Q = (2, 3, 8, 8), (2, 3, 4, 4)
    t += family("pool.max_pool2d", lambda x, out: pool.max_pool2d(x, kernel=2, layout="NCHW", out=out, dtype="fp32"),
                [("x", P, dict(host_dispatch=True)), ("out", Q, OUT)])
    t += family("pool.max_pool2d_backward",
                lambda dy, x, y, out: pool.max_pool2d_backward(dy, x, y, kernel=2, layout="NCHW", out=out,
                                                               dtype="fp32"),
                [("dy", Q, {}), ("x", P, {}), ("y", Q, {}), ("out", P, OUT)])
    t += family("pool.global_avg_pool", lambda x, out: pool.global_avg_pool(x, layout="NCHW", out=out, dtype="fp32"),
                [("x", P, dict(host_dispatch=True)), ("out", (2, 3), OUT)])
    t += family("pool.global_avg_pool_backward",
                lambda dy, out: pool.global_avg_pool_backward(dy, P, layout="NCHW", out=out, dtype="fp32"),
                [("dy", (2, 3), dict(host_dispatch=True)), ("out", P, OUT)])

    # multi-tensor: list entries; the device scalars and found_inf (checked before the tables); the tables
    t.append(Target("multi_tensor.TensorList:arrays[1]", "arrays[1]",
                    lambda b: mt.TensorList([fake((3,)), b], dtype="fp32"), shape=(7,), optional=True))
    t.append(Target("multi_tensor.TensorList:arrays", "arrays", lambda b: mt.TensorList(b, dtype="fp32"),
                    shape=(7,), name_pattern=r"arrays(\[\d+\])?: "))
    one = (1,)
    scalar = dict(number_ok=True)
    flag = dict(dtype="int32", accepted=I4, optional=True)
    t += family("multi_tensor.sgd_step",
                lambda lr, inv_scale, momentum, found_inf: mt.sgd_step(
                    None, None, None, lr=lr, inv_scale=inv_scale, momentum=momentum, found_inf=found_inf),
                [("lr", one, scalar), ("inv_scale", one, scalar), ("momentum", one, scalar),
                 ("found_inf", one, flag)])
    t += family("multi_tensor.adamw_step",
                lambda lr, inv_scale, step, beta1, found_inf: mt.adamw_step(
                    None, None, None, None, lr=lr, inv_scale=inv_scale, step=step, beta1=beta1, found_inf=found_inf),
                [("lr", one, scalar), ("inv_scale", one, scalar), ("step", one, scalar), ("beta1", one, scalar),
                 ("found_inf", one, flag)])
    t.append(Target("multi_tensor.check_finite:found_inf", "found_inf", lambda b: mt.check_finite(None, b),
                    shape=one, dtype="int32", accepted=I4, writable=True))
    t.append(Target("multi_tensor.scale_:factor", "factor", lambda b: mt.scale_(None, b), shape=one, **scalar))
    tables = [("multi_tensor.sgd_step:params", "params", lambda b: mt.sgd_step(b, None, None, lr=0.1)),
              ("multi_tensor.adamw_step:params", "params",
               lambda b: mt.adamw_step(b, None, None, None, lr=0.1, step=1)),
              ("multi_tensor.check_finite:grads", "grads", lambda b: mt.check_finite(b, fake(one, "int32"))),
              ("multi_tensor.zero_:tensors", "tensors", mt.zero_),
              ("multi_tensor.scale_:tensors", "tensors", lambda b: mt.scale_(b, 2.0))]
    t += [Target(label, name, call, table=True) for label, name, call in tables]
    t.append(Target("multi_tensor.write_scalars:dst", "dst", lambda b: mt.write_scalars(b, [1.0, 2.0]), shape=(2,),
                    writable=True, host_dispatch=True))
    t += family("multi_tensor.advance_step", mt.advance_step,
                [("step", one, dict(writable=True, host_dispatch=True)), ("found_inf", one, flag)])
    t += _loss_and_augment_targets()
    return t


def _loss_and_augment_targets():
    one = (1,)
    out = dict(writable=True, optional=True)
    t = family("loss.cross_entropy_forward",
               lambda logits, labels, loss, correct, loss_sum, correct_sum: _C.cross_entropy_forward(
                   logits, labels, 0.1, loss, correct, loss_sum, correct_sum, 0),
               [("logits", (4, 10), {}), ("labels", (4,), dict(dtype="int32", accepted=I4)), ("loss", one, out),
                ("correct", one, dict(dtype="int32", accepted=I4, **out)),
                ("loss_sum", one, dict(dtype="float64", accepted=F8, **out)),
                ("correct_sum", one, dict(dtype="float64", accepted=F8, **out))])
    t += family("loss.cross_entropy_backward",
                lambda logits, labels, scale, grad: _C.cross_entropy_backward(logits, labels, 0.0, scale, grad, 0),
                [("logits", (4, 10), {}), ("labels", (4,), dict(dtype="int32", accepted=I4)),
                 ("scale", one, dict(number_ok=True, optional=True)), ("grad", (4, 10), out)])
    t += family("loss_scale.update", lambda scale, tracker, found_inf: _C.update_loss_scale(
        scale, tracker, found_inf, 2.0, 0.5, 100, 0),
        [("scale", one, dict(writable=True)), ("tracker", one, dict(dtype="int32", accepted=I4, writable=True)),
         ("found_inf", one, dict(dtype="int32", accepted=I4))])
    t += family("loss_scale.reciprocal", lambda scale, inv_scale: _C.reciprocal_scale(scale, inv_scale, 0),
                [("scale", one, {}), ("inv_scale", one, dict(writable=True))])
    labels = dict(dtype="int32", accepted=I4)
    t += family("data.augment_u8",
                lambda images, params, lut, out, labels, labels_out: _C.augment_u8(
                    images, params, 0, 2, lut, out, "NHWC", 4, 0, labels, labels_out, 0),
                [("images", (2, 8, 8, 3), dict(dtype="uint8", accepted=U1)),
                 ("params", (6, 4), dict(dtype="int32", accepted=I4)),
                 ("lut", (3, 256), dict(accepted=FLOATS_AND_BF16_BITS)), ("out", (2, 8, 8, 3), out),
                 ("labels", (2,), labels), ("labels_out", (2,), dict(writable=True, **labels))])
    t += family("data.downscale_u8", lambda images, wy, wx, out: _C.downscale_u8(images, wy, wx, out, 0),
                [("images", (2, 8, 8, 3), dict(dtype="uint8", accepted=U1)),
                 ("wy", (4, 8), dict(dtype="float64", accepted=F8)), ("wx", (4, 8), dict(dtype="float64", accepted=F8)),
                 ("out", (2, 4, 4, 3), dict(dtype="uint8", accepted=U1, writable=True))])
    return t


TARGETS = _targets()

