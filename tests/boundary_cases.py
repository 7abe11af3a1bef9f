"""What the boundary fuzz (test_boundary_fuzz_cpu.py) generates: hypothesis strategies that start from a description
an argument accepts and break it (__cuda_array_interface__ dicts, DLPack producers, plain Python values)."""

import inspect
import re

import numpy as np
from fake_arrays import (
    FLAG_IS_COPIED,
    FLAG_READ_ONLY,
    KDL_CPU,
    KDL_CUDA,
    KDL_CUDA_HOST,
    KDL_CUDA_MANAGED,
    FakeCudaArray,
    FakeDLPackArray,
    fake,
    next_address,
)
from hypothesis import strategies as st


class ProducerError(Exception):
    """Raised by a producer's own __dlpack__ / __dlpack_device__: must reach the caller unchanged."""



# ---- what is generated ----------------------------------------------------------------------------------------
# Strategies are built once (per argument where they depend on it): hypothesis spends most of its time validating
# strategies that are built anew on every draw.
KNOWN_KEYS = ("shape", "typestr", "data", "version", "strides", "mask", "descr", "stream")
REQUIRED_KEYS = ("shape", "typestr", "data", "version")
INT64_MAX = 2**63 - 1
ADDRESS_END = 2**64

JUNK = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=4), st.binary(max_size=4),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
                 st.complex_numbers(), st.just(object()))
NOT_NONE_JUNK = JUNK.filter(lambda v: v is not None)
# Unknown interface keys; never one of FakeCudaArray's own parameters (hypothesis also draws the strings it finds in
# this module, "dtype" among them).
FAKE_PARAMETERS = frozenset(inspect.signature(FakeCudaArray).parameters)
EXTRA_KEYS = st.lists(st.text(max_size=6).filter(lambda k: k not in KNOWN_KEYS and k not in FAKE_PARAMETERS),
                      max_size=2)
STREAM = st.one_of(st.none(), st.integers(1, 2**32))
GOOD_VERSION = st.integers(0, 3)
BAD_VERSION = st.one_of(st.integers(4, 2**70), st.integers(-(2**70), -1), st.booleans(), st.floats(),
                        st.text(max_size=2), st.none(), st.just(np.int64(3)), st.just([3]))
NOT_A_DICT = st.one_of(st.lists(st.tuples(st.sampled_from(KNOWN_KEYS), st.integers()), max_size=3),
                       st.tuples(st.integers()), st.text(max_size=3), st.integers(), st.floats(), st.binary(max_size=3),
                       st.just(True), st.sets(st.integers(), max_size=2))
TYPESTR_TEXT = st.one_of(
    st.sampled_from(["<f8", "<f16", "<i8", "<i1", "|b1", "<c8", "<u4", "<u8", "|u1", "|i1", "<f2", "<u2", "<i2", "<V2",
                     "<V4", "<i4", "<f4", ">f4", ">f2", ">u2", ">i4", "=f8", "|f8", "<f0", "<f4 ", "<f04", "<f4x",
                     "f4", "<f", "", "<", "float32", "<F4", "<d4", "<f4\x00", "<f999999999"]),
    st.text(max_size=6),
    st.builds(lambda e, k, n: e + k + n, st.sampled_from("<>|=!"), st.sampled_from("fiuVcbOSUmM?"),
              st.sampled_from(["0", "1", "2", "4", "8", "16", "02", "4a", ""])),
    # text that is not UTF-8 (a lone surrogate) anywhere in an otherwise good typestr
    st.builds(lambda good, at, c: good[:at] + c + good[at:], st.sampled_from(["<f4", "<i4", "|u1"]),
              st.integers(0, 3), st.integers(0xD800, 0xDFFF).map(chr)),
)
TYPESTR_NOT_STR = st.one_of(st.binary(max_size=3), st.integers(), st.none(), st.just(np.dtype("float32")),
                            st.just(["<f4"]))
NON_INT_ENTRY = st.one_of(st.floats(), st.booleans(), st.text(max_size=2), st.none(),
                          st.lists(st.integers(1, 3), max_size=2), st.just(np.float32(2.0)), st.complex_numbers())
NOT_A_SEQUENCE = st.one_of(st.integers(), st.floats(), st.text(max_size=4), st.binary(max_size=4), st.just(None),
                           st.dictionaries(st.integers(), st.integers(), max_size=2),
                           st.frozensets(st.integers(1, 4), max_size=3))
NOT_A_STRIDES_SEQUENCE = st.one_of(st.integers(), st.text(min_size=1, max_size=3), st.floats(),
                                   st.binary(min_size=1, max_size=3))
SEQUENCE_TYPE = st.sampled_from([tuple, list])
NEGATIVE = st.integers(-(2**70), -1)
BEYOND_INT64 = st.one_of(st.integers(2**63, 2**70), st.integers(-(2**70), -(2**63) - 1))
BIG_DIM = st.integers(2**32, 2**62)
NON_CUDA_TYPE = st.one_of(st.sampled_from([KDL_CPU, KDL_CUDA_HOST, 0, 4, 7, 14, -1]),
                          st.integers(-(2**31), 2**31 - 1).filter(lambda v: v not in (2, 13)))
BAD_DEVICE_ANSWER = st.one_of(
    st.tuples(st.just(KDL_CUDA), st.integers(-(2**31), -1)),  # a negative device id
    st.tuples(st.just(KDL_CUDA), st.integers(2**31, 2**62)),
    st.tuples(st.integers(2**63, 2**70), st.integers(0, 3)),
    st.tuples(st.just(KDL_CUDA), st.integers(2**63, 2**70)),
    st.tuples(st.booleans(), st.integers(0, 3)),
    st.tuples(st.floats(), st.integers(0, 3)),
    st.tuples(st.just(KDL_CUDA)), st.tuples(st.just(KDL_CUDA), st.just(0), st.just(0)),
    st.lists(st.integers(0, 3), max_size=3), st.none(), st.text(max_size=4), st.integers())
# The low 32 bits name a CUDA device: nothing may truncate the device type to int32.
WRAPPING_DEVICE_TYPE = st.builds(lambda v, k: v + k * 2**32, st.sampled_from([KDL_CUDA, KDL_CUDA_MANAGED]),
                                 st.sampled_from([1, 2, -1, -2, 2**30]))
DLPACK_DTYPES = {"float64": "f8", "float32": "f4", "float16": "f2", "bfloat16": "bf16", "int8": "i1", "uint8": "u1",
                 "int16": "i2", "uint16": "u2", "int32": "i4", "int64": "i8", "uint32": "u4", "uint64": "u8",
                 "bool": "b1"}


def contiguous_strides(shape, itemsize):
    strides, s = [], itemsize
    for n in reversed(shape):
        strides.append(s)
        s *= n
    return tuple(reversed(strides))


def _kind_of_typestr(typestr):
    """The element kind the native parser reads from a typestr, or None when it refuses it as a typestr."""
    if len(typestr) < 3 or typestr[0] not in "<>|=" or not typestr[2].isascii() or not typestr[2].isdigit():
        return None
    if typestr[0] == ">" and int(re.match(r"[0-9]+", typestr[2:]).group()[:6]) > 1:
        return None  # big-endian
    return typestr[1:]


class DeviceOverride(FakeDLPackArray):
    """A DLPack producer whose __dlpack_device__ answers something of its own."""

    def __init__(self, answer, *args, **kw):
        super().__init__(*args, **kw)
        self.answer = answer

    def __dlpack_device__(self):
        return self.answer


class RaisingProducer(FakeDLPackArray):
    def __init__(self, where, *args, **kw):
        super().__init__(*args, **kw)
        self.where = where

    def __dlpack_device__(self):
        if self.where == "device":
            raise ProducerError("__dlpack_device__ failed")
        return super().__dlpack_device__()

    def __dlpack__(self, **kwargs):
        raise ProducerError("__dlpack__ failed")


class InterfaceRaises:
    """__cuda_array_interface__ raises: as with hasattr, the object then has none."""

    @property
    def __cuda_array_interface__(self):
        raise ProducerError("no interface today")


class DLPackWithoutDevice:
    def __dlpack__(self, **kwargs):
        return FakeDLPackArray((2,)).__dlpack__(**kwargs)


class Pieces:
    """The strategies of one argument, built once."""

    def __init__(self, target):
        self.target = target
        self.n = len(target.shape)
        self.itemsize = np.dtype(target.dtype).itemsize
        self.nbytes = int(np.prod(target.shape)) * self.itemsize
        self.index = st.integers(0, self.n - 1)
        self.wide = [i for i, size in enumerate(target.shape) if size > 1]
        self.wide_index = st.sampled_from(self.wide) if self.wide else None
        self.misalign = st.integers(1, self.itemsize - 1) if self.itemsize > 1 else None  # bytes are never misaligned
        misaligned = ["misaligned"] if self.itemsize > 1 else []
        self.elements_below = st.integers(1, max(1, self.nbytes // self.itemsize - 1))
        self.strides_length = st.integers(0, 9).filter(lambda k, n=self.n: k != n)
        self.small_ints = st.integers(-64, 64)
        self.wrong_stride = st.integers(-(2**40), 2**40)
        self.cai_faults = st.sampled_from(["drop", "version", "typestr", "shape", "strides", "data", "mask",
                                           "not_a_dict"])
        self.shape_faults = st.sampled_from(["negative", "zero", "overflow", "entry_too_big", "non_int",
                                             "not_a_sequence", "too_many_dims", "zero_d"])
        self.strides_faults = st.sampled_from(["length", "non_int", "not_a_sequence", "entry_too_big"]
                                              + (["not_contiguous"] if self.wide else []))
        self.data_faults = st.sampled_from(["not_a_tuple", "length", "pointer_type", "read_only_type", "null",
                                            "negative", "beyond_64_bits", "wraps"] + misaligned
                                           + (["read_only"] if target.writable else []))
        self.not_a_sequence = st.one_of(NOT_A_SEQUENCE, st.just(np.array(target.shape)))
        self.many_dims = st.integers(9, 40)
        self.drop_key = st.sampled_from(REQUIRED_KEYS)
        self.typestr = st.one_of(TYPESTR_TEXT, TYPESTR_NOT_STR)
        dlpack = ["null_shape", "negative_ndim", "huge_ndim", "negative_dim", "zero_dim", "overflow", "zero_d",
                  "null_data", "wrapping_offset", "past_the_end", "lanes", "dtype", "device", "device_type_wraps",
                  "device_answer", "capsule_device", "consumed", "version", "producer_raises"]
        dlpack += ["strides"] if self.wide else []
        dlpack += [f"{m}_{what}" for m in misaligned for what in ("data", "offset")]
        dlpack += ["read_only", "copied"] if target.writable else []
        self.dlpack_faults = st.sampled_from(dlpack)
        self.wrong_dlpack_dtype = st.sampled_from(sorted(k for k, v in DLPACK_DTYPES.items()
                                                         if v not in target.dlpack_kinds()))
        plain = [st.booleans(), st.text(max_size=8), st.binary(max_size=8), st.complex_numbers(),
                 st.lists(st.recursive(st.one_of(st.integers(), st.floats(), st.text(max_size=2), st.none()),
                                       lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner),
                                       max_leaves=6), max_size=3),  # nested lists (never a bare leaf)
                 st.dictionaries(st.sampled_from(KNOWN_KEYS), JUNK, max_size=4),
                 st.frozensets(st.integers(), max_size=3), st.just(object()), st.just(InterfaceRaises()),
                 st.just(DLPackWithoutDevice())]
        if not target.host_dispatch:  # a host array where the op would take its host reference instead
            plain.append(st.just(np.zeros(target.shape, target.dtype)))
        if not target.number_ok:
            plain.append(st.one_of(st.integers(), st.floats(), st.just(np.float32(1.5)), st.just(np.int64(2))))
        if not target.optional:
            plain.append(st.none())
        self.plain = st.one_of(plain)
        kinds = [plain_case(self), cai_case(self)] if target.table else [
            cai_case(self), cai_case(self), dlpack_case(self), plain_case(self)]
        self.all = st.one_of(kinds)
        self.wrap = st.integers(0, 3)  # how a TensorList's `arrays` holds the value


@st.composite
def bad_typestr(draw, p):
    """A typestr the argument must refuse (its kind is not one it takes, or it is no typestr at all)."""
    candidate = draw(p.typestr)
    if isinstance(candidate, str):
        kind = _kind_of_typestr(candidate)
        if kind is not None and kind in p.target.accepted:
            if int(kind[1:]) > 1:
                candidate = ">" + candidate[1:]  # the same kind, big-endian
            else:  # a byte has no byte order ('>u1' is a good uint8): another one-byte kind the argument refuses
                candidate = candidate[0] + next(k for k in ("i1", "u1", "b1") if k not in p.target.accepted)
    return candidate


def bad_shape(draw, p):
    """(kind of fault, a 'shape' field no array can have)."""
    choice = draw(p.shape_faults)
    shape = list(p.target.shape)
    if choice == "negative":
        shape[draw(p.index)] = draw(NEGATIVE)
    elif choice == "zero":
        shape[draw(p.index)] = 0
    elif choice == "overflow":  # every entry fits int64, the byte count does not
        big = draw(BIG_DIM)
        shape = [big, big] + shape[2:]
    elif choice == "entry_too_big":
        shape[draw(p.index)] = draw(BEYOND_INT64)
    elif choice == "non_int":
        shape[draw(p.index)] = draw(NON_INT_ENTRY)
    elif choice == "not_a_sequence":
        return choice, draw(p.not_a_sequence)
    elif choice == "too_many_dims":
        shape = [1] * draw(p.many_dims)
    else:
        shape = []
    return choice, draw(SEQUENCE_TYPE)(shape)


def bad_strides(draw, p):
    """(kind of fault, a 'strides' field the argument must refuse: wrong length or type, not C-contiguous)."""
    good = list(contiguous_strides(p.target.shape, p.itemsize))
    choice = draw(p.strides_faults)
    if choice == "length":
        return choice, tuple(draw(p.small_ints) for _ in range(draw(p.strides_length)))
    if choice == "non_int":
        good[draw(p.index)] = draw(NON_INT_ENTRY.filter(lambda v: v is not None and not isinstance(v, list)))
        return choice, tuple(good)
    if choice == "not_a_sequence":
        return choice, draw(NOT_A_STRIDES_SEQUENCE)
    if choice == "entry_too_big":
        good[draw(p.index)] = draw(BEYOND_INT64)
        return choice, tuple(good)
    i = draw(p.wide_index)
    value = draw(p.wrong_stride)
    good[i] = value if value != good[i] else -value - 1
    return choice, tuple(good)


def bad_data(draw, p):
    """(kind of fault, a 'data' field the argument must refuse)."""
    ptr = next_address()
    choice = draw(p.data_faults)
    if choice == "not_a_tuple":
        value = draw(st.sampled_from([[ptr, False], ptr, None, "0x10", {"ptr": ptr}]))
    elif choice == "length":
        value = draw(st.sampled_from([(), (ptr,), (ptr, False, 0), (ptr, False, None, 1)]))
    elif choice == "pointer_type":
        value = (draw(st.sampled_from([float(ptr), True, str(ptr), None, np.uint64(ptr), b"\x00"])), False)
    elif choice == "read_only_type":
        value = (ptr, draw(st.sampled_from([0, 1, None, "False", 0.0, np.bool_(False)])))
    elif choice == "null":
        value = (0, False)
    elif choice == "negative":
        value = (draw(NEGATIVE), False)
    elif choice == "beyond_64_bits":
        value = (draw(st.integers(2**64, 2**80)), False)
    elif choice == "misaligned":
        value = (ptr + draw(p.misalign), False)
    elif choice == "wraps":  # aligned, but ptr + nbytes is past 2**64
        value = (ADDRESS_END - draw(p.elements_below) * p.itemsize, False)
    else:
        value = (ptr, True)
    return choice, value


@st.composite
def cai_case(draw, p):
    """(kind, an object with a malformed __cuda_array_interface__)."""
    target = p.target
    fault = draw(p.cai_faults)
    fields, drop = {}, ()
    if fault == "drop":
        key = draw(p.drop_key)
        drop, kind = (key,), f"cai.drop.{key}"
    elif fault == "version":
        fields["version"], kind = draw(BAD_VERSION), "cai.version"
    elif fault == "typestr":
        fields["typestr"], kind = draw(bad_typestr(p)), "cai.typestr"
    elif fault == "shape":
        sub, fields["shape"] = bad_shape(draw, p)
        kind = f"cai.shape.{sub}"
    elif fault == "strides":
        sub, fields["strides"] = bad_strides(draw, p)
        kind = f"cai.strides.{sub}"
    elif fault == "data":
        sub, fields["data"] = bad_data(draw, p)
        kind = f"cai.data.{sub}"
    elif fault == "mask":
        fields["mask"], kind = draw(NOT_NONE_JUNK), "cai.mask"
    else:
        obj = FakeCudaArray(target.shape, target.dtype)
        obj.__cuda_array_interface__ = draw(NOT_A_DICT)
        return "cai.not_a_dict", obj
    if fault != "version":
        fields.setdefault("version", draw(GOOD_VERSION))
    # Noise that changes nothing: unknown keys, a stream.
    for extra in draw(EXTRA_KEYS):
        fields[extra] = draw(JUNK)
    if draw(st.booleans()):
        fields.setdefault("stream", draw(STREAM))
    return kind, FakeCudaArray(target.shape, target.dtype, drop=drop, **fields)


@st.composite
def dlpack_case(draw, p):
    """(kind, a DLPack producer the argument must refuse)."""
    target = p.target
    shape, dtype, itemsize = target.shape, target.dtype, p.itemsize
    fault = draw(p.dlpack_faults)
    kind = f"dlpack.{fault}"
    kw = {}
    if fault == "null_shape":
        return kind, FakeDLPackArray(None, dtype, ndim=draw(st.integers(1, 8)))
    if fault == "negative_ndim":
        kw["ndim"] = draw(st.integers(-(2**31), -1))
    elif fault == "huge_ndim":
        kw["ndim"] = draw(st.integers(9, 2**31 - 1))
    elif fault in ("negative_dim", "zero_dim"):
        dims = list(shape)
        dims[draw(p.index)] = 0 if fault == "zero_dim" else draw(st.integers(-(2**63), -1))
        shape = tuple(dims)
    elif fault == "overflow":
        big = draw(st.integers(2**32, INT64_MAX))
        shape = (big, big) + tuple(shape[2:])
    elif fault == "zero_d":
        shape = ()
    elif fault == "null_data":
        kw["data"], kw["byte_offset"] = None, draw(st.sampled_from([0, itemsize, 4096]))
    elif fault == "misaligned_data":
        kw["ptr"] = next_address() + draw(p.misalign)
    elif fault == "misaligned_offset":
        kw["byte_offset"] = draw(st.integers(0, 2**20)) * itemsize + draw(p.misalign)
    elif fault == "wrapping_offset":
        kw["byte_offset"] = draw(st.integers(ADDRESS_END - 2**40, ADDRESS_END - 1))
    elif fault == "past_the_end":  # aligned and in range, but the array runs past 2**64
        base = next_address()
        kw["ptr"], kw["byte_offset"] = base, ADDRESS_END - draw(p.elements_below) * itemsize - base
    elif fault == "lanes":
        kw["lanes"] = draw(st.sampled_from([0, 2, 3, 4, 8, 65535]))
    elif fault == "dtype":
        return kind, FakeDLPackArray(shape, draw(p.wrong_dlpack_dtype))
    elif fault == "strides":
        strides = list(contiguous_strides(shape, 1))
        i = draw(p.wide_index)
        value = draw(p.wrong_stride)
        strides[i] = value if value != strides[i] else -value - 1
        kw["strides"] = tuple(strides)
    elif fault == "device":
        kw["device"], kw["capsule_device"] = (draw(NON_CUDA_TYPE), draw(st.integers(0, 7))), (KDL_CUDA, 0)
    elif fault == "device_type_wraps":
        return kind, DeviceOverride((draw(WRAPPING_DEVICE_TYPE), draw(st.integers(0, 3))), shape, dtype)
    elif fault == "device_answer":
        return kind, DeviceOverride(draw(BAD_DEVICE_ANSWER), shape, dtype)
    elif fault == "capsule_device":
        kw["capsule_device"] = (draw(NON_CUDA_TYPE), 0)
    elif fault == "consumed":
        kw["capsule_name"] = "used_dltensor"
    elif fault == "version":
        kw["always_versioned"] = True
        kw["version"] = (draw(st.one_of(st.just(0), st.integers(2, 2**32 - 1))), draw(st.integers(0, 2**32 - 1)))
    elif fault == "producer_raises":
        return kind, RaisingProducer(draw(st.sampled_from(["device", "capsule"])), shape, dtype)
    elif fault == "read_only":
        kw.update(versioned=True, flags=FLAG_READ_ONLY | draw(st.sampled_from([0, 4, 1 << 40])))
    else:
        kw.update(versioned=True, flags=FLAG_IS_COPIED | draw(st.sampled_from([0, FLAG_READ_ONLY, 1 << 40])))
    if fault not in ("version", "read_only", "copied") and draw(st.booleans()):
        kw["versioned"] = True
    return kind, FakeDLPackArray(shape, dtype, **kw)


@st.composite
def plain_case(draw, p):
    """(kind, a value that is no array description at all)."""
    value = draw(p.plain)
    if p.target.name == "arrays" and isinstance(value, list | tuple | dict | frozenset):
        value = [fake((3,)), object()]  # an iterable of arrays: one entry is not an array
    return f"plain.{type(value).__name__}", value


_PIECES = {}


@st.composite
def malformed(draw, target):
    """(kind, a value the argument must refuse)."""
    p = _PIECES.get(target.label)
    if p is None:
        p = _PIECES[target.label] = Pieces(target)
    kind, value = draw(p.all)
    if target.name == "arrays" and not kind.startswith("plain"):
        value = [value, [value], [fake((3,)), value], (fake((3,)), value)][draw(p.wrap)]
    return kind, value

