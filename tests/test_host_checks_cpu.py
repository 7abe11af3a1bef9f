"""Issue 39: the host path checks what the GPU path checks, with the same messages; flags and numbers of the wrong
type are refused naming the argument. The ops check their numbers in the ops/ wrapper, before either path runs, so
each case here is tried on NumPy arrays (the float64 reference) and on fake device arrays (the native core)."""

import json
import pickle
import warnings

import numpy as np
import pytest
from fake_arrays import fake

from resnet_native import reference
from resnet_native.data import cifar10
from resnet_native.nn.params import Parameter
from resnet_native.ops import algo_cache, conv, norm
from resnet_native.ops import multi_tensor as mt
from resnet_native.ops.conv_spec import ConvSpec
from resnet_native.optim import SGD, AdamW, GradScaler

NAN, INF = float("nan"), float("inf")


def _message(error, call) -> str:
    with pytest.raises(error) as info:
        call()
    return str(info.value)


def _same_on_both_paths(error, host_call, device_call) -> str:
    """The message both paths give (they must give the same one)."""
    host, device = _message(error, host_call), _message(error, device_call)
    assert host == device
    return host


# ---- 1. batch norm's eps (and momentum) ------------------------------------------------------------------------

def _norm_arrays(make):
    x = make((2, 4, 3, 3))
    return x, [make((4,)) for _ in range(4)]


def _host(shape):
    return np.ones(shape, np.float32)


@pytest.mark.parametrize("eps", [NAN, -1.0, INF, -INF])
def test_batch_norm_eps_is_refused_on_the_host_as_natively(eps):
    expected = f"eps: expected a finite value >= 0, got {eps!r}"  # the native core's words (value_args.cpp)
    hx, hp = _norm_arrays(_host)
    dx, dp = _norm_arrays(fake)
    ops = [
        lambda x, p: norm.batch_norm_infer(x, *p, layout="NCHW", eps=eps),
        lambda x, p: norm.batch_norm_train(x, *p, layout="NCHW", eps=eps),
        lambda x, p: norm.batch_norm_backward(x, x, p[0], p[1], p[2], p[3], layout="NCHW", eps=eps),
        lambda x, p: norm.sync_bn_forward(x, np.zeros((2, 4), np.float32) if isinstance(x, np.ndarray)
                                          else fake((2, 4)), *p, count=18, layout="NCHW", eps=eps),
    ]
    for op in ops:
        assert _same_on_both_paths(ValueError, lambda op=op: op(hx, hp), lambda op=op: op(dx, dp)) == expected


def test_batch_norm_numbers_of_the_wrong_type_are_refused_on_both_paths():
    hx, hp = _norm_arrays(_host)
    dx, dp = _norm_arrays(fake)
    for eps in ("1e-5", None, True):
        message = _same_on_both_paths(TypeError, lambda e=eps: norm.batch_norm_infer(hx, *hp, layout="NCHW", eps=e),
                                      lambda e=eps: norm.batch_norm_infer(dx, *dp, layout="NCHW", eps=e))
        assert message.startswith("eps: expected a finite number, got ")
    message = _same_on_both_paths(ValueError, lambda: norm.batch_norm_train(hx, *hp, layout="NCHW", momentum=NAN),
                                  lambda: norm.batch_norm_train(dx, *dp, layout="NCHW", momentum=NAN))
    assert message == "momentum: expected a value in [0, 1], got nan"
    # Valid numbers still run on the host.
    y = norm.batch_norm_infer(hx, *hp, layout="NCHW", eps=np.float32(1e-5))
    assert y.shape == hx.shape and np.isfinite(y).all()


# ---- 2. the multi-tensor optimizer steps ----------------------------------------------------------------------

def _host_lists(n=4):
    return [reference.multi_tensor.TensorList([np.ones(3, np.float32)]) for _ in range(n)]


def _device_lists(n=4):
    return [[fake((3,))] for _ in range(n)]  # plain lists: a number the wrapper lets through fails on them


SGD_CASES = [
    (dict(lr=NAN), ValueError, "lr: expected a finite value >= 0, got nan"),
    (dict(lr=INF), ValueError, "lr: expected a finite value >= 0, got inf"),
    (dict(lr=-0.1), ValueError, "lr: expected a value >= 0, got -0.1"),
    (dict(lr=0.1, momentum=INF), ValueError, "momentum: expected a finite value >= 0, got inf"),
    (dict(lr=0.1, momentum=-0.5), ValueError, "momentum: expected a value >= 0, got -0.5"),
    (dict(lr=0.1, inv_scale=-1), ValueError, "inv_scale: expected a value >= 0, got -1.0"),
    (dict(lr=0.1, inv_scale=NAN), ValueError, "inv_scale: expected a finite value >= 0, got nan"),
    (dict(lr=0.1, weight_decay=NAN), ValueError, "weight_decay: expected a finite value >= 0, got nan"),
    (dict(lr=0.1, dampening=INF), ValueError, "dampening: expected a finite value >= 0, got inf"),
    (dict(lr="fast"), TypeError, "lr: expected a number or a float32 device array of shape (1,), got str"),
    (dict(lr=0.1, nesterov="yes"), TypeError, "nesterov: expected True or False, got 'yes'"),
]


@pytest.mark.parametrize("kwargs, error, expected", SGD_CASES)
def test_sgd_step_numbers_are_checked_once_for_both_paths(kwargs, error, expected):
    kwargs = {"momentum": 0.9, **kwargs}
    message = _same_on_both_paths(error, lambda: mt.sgd_step(*_host_lists(3), **kwargs),
                                  lambda: mt.sgd_step(*_device_lists(3), **kwargs))
    assert message == expected


ADAMW_CASES = [
    (dict(lr=NAN), ValueError, "lr: expected a finite value >= 0, got nan"),
    (dict(lr=INF), ValueError, "lr: expected a finite value >= 0, got inf"),
    (dict(eps=INF), ValueError, "eps: expected a finite value >= 0, got inf"),
    (dict(weight_decay=NAN), ValueError, "weight_decay: expected a finite value >= 0, got nan"),
    (dict(inv_scale=-1), ValueError, "inv_scale: expected a value >= 0, got -1.0"),
    (dict(beta1=NAN), ValueError, "beta1: expected a finite value in [0, 1), got nan"),
    (dict(beta2=1.0), ValueError, "beta2: expected a value in [0, 1), got 1.0"),
    (dict(step=INF), ValueError, "step: expected a finite value, got inf"),
    (dict(step=0), ValueError, "step: expected the 1-based step number, got 0.0"),
    (dict(eps="1e-8"), TypeError, "eps: expected a number, got str"),
]


@pytest.mark.parametrize("kwargs, error, expected", ADAMW_CASES)
def test_adamw_step_numbers_are_checked_once_for_both_paths(kwargs, error, expected):
    kwargs = {"lr": 0.1, "step": 1, **kwargs}
    message = _same_on_both_paths(error, lambda: mt.adamw_step(*_host_lists(), **kwargs),
                                  lambda: mt.adamw_step(*_device_lists(), **kwargs))
    assert message == expected


def test_valid_steps_still_run_on_the_host():
    params, grads, bufs = _host_lists(3)
    mt.sgd_step(params, grads, bufs, lr=0.5, momentum=0.0)
    np.testing.assert_allclose(params[0], 0.5)
    params, grads, m, v = _host_lists()
    mt.adamw_step(params, grads, m, v, lr=np.float32(0.1), step=np.array([2.0]), weight_decay=0.0)
    assert np.isfinite(params[0]).all()


# ---- 3. flags and numbers of the wrong type --------------------------------------------------------------------

def test_flags_of_the_wrong_type_are_refused():
    with pytest.raises(TypeError, match="enabled: expected True or False, got 'no'"):
        GradScaler(enabled="no")
    assert GradScaler(enabled=np.bool_(False)).enabled is False
    before = norm.fuse_bf16()
    with pytest.raises(TypeError, match="enabled: expected True or False, got 'false'"):
        norm.set_fuse_bf16("false")
    assert norm.fuse_bf16() == before
    p = [Parameter(np.zeros(2))]
    with pytest.raises(TypeError, match="nesterov: expected True or False, got 1"):
        SGD(p, lr=0.1, nesterov=1)


def test_optimizer_numbers_of_the_wrong_type_are_refused():
    p = [Parameter(np.zeros(2))]
    with pytest.raises(TypeError, match="lr: expected a finite number, got str '0.1'"):
        SGD(p, lr="0.1")
    with pytest.raises(TypeError, match="lr: expected a finite number, got str '0.1'"):
        AdamW(p, lr="0.1")
    with pytest.raises(ValueError, match="lr: expected a finite value >= 0, got nan"):
        SGD(p, lr=NAN)
    with pytest.raises(TypeError, match="momentum: expected a finite number, got str"):
        SGD(p, lr=0.1, momentum="0.9")
    with pytest.raises(ValueError, match="eps: expected a finite value >= 0, got inf"):
        AdamW(p, eps=INF)
    with pytest.raises(TypeError, match=r"betas\[0\]: expected a finite number, got str"):
        AdamW(p, betas=("0.9", 0.999))
    with pytest.raises(TypeError, match="init_scale: expected a finite number, got str"):
        GradScaler(init_scale="65536")
    with pytest.raises(ValueError, match="growth_factor: expected a finite value, got inf"):
        GradScaler(growth_factor=INF)
    assert SGD(p, lr=np.float32(0.1)).lr == pytest.approx(0.1)


# ---- 4. conv2d's alphas ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["alpha1", "alpha2"])
def test_conv2d_alphas_are_named(name):
    spec = ConvSpec()
    hx, hw = np.ones((1, 2, 4, 4), np.float32), np.ones((3, 2, 1, 1), np.float32)
    dx, dw = fake((1, 2, 4, 4)), fake((3, 2, 1, 1))
    message = _same_on_both_paths(TypeError, lambda: conv.conv2d(hx, hw, spec, **{name: "x"}),
                                  lambda: conv.conv2d(dx, dw, spec, **{name: "x"}))
    assert message == f"{name}: expected a finite number, got str 'x'"
    message = _same_on_both_paths(ValueError, lambda: conv.conv2d(hx, hw, spec, **{name: NAN}),
                                  lambda: conv.conv2d(dx, dw, spec, **{name: NAN}))
    assert message == f"{name}: expected a finite value, got nan"


# ---- 5. ConvSpec's per-direction algorithms --------------------------------------------------------------------

def test_conv_spec_refuses_a_direction_given_twice():
    with pytest.raises(ValueError, match=r"algo: the forward direction is given twice \('fwd=IMPLICIT_GEMM' and "
                                         r"'fwd=FFT'\)"):
        ConvSpec(algo="fwd=IMPLICIT_GEMM;fwd=FFT")
    with pytest.raises(ValueError, match="the backward_data direction is given twice"):
        ConvSpec(algo="bwd_data=ALGO_1;fwd=FFT;backward_data=ALGO_0")
    ConvSpec(algo="fwd=IMPLICIT_GEMM;bwd_data=ALGO_1;bwd_filter=heuristic")  # each once: fine


# ---- 6. CIFAR-10 batches and the decode cache ------------------------------------------------------------------

def _batch(data, labels) -> bytes:
    return pickle.dumps({b"data": data, b"labels": labels}, protocol=2)


def test_python_batch_values_out_of_range_are_refused():
    good = np.zeros((2, 3072), np.uint8)
    images, labels = cifar10.parse_python_batch(_batch(good, [0, 9]), "data_batch_1")
    assert images.shape == (2, 32, 32, 3) and labels.tolist() == [0, 9]
    pixels = np.zeros((2, 3072), np.int16)
    pixels[1, 7] = -5
    with pytest.raises(ValueError, match=r"data_batch_1: data: pixel values outside \[0, 256\) \(min -5"):
        cifar10.parse_python_batch(_batch(pixels, [0, 1]), "data_batch_1")
    pixels[1, 7] = 256
    with pytest.raises(ValueError, match=r"data_batch_1: data: pixel values outside \[0, 256\)"):
        cifar10.parse_python_batch(_batch(pixels, [0, 1]), "data_batch_1")
    with pytest.raises(ValueError, match=r"data_batch_1: labels: labels outside \[0, 10\) \(min 0, max 4294967299\)"):
        cifar10.parse_python_batch(_batch(good, [0, 2**32 + 3]), "data_batch_1")
    with pytest.raises(ValueError, match=r"test_batch: labels: labels outside \[0, 10\) \(min -1"):
        cifar10.parse_python_batch(_batch(good, [-1, 3]), "test_batch")
    with pytest.raises(ValueError, match="test_batch: data: expected integers in"):
        cifar10.parse_python_batch(_batch(good.astype(np.float32), [1, 3]), "test_batch")


@pytest.mark.parametrize("batch, message", [
    ({b"\xff": 1}, r"expected keys 'data' and 'labels'"),  # a key that is no UTF-8: was a UnicodeDecodeError
    ({1: 1, "a": 2}, r"expected keys 'data' and 'labels'"),  # keys that do not sort: was a TypeError
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": 3}, r"labels \(\) are not"),  # 0-d: was an IndexError
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": {1, 2}}, "not a CIFAR-10 batch: refusing to load .*set"),
])
def test_python_batch_structures_are_refused_naming_the_batch(batch, message):
    """Every refusal is a ValueError naming the batch; a pickle naming a global outside the allowed ones stays an
    UnpicklingError too."""
    with pytest.raises(ValueError, match=rf"^data_batch_1: .*{message}"):
        cifar10.parse_python_batch(pickle.dumps(batch, protocol=2), "data_batch_1")
    if "refusing" in message:
        with pytest.raises(pickle.UnpicklingError):
            cifar10.parse_python_batch(pickle.dumps(batch, protocol=2), "data_batch_1")


def test_a_decode_cache_with_labels_out_of_range_is_refused_naming_the_file(tmp_path):
    arrays = dict(train_images=np.zeros((2, 32, 32, 3), np.uint8), train_labels=np.array([1, 12], np.int32),
                  test_images=np.zeros((1, 32, 32, 3), np.uint8), test_labels=np.array([3], np.int32))
    path = tmp_path / "src.cifar10cache-0.npz"
    cifar10.atomic_write_npz(path, arrays)
    with pytest.warns(RuntimeWarning, match=rf"{path.name}: train_labels outside \[0, 10\) \(min 1, max 12\)"):
        assert cifar10._load_cache(path, "src") is None  # refused: the caller decodes the source again
    arrays["train_labels"] = np.array([1, 2], np.int32)
    cifar10.atomic_write_npz(path, arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cifar10._load_cache(path, "src").train_labels.tolist() == [1, 2]


# ---- 7. the algorithm-cache file -------------------------------------------------------------------------------

def test_algorithm_cache_file_binary_or_deeply_nested_is_a_value_error_naming_it(tmp_path):
    binary = tmp_path / "algos.json"
    binary.write_bytes(b"\xff\xfe\x00\x81garbage")
    with pytest.raises(ValueError, match=rf"algorithm cache file .*{binary.name}: not UTF-8 text"):
        algo_cache.load_algorithm_cache(binary)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=rf"algorithm cache file .*{deep.name}: .*nested too deeply"):
        algo_cache.load_algorithm_cache(deep)


@pytest.mark.parametrize("value, message", [
    ("1" * 5000, "not JSON .*Exceeds the limit"),  # json's int conversion raised a ValueError naming no file
    ('"\\ud800"', "a string with an unpaired surrogate"),  # JSON, not UTF-8: the native core raised RuntimeError
])
def test_algorithm_cache_json_python_cannot_hold_is_a_value_error_naming_it(tmp_path, value, message):
    path = tmp_path / "algos.json"
    path.write_text('{"format": "resnet_native.algorithm_cache", "version": 1, "entries": [{"key": ' + value + "}]}")
    with pytest.raises(ValueError, match=rf"^algorithm cache file .*{path.name}: {message}"):
        algo_cache.load_algorithm_cache(path)


def test_algorithm_cache_read_sections_names_a_binary_file(tmp_path):
    binary = tmp_path / "algos.json"
    binary.write_bytes(bytes(range(128, 256)))
    with pytest.raises(ValueError, match=rf"{binary.name}: not UTF-8 text"):
        algo_cache.read_sections(binary)
    good = tmp_path / "other.json"
    good.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match=rf"{good.name}: not a resnet_native algorithm cache"):
        algo_cache.read_sections(good)
