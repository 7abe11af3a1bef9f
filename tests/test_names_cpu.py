"""The Python name table (resnet_native/names.py) and the native core's typed enums agree."""

import numpy as np
import pytest

import resnet_native as rn
from resnet_native._core import names


def test_native_enums_carry_the_python_names():
    assert tuple(rn._C.Precision.__members__) == names.CONV_PRECISIONS
    assert tuple(rn._C.DType.__members__) == names.DTYPES
    assert tuple(rn._C.Layout.__members__) == names.LAYOUTS


def test_every_precision_has_a_storage_dtype_and_every_alias_a_dtype():
    assert set(names.PRECISION_STORAGE) == set(names.PRECISIONS)
    assert set(names.DTYPE_ALIASES.values()) == set(names.DTYPES)
    assert names.canonical_dtype("float16") == "fp16"
    assert names.canonical_dtype("tf32") == "fp32"


def test_whole_number_refuses_bools_floats_and_strings_with_a_type_error():
    assert names.whole_number("n", 3) == 3 and type(names.whole_number("n", np.int64(3))) is int
    assert names.whole_number("n", -5) == -5  # no minimum: any int
    for bad in (True, np.bool_(False), 3.0, "3", None):
        with pytest.raises(TypeError, match=r"^n: expected an int(, | >= 1, )got "):
            names.whole_number("n", bad, 1 if bad is None else None)
    with pytest.raises(ValueError, match=r"^n: expected an int >= 1, got 0$"):
        names.whole_number("n", 0, 1)


def test_bounded_int_keeps_its_messages():
    assert names.bounded_int("capacity", np.int32(4), 1, 8, "entries") == 4
    with pytest.raises(TypeError, match=r"^capacity: expected an int number of entries, got True$"):
        names.bounded_int("capacity", True, 1, 8, "entries")
    with pytest.raises(ValueError, match=r"^capacity: expected a number of entries between 1 and 8, got 9$"):
        names.bounded_int("capacity", 9, 1, 8, "entries")


def test_whole_numbers_takes_an_int_or_a_sequence():
    assert names.whole_numbers("stride", 2, 1, count=2) == (2, 2)
    assert names.whole_numbers("sizes", 4, 1) == (4,)
    assert names.whole_numbers("sizes", [8, np.int64(1)], 1) == (8, 1)
    assert names.whole_numbers("sizes", np.array([2, 3])) == (2, 3)
    with pytest.raises(TypeError, match=r"^stride: expected an int or a pair of ints, got 1.5$"):
        names.whole_numbers("stride", 1.5, 1, count=2)
    with pytest.raises(TypeError, match=r"^sizes: expected an int or a sequence of ints, got '12'$"):
        names.whole_numbers("sizes", "12")
    with pytest.raises(ValueError, match=r"^stride: expected a pair of ints, got \(1, 1, 1\)$"):
        names.whole_numbers("stride", (1, 1, 1), count=2)
    with pytest.raises(ValueError, match=r"^sizes: expected a non-empty sequence of ints, got \(\)$"):
        names.whole_numbers("sizes", ())
    with pytest.raises(TypeError, match=r"^stride\[1\]: expected an int >= 1, got True$"):
        names.whole_numbers("stride", (1, True), 1, count=2)
    with pytest.raises(ValueError, match=r"^padding\[0\]: expected an int >= 0, got -1$"):
        names.whole_numbers("padding", (-1, 0), 0, count=2)


def test_flag_takes_python_and_numpy_bools_only():
    assert names.flag("split", True) is True and names.flag("split", np.bool_(False)) is False
    for bad in (1, 0, None, "yes", 1.0):
        with pytest.raises(TypeError, match=r"^split: expected True or False, got "):
            names.flag("split", bad)


def test_precision_is_the_one_name_and_dtype_a_deprecated_alias():
    from resnet_native._core.names import precision_argument

    assert precision_argument("Engine", "bf16", None, default="fp16") == "bf16"
    with pytest.warns(DeprecationWarning, match=r"Engine\(dtype=...\) is deprecated: the argument is now precision="):
        assert precision_argument("Engine", "fp16", "int8", default="fp16") == "int8"
    with pytest.raises(TypeError, match="give precision= only"):
        precision_argument("Engine", "bf16", "int8", default="fp16")
