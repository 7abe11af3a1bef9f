"""The Python name table (resnet_native/names.py) and the native core's typed enums agree."""

import resnet_native as rn
from resnet_native import names


def test_native_enums_carry_the_python_names():
    assert tuple(rn._C.Precision.__members__) == names.PRECISIONS
    assert tuple(rn._C.DType.__members__) == names.DTYPES
    assert tuple(rn._C.Layout.__members__) == names.LAYOUTS


def test_every_precision_has_a_storage_dtype_and_every_alias_a_dtype():
    assert set(names.PRECISION_STORAGE) == set(names.PRECISIONS)
    assert set(names.DTYPE_ALIASES.values()) == set(names.DTYPES)
    assert names.canonical_dtype("float16") == "fp16"
    assert names.canonical_dtype("tf32") == "fp32"
