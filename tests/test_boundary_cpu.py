"""The array boundary on any machine: what every op's array and shape arguments are held to, whatever their source
(a __cuda_array_interface__ dict, a DLPack capsule, a cupy.ndarray read through its attributes).

Malformed DLPack capsules must raise, not crash; shapes must never wrap around; every interface field is honoured
or refused with an error naming the argument; cupy's fast path and the general parser agree; outputs not given
are allocated only after every argument has been validated.
"""

import numpy as np
import pytest
from fake_arrays import (
    FLAG_IS_COPIED,
    FLAG_READ_ONLY,
    KDL_CPU,
    KDL_CUDA_MANAGED,
    FakeCudaArray,
    FakeDLPackArray,
    cupy_at,
    duck_like,
    expect_device_stage,
    fake,
)

import resnet_native as rn
from resnet_native import _C
from resnet_native.ops import conv, kernels, norm, pool
from resnet_native.ops import multi_tensor as mt


def parse(obj, name="x", dtype="fp32", ndim=-1):
    return _C._testing.parse_tensor(obj, name, dtype, ndim=ndim, check_device=False)


# Every op reaches arrays through the same parser: a bad array must be refused by each, naming it.
def through_kernels(x):
    kernels.add(x, x, out=x, dtype="fp32")


def through_conv(x):
    conv.conv2d(x, fake((4, 3, 3, 3)), conv.ConvSpec(padding=1))


def through_batch_norm(x):
    params = [fake((3,)) for _ in range(4)]
    norm.batch_norm_train(x, *params, layout="NCHW", dtype="fp32")


def through_tensor_list(x):
    mt.TensorList([fake((3,)), x])


OPS = {"kernels": (through_kernels, "a"), "conv2d": (through_conv, "x"), "batch_norm": (through_batch_norm, "x"),
       "TensorList": (through_tensor_list, r"arrays\[1\]")}


# ---- DLPack capsules that crashed the parser ----------------------------------------------------------------------
BAD_CAPSULES = {
    "null shape": (dict(shape=None, ndim=4), ValueError, "4 dimensions but no shape"),
    "negative ndim": (dict(shape=(2, 3, 4, 4), ndim=-3), ValueError, "has ndim -3"),
    "huge ndim": (dict(shape=(2, 3, 4, 4), ndim=100_000), ValueError, "too many dimensions"),
    "overflowing count": (dict(shape=(2**21, 2**21, 2**21, 2**21)), ValueError, "more bytes than fit in int64"),
    "negative dimension": (dict(shape=(2, -3, 4, 4)), ValueError, "negative dimension"),
    "null data": (dict(shape=(2, 3, 4, 4), data=None), ValueError, "data pointer is NULL"),
    "lanes": (dict(shape=(2, 3, 4, 4), lanes=4), TypeError, "float32x4"),
    "misaligned byte_offset": (dict(shape=(2, 3, 4, 4), byte_offset=2), ValueError, "not aligned"),
    "wrapping byte_offset": (dict(shape=(2, 3, 4, 4), byte_offset=2**64 - 16), ValueError, "address space"),
    "strides": (dict(shape=(2, 3, 4, 4), strides=(48, 1, 12, 3)), ValueError, "C-contiguous"),
    "capsule on the host": (dict(shape=(2, 3, 4, 4), capsule_device=(KDL_CPU, 0)), TypeError, "device type 1"),
    "consumed capsule": (dict(shape=(2, 3, 4, 4), capsule_name="used_dltensor"), TypeError, "capsule"),
    "DLPack 2.0": (dict(shape=(2, 3, 4, 4), always_versioned=True, version=(2, 0)), TypeError, "DLPack 2.0"),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("case", sorted(BAD_CAPSULES))
def test_malformed_dlpack_capsules_raise_naming_the_argument(case, op):
    fields, error, message = BAD_CAPSULES[case]
    call, name = OPS[op]
    fields = dict(fields)
    shape = fields.pop("shape")
    if op == "TensorList" and shape is not None:
        shape = shape[1:]  # any rank will do; keeps the same fault
    with pytest.raises(error, match=rf"^{name}: .*{message}"):
        call(FakeDLPackArray(shape, **fields))


def test_dlpack_fields_that_are_fine():
    a = FakeDLPackArray((2, 3), byte_offset=64)
    assert parse(a) == (a.ptr + 64, "float32", (2, 3))  # the offset is part of the address
    strided = FakeDLPackArray((2, 1, 3), strides=(3, 99, 1))  # element strides; size-1 dimensions may have any
    assert parse(strided)[2] == (2, 1, 3)
    assert parse(FakeDLPackArray((4,), device=(KDL_CUDA_MANAGED, 0), capsule_device=(KDL_CUDA_MANAGED, 0)))[2] == (4,)
    assert parse(FakeDLPackArray((4,), "bfloat16"), dtype="bf16")[1] == "bfloat16"
    with pytest.raises(ValueError, match=r"^x: 0-D arrays are not supported"):
        parse(FakeDLPackArray(()))
    with pytest.raises(TypeError, match=r"^x: expected a CUDA array, got a .*FakeDLPackArray in host memory"):
        parse(FakeDLPackArray((4,), device=(KDL_CPU, 0)))


def test_dlpack_versioned_capsules_carry_read_only_and_copied():
    versioned = FakeDLPackArray((4, 5), versioned=True)
    assert parse(versioned)[2] == (4, 5)
    assert versioned.calls[-1]["max_version"][0] == 1  # the consumer asks for DLPack 1.x
    old = FakeDLPackArray((4, 5), accepts_max_version=False)  # a producer older than DLPack 1.0
    assert parse(old)[2] == (4, 5) and old.calls == [{"max_version": (1, 1)}, {}]
    read_only = FakeDLPackArray((4, 5), versioned=True, flags=FLAG_READ_ONLY)
    copied = FakeDLPackArray((4, 5), versioned=True, flags=FLAG_IS_COPIED)
    x = fake((4, 5))
    with expect_device_stage():
        kernels.add(read_only, copied, out=x)  # inputs may be read-only copies
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        kernels.add(x, x, out=read_only)
    with pytest.raises(ValueError, match="^out: __dlpack__ gave a copy"):
        kernels.add(x, x, out=copied)


# ---- shapes never wrap around ---------------------------------------------------------------------------------------
def test_shape_tuples_are_range_checked_not_truncated():
    with pytest.raises(ValueError, match=r"^x_shape: dimension 0 of shape \(4294967297, 3, 8, 8\) is larger than"):
        pool.max_pool2d_output_shape((2**32 + 1, 3, 8, 8), kernel=2, layout="NCHW")
    with pytest.raises(ValueError, match="^x_shape: dimension 3 .* is larger than 2147483647"):
        norm.batch_norm_reserve_size((4, 8, 8, 2**31), layout="NHWC", dtype="fp16")
    with pytest.raises(ValueError, match="^x_shape: .* does not fit in int64"):
        pool.global_avg_pool_backward(fake((4, 3)), (4, 3, 2**70, 8), layout="NCHW")
    with pytest.raises(TypeError, match=r"^x_shape: expected a tuple of ints, got \(4, 3, 8.0, 8\)"):
        pool.max_pool2d_output_shape((4, 3, 8.0, 8), kernel=2, layout="NCHW")
    with pytest.raises(ValueError, match="^x_shape: expected positive sizes"):
        pool.max_pool2d_output_shape((4, 3, -8, 8), kernel=2, layout="NCHW")
    with pytest.raises(ValueError, match="^kernel: .* out of range"):
        pool.max_pool2d_output_shape((4, 3, 8, 8), kernel=2**32 + 2, layout="NCHW")
    assert pool.max_pool2d_output_shape((4, 3, 8, np.int64(8)), kernel=np.int32(2), layout="NCHW") == (4, 3, 4, 4)


def test_array_shapes_are_range_checked():
    with pytest.raises(ValueError, match=r"^x: dimension 0 of shape \(4294967297, 3, 8, 8\) is larger than"):
        norm.batch_norm_infer(fake((2**32 + 1, 3, 8, 8)), *[fake((3,)) for _ in range(4)], layout="NCHW")
    with pytest.raises(ValueError, match=r"^x: dimension 0 .* is larger than"):
        pool.max_pool2d(fake((2**32 + 1, 3, 8, 8)), kernel=2, layout="NCHW")
    with pytest.raises(ValueError, match="^a: shape .* has more bytes than fit in int64"):
        kernels.add(fake((2**40, 2**40)), fake((2**40, 2**40)))
    with pytest.raises(ValueError, match="^x: .* does not fit in int64"):
        parse(FakeCudaArray((2, 3), shape=(2**70, 3)))
    with pytest.raises(ValueError, match=r"^x: negative dimension in shape \(-1, 3\)"):
        parse(FakeCudaArray((2, 3), shape=(-1, 3)))
    with pytest.raises(ValueError, match=r"^x: empty arrays are not supported \(shape \(0, 4611686018427387904"):
        parse(FakeCudaArray((2, 3), shape=(0, 2**62, 2**62)))  # empty, not an overflow


# ---- every __cuda_array_interface__ field -------------------------------------------------------------------------
BAD_INTERFACES = {
    "big-endian": (dict(typestr=">f4"), TypeError, "big-endian arrays are not supported, got typestr '>f4'"),
    "version 99": (dict(version=99), ValueError, "version 99 is not supported"),
    "mask": (dict(mask=(1 << 20, False)), ValueError, "masked arrays are not supported"),
    "one-element data": (dict(data=(1 << 20,)), TypeError, r"'data' must be a \(pointer, read_only\) pair"),
    "non-bool read_only": (dict(data=(1 << 20, 0)), TypeError, r"'data' must be a \(pointer, read_only\) pair"),
    "no typestr": (dict(drop=("typestr",)), TypeError, "has no 'typestr' entry"),
    "no shape": (dict(drop=("shape",)), TypeError, "has no 'shape' entry"),
    "no data": (dict(drop=("data",)), TypeError, "has no 'data' entry"),
    "no version": (dict(drop=("version",)), TypeError, "has no 'version' entry"),
    "short strides": (dict(strides=(4,)), ValueError, r"'strides' \(4,\) has 1 entries for a 2-D array"),
    "float shape": (dict(shape=(2.0, 3)), TypeError, "'shape' must be a tuple of ints"),
    "bool shape": (dict(shape=(True, 3)), TypeError, "'shape' must be a tuple of ints"),
    "shape string": (dict(shape="23"), TypeError, "'shape' must be a tuple of ints"),
    "float strides": (dict(strides=(12.0, 4)), TypeError, "'strides' must be a tuple of ints"),
    "typestr bytes": (dict(typestr=b"<f4"), TypeError, "'typestr' must be a str"),
    "typestr garbage": (dict(typestr="float"), TypeError, "'typestr' is not a typestr"),
    "null pointer": (dict(data=(0, False)), ValueError, "data pointer is NULL"),
    "misaligned pointer": (dict(data=((1 << 20) + 2, False)), ValueError, "not aligned to the 4-byte elements"),
    "0-D": (dict(shape=()), ValueError, r"0-D arrays are not supported \(use shape \(1,\)\)"),
    "nine dimensions": (dict(shape=(1,) * 9), ValueError, "too many dimensions"),
}


@pytest.mark.parametrize("case", sorted(BAD_INTERFACES))
def test_malformed_interfaces_raise_naming_the_argument(case):
    fields, error, message = BAD_INTERFACES[case]
    with pytest.raises(error, match=rf"^dy: .*{message}"):
        parse(FakeCudaArray((2, 3), **fields), name="dy")
    with pytest.raises(error, match=rf"^b: .*{message}"):
        kernels.add(fake((2, 3)), FakeCudaArray((2, 3), **fields), dtype="fp32")


def test_interface_is_a_dict():
    class ListInterface:
        __cuda_array_interface__ = [("shape", (2,))]

    with pytest.raises(TypeError, match="^x: __cuda_array_interface__ must be a dict, got list"):
        parse(ListInterface())


def test_interface_fields_that_are_fine():
    # Versions 0 to 3, little-endian or native byte order, an explicit None mask and a stream are all accepted.
    for fields in (dict(version=0), dict(typestr="=f4"), dict(mask=None), dict(stream=1), dict(shape=[2, 3]),
                   dict(shape=(np.int64(2), 3)), dict(strides=(12, 4)), dict(descr=[("", "<f4")])):
        assert parse(FakeCudaArray((2, 3), ptr=1 << 20, **fields)) == (1 << 20, "float32", (2, 3)), fields


def test_read_only_arrays_are_refused_as_outputs_only():
    ro = fake((2, 8, 5, 5), readonly=True)
    x, out = fake((2, 8, 5, 5)), fake((2, 8, 5, 5))
    params = [fake((8,)) for _ in range(4)]
    with expect_device_stage():
        kernels.add(ro, ro, out=out)  # read-only inputs are fine
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        kernels.add(x, x, out=ro)
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        kernels.cast(x, fake((2, 8, 5, 5), "float16", readonly=True))
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        norm.batch_norm_train(x, *params, layout="NCHW", out=ro)
    with pytest.raises(ValueError, match="^running_var: the array is read-only"):
        norm.batch_norm_train(x, *params[:3], fake((8,), readonly=True), layout="NCHW", out=out)
    with pytest.raises(ValueError, match="^dx: the array is read-only"):
        norm.batch_norm_backward(x, x, *params, layout="NCHW", dx=ro)
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        pool.global_avg_pool_backward(fake((2, 8)), (2, 8, 5, 5), layout="NCHW", out=ro)
    with pytest.raises(ValueError, match="^found_inf: the array is read-only"):
        mt.check_finite([x], fake((1,), "int32", readonly=True))


# ---- cupy arrays: the fast path accepts and refuses exactly what the general parser does ---------------------------
CUPY_CASES = [
    ((2, 8, 8, 16), "float32", 0, "fp32", -1),
    ((16,), "float16", 256, "fp16", 1),
    ((3, 1, 5), "uint16", 4096, "bf16", -1),
    ((4,), "int32", 64, "fp32", -1),  # wrong dtype
    ((4, 4), "float16", 0, "fp32", -1),  # wrong dtype
    ((4, 4), "uint16", 0, "fp16", -1),  # wrong dtype, bf16 hint
    ((2, 3), "float32", 0, "fp32", 4),  # wrong rank
    ((0, 3), "float32", 0, "fp32", -1),  # empty
    ((), "float32", 0, "fp32", -1),  # 0-D
    ((6,), "float32", 2, "fp32", -1),  # misaligned
]


def outcome(obj, dtype, ndim):
    try:
        return parse(obj, dtype=dtype, ndim=ndim)
    except (TypeError, ValueError) as e:
        return type(e), str(e)


@pytest.mark.parametrize("shape,dtype,offset,want,ndim", CUPY_CASES)
def test_cupy_fast_path_agrees_with_the_general_parser(shape, dtype, offset, want, ndim):
    a = cupy_at(shape, dtype, offset)
    assert outcome(a, want, ndim) == outcome(duck_like(a), want, ndim)


@pytest.mark.skipif(not rn.cuda_available(), reason="cupy describes a strided view only with a GPU")
def test_cupy_views_take_the_general_parser_with_the_same_errors():
    a = cupy_at((4, 6), "float32")
    assert outcome(a.T, "fp32", -1) == outcome(duck_like(a.T), "fp32", -1)
    assert outcome(a.T, "fp32", -1)[0] is ValueError


def test_dtype_inference_is_the_native_cores():
    cupy = pytest.importorskip("cupy")
    x = cupy_at((2, 3), "uint16")
    with pytest.raises(TypeError, match="^x: a 16-bit integer array is taken as bf16 bits only when asked"):
        kernels.relu(x)
    with pytest.raises(TypeError, match=r"^x: expected a float32, float16 or bf16 \(uint16\) array, got int32"):
        kernels.relu(cupy_at((2, 3), "int32"))
    with pytest.raises(TypeError, match=r"^x: expected a float32, float16 or bf16 \(uint16\) array, got int8"):
        kernels.relu(FakeDLPackArray((2, 3), "int8"))
    with expect_device_stage():
        kernels.relu(FakeDLPackArray((2, 3), "bfloat16"))  # a true bfloat16 needs no asking
    with expect_device_stage():
        kernels.cast(x, cupy_at((2, 3), "float32", 1 << 12))  # cast: uint16 is bf16
    with expect_device_stage():
        kernels.relu(x, dtype=_C.DType.bf16)  # the typed enum works as well as the name
    with expect_device_stage():
        pool.global_avg_pool(fake((2, 4, 4, 8)), layout=_C.Layout.NHWC)
    with pytest.raises(ValueError, match="^layout: expected 'NCHW' or 'NHWC', got 5"):
        kernels.add_tensor_cudnn(fake((1, 2, 3, 4)), fake((1, 2, 3, 4)), layout=5)
    assert cupy.ndarray is type(x)


# ---- outputs are allocated only after validation ------------------------------------------------------------------
def test_missing_outputs_are_allocated_after_every_check():
    # Were outputs allocated first, these would fail in cupy (no GPU here) before the bad argument was seen.
    with pytest.raises(ValueError, match="^a and b must have the same shape"):
        kernels.add(fake((4, 5)), fake((5, 4)))
    with pytest.raises(ValueError, match=r"^gamma: expected shape \(8,\)"):
        norm.batch_norm_train(fake((2, 8, 5, 5)), fake((7,)), *[fake((8,)) for _ in range(3)], layout="NCHW")
    with pytest.raises(ValueError, match=r"^dy: expected shape \(4, 32\)"):
        pool.global_avg_pool_backward(fake((4, 31)), (4, 32, 7, 7), layout="NCHW")
    with pytest.raises(ValueError, match="^kernel: window 9 is larger than the padded input"):
        pool.max_pool2d(fake((2, 3, 8, 8)), kernel=9, layout="NCHW")
    if not rn.cuda_available():  # valid arguments: the device check comes before any allocation
        with pytest.raises(rn.NoGPUError):
            kernels.add(fake((4, 5)), fake((4, 5)))
        with pytest.raises(rn.NoGPUError):
            norm.batch_norm_backward(*[fake((2, 8, 5, 5)) for _ in range(2)], *[fake((8,)) for _ in range(4)],
                                     layout="NCHW", has_z=True)


@pytest.mark.skipif(rn.cuda_available(), reason="checks the no-GPU reason")
def test_no_gpu_reason_says_what_is_missing():
    reason = _C.device_unavailable_reason()
    assert reason == "no CUDA GPU" or reason.startswith("no CUDA GPU or driver (cuda")
    with pytest.raises(rn.NoGPUError, match=r"needs a CUDA GPU, but none is usable \(no CUDA GPU"):
        kernels.add(fake((4,)), fake((4,)))
