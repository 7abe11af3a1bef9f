"""Multi-tensor optimizer API on any machine: TensorList construction checks and argument validation."""

import numpy as np
import pytest
from fake_arrays import expect_device_stage, fake, transposed

from resnet_native import _C
from resnet_native.ops import multi_tensor as mt


def test_tensor_list_validates_every_entry_naming_its_index():
    with pytest.raises(ValueError, match="arrays: expected at least one array"):
        mt.TensorList([])
    with pytest.raises(TypeError, match=r"arrays\[1\]: .*host memory"):
        mt.TensorList([fake((3,)), np.zeros(3, np.float32)])
    with pytest.raises(TypeError, match=r"arrays\[0\]: .*dtype='bf16'"):
        mt.TensorList([fake((3,), "uint16")])
    with pytest.raises(TypeError, match=r"arrays\[2\]: expected a float32, float16 or bf16"):
        mt.TensorList([fake((3,)), fake((3,), "float16"), fake((3,), "int32")])
    with pytest.raises(ValueError, match=r"arrays\[1\]: expected a C-contiguous"):
        mt.TensorList([fake((3,)), transposed((4, 5))])
    with pytest.raises(ValueError, match="dtype: expected 2 dtypes"):
        mt.TensorList([fake((3,)), fake((4,))], dtype=["fp32"])
    with pytest.raises(TypeError, match=r"arrays\[1\]: expected a float32 array, got float16"):
        mt.TensorList([fake((3,)), fake((4,), "float16")], dtype="fp32")
    with expect_device_stage():
        mt.TensorList([fake((3,)), fake((4,), "float16"), fake((5,), "uint16")], dtype=[None, None, "bf16"])
    with expect_device_stage():
        mt.TensorList([fake((3,), "uint16"), None], dtype="bf16")  # None entries: model copies only


def test_chunk_elements_is_a_whole_number_in_range():
    for bad, error in ((0, ValueError), (-5, ValueError), (1.5, TypeError), ("8", TypeError), (True, TypeError),
                       (2**30 + 1, ValueError)):
        with pytest.raises(error, match="chunk_elements: expected"):
            mt.TensorList([fake((3,))], chunk_elements=bad)
    with expect_device_stage():
        mt.TensorList([fake((3,))], chunk_elements=2**30)
    assert mt.CHUNK_ELEMENTS == _C.MULTI_TENSOR_CHUNK >= 1


def test_ops_need_tensor_lists():
    arrays = [fake((3,))]
    with pytest.raises(TypeError, match="params: expected a resnet_native.multi_tensor.TensorList"):
        mt.sgd_step(arrays, arrays, arrays, lr=0.1)
    with pytest.raises(TypeError, match="params: expected a resnet_native.multi_tensor.TensorList"):
        mt.adamw_step(arrays, arrays, arrays, arrays, lr=0.1, step=1)
    with pytest.raises(TypeError, match="grads: expected a resnet_native.multi_tensor.TensorList"):
        mt.check_finite(arrays, fake((1,), "int32"))
    with pytest.raises(TypeError, match="tensors: expected a resnet_native.multi_tensor.TensorList"):
        mt.zero_(arrays)
    with pytest.raises(TypeError, match="tensors: expected a resnet_native.multi_tensor.TensorList"):
        mt.scale_(arrays, 0.5)


def test_hyperparameters_are_checked_before_anything_runs():
    arrays = [fake((3,))]
    with pytest.raises(ValueError, match="nesterov: needs momentum > 0 and dampening == 0"):
        mt.sgd_step(arrays, arrays, arrays, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="nesterov: needs momentum > 0"):
        mt.sgd_step(arrays, arrays, None, lr=0.1, momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="momentum: expected a value >= 0"):
        mt.sgd_step(arrays, arrays, arrays, lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="beta2: expected a value in"):
        mt.adamw_step(arrays, arrays, arrays, arrays, lr=0.1, beta2=1.0, step=1)
    with pytest.raises(ValueError, match="step: expected the 1-based step number"):
        mt.adamw_step(arrays, arrays, arrays, arrays, lr=0.1, step=0)
    with pytest.raises(TypeError, match="step: expected a number"):
        mt.adamw_step(arrays, arrays, arrays, arrays, lr=0.1, step="one")


def test_found_inf_must_be_an_int32_device_array_of_one_element():
    # found_inf is checked (by the native core) before the lists, so plain lists show which found_inf passes.
    arrays = [fake((3,))]
    with pytest.raises(TypeError, match="found_inf: expected an int32 array"):
        mt.check_finite(arrays, fake((1,), "float32"))
    with pytest.raises(ValueError, match=r"found_inf: expected shape \(1,\), got \(2,\)"):
        mt.check_finite(arrays, fake((2,), "int32"))
    with pytest.raises(TypeError, match="found_inf: expected a CUDA array.*host memory"):
        mt.check_finite(arrays, np.zeros(1, np.int32))
    with pytest.raises(TypeError, match="found_inf: expected a cupy int32 array of shape"):
        mt.check_finite(arrays, None)
    with pytest.raises(TypeError, match="grads: expected a resnet_native.multi_tensor.TensorList"):
        mt.check_finite(arrays, fake((1,), "int32"))  # a good found_inf: on to the lists
    with pytest.raises(TypeError, match="found_inf: expected an int32 array"):
        mt.sgd_step(arrays, arrays, None, lr=0.1, momentum=0.0, found_inf=fake((1,), "float16"))
    with pytest.raises(TypeError, match="params: expected a resnet_native.multi_tensor.TensorList"):
        mt.sgd_step(arrays, arrays, None, lr=0.1, momentum=0.0, found_inf=None)  # None: no flag


def test_scalars_are_numbers_or_device_arrays():
    assert _C._testing.parse_scalar(3, "lr") == 3.0
    assert _C._testing.parse_scalar(np.float32(0.5), "lr") == 0.5
    assert _C._testing.parse_scalar(np.array(0.25), "lr") == 0.25  # host 0-d arrays are numbers
    device = fake((1,))
    assert _C._testing.parse_scalar(device, "lr") == device.ptr  # read by the kernel, on the device
    with pytest.raises(TypeError, match="lr: expected a number or a float32 device array"):
        _C._testing.parse_scalar("fast", "lr")
    with pytest.raises(TypeError, match="lr: expected a number .* got a bool"):
        _C._testing.parse_scalar(True, "lr")
    with pytest.raises(ValueError, match=r"lr: expected shape \(1,\)"):
        _C._testing.parse_scalar(fake((2,)), "lr")
    # The ops read their scalars the same way, before the lists.
    arrays = [fake((3,))]
    with pytest.raises(TypeError, match="lr: expected a number or a float32 device array"):
        mt.sgd_step(arrays, arrays, None, lr="fast", momentum=0.0)
    with pytest.raises(TypeError, match="factor: expected a number .* got a bool"):
        mt.scale_(arrays, True)
    with pytest.raises(TypeError, match="inv_scale: expected a float32 array, got float16"):
        mt.adamw_step(arrays, arrays, arrays, arrays, lr=0.1, step=1, inv_scale=fake((1,), "float16"))
