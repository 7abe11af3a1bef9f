"""Hypothesis strategies that damage a valid file, for tests/test_file_fuzz_cpu.py. Each draws (kind, bytes): kind
names the mutation ('bytes.flip', 'tree.replace', 'zip.field', ...) for the report, bytes are the damaged file.

Structural mutations edit the parsed file (a mapping, a pickled dict, the arrays of an .npz) and write it back with
the same writer, so the damage reaches the reader's checks rather than its parser; text mutations put tokens no
writer emits (5000-digit ints, lone surrogates, aliases, tags, deep nesting) where a value was; byte mutations
damage the bytes (truncated, flipped, inserted, deleted), near the header and the end more often than elsewhere.
"""

import ast
import io
import math
import re
import struct
import zipfile

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

DROP = object()  # replace_at: remove the node


def nested(depth: int, leaf=1):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


# Values that break a schema: wrong types, NaN, infinities, huge and negative numbers, long or odd strings.
SPECIAL = [None, True, False, 0, -1, 1, 2**31, 2**63, -2**63 - 1, 10**400, -10**400, 0.0, -0.0, 5e-324, 1e308,
           -1e308, math.nan, math.inf, -math.inf, "", "x" * 70_000, "\ud800", "\x00", "é", [], {}, [0.5] * 3,
           [[]], {"": None}, nested(100)]
_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
VALUES = st.one_of(st.sampled_from(SPECIAL), _LEAF,
                   st.recursive(_LEAF, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                                          max_size=4), max_leaves=10))
KEYS = st.text(max_size=8)
ARRAY_DTYPES = ["<f4", ">f8", "<f2", "|u1", "<i8", ">i4", "|b1", "<c16", "|V8", "<U3", "<M8[s]", "O", "<f4,<i2"]
ARRAY_SHAPES = [(), (0,), (3,), (2, 3), (1,) * 20, (0, 7), (4, 1, 1), (10, 3072)]


def _array(dtype, shape, fill):
    a = np.zeros(shape, np.dtype(dtype))
    if a.dtype.kind in "fc":
        a[...] = fill
    return a


ARRAYS = st.builds(_array, st.sampled_from(ARRAY_DTYPES), st.sampled_from(ARRAY_SHAPES),
                   st.sampled_from([0, 1, -1, math.nan, math.inf]))


# ---- structures --------------------------------------------------------------------------------------------------
def paths(obj, path=()):
    """Every node's path (keys and indexes from the root) in a nest of dicts, lists and tuples."""
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, path + (k,))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out += paths(v, path + (i,))
    return out


def node_at(obj, path):
    for key in path:
        obj = obj[key]
    return obj


def replace_at(obj, path, new):
    """A copy of obj with the node at path replaced by new (DROP: removed); only the containers on the path are
    copied."""
    if not path:
        return None if new is DROP else new
    out = dict(obj) if isinstance(obj, dict) else list(obj)
    if len(path) == 1 and new is DROP:
        del out[path[0]]
    else:
        out[path[0]] = replace_at(obj[path[0]], path[1:], new)
    return tuple(out) if isinstance(obj, tuple) else out


def retyped(v):
    """The same content as another type: a string in a list, a number as text, a list as a mapping..."""
    if isinstance(v, str):
        return [v]
    if v is None or isinstance(v, bool | int | float):
        return str(v)
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return list(v.values())
    if isinstance(v, list | tuple):
        return {str(i): x for i, x in enumerate(v)}
    return repr(v)


@st.composite
def tree_mutation(draw, obj, values=VALUES, keys=KEYS, skip=()):
    """(kind, obj damaged) by 1 to 3 edits of nodes (not under a top-level key in skip): a node dropped, replaced by
    a value of `values`, given an unknown key or item, retyped, or nested deeper."""
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        candidates = [p for p in paths(obj) if not (p and p[0] in skip)]
        path = draw(st.sampled_from(candidates))
        node, op = node_at(obj, path), draw(st.sampled_from(("drop", "replace", "add", "retype", "nest")))
        if op == "drop":
            new = DROP
        elif op == "replace":
            new = draw(values)
        elif op == "add" and isinstance(node, dict):
            new = {**node, draw(keys): draw(values)}
        elif op == "add":
            new = [*node, draw(values)] if isinstance(node, list) else [node, draw(values)]
        elif op == "retype":
            new = retyped(node)
        else:
            new = nested(draw(st.integers(1, 60)), node)
        obj = replace_at(obj, path, new)
        kinds.append(op)
    return f"tree.{kinds[0]}", obj


# ---- bytes and text ----------------------------------------------------------------------------------------------
SPECIAL_BYTES = [b"\x00", b"\xff" * 4, b"\x80", b"\xef\xbb\xbf", b"{", b"[" * 10_000, b"\n", b"'", b'"',
                 b"PK\x03\x04", b"\x93NUMPY", b"\xed\xa0\x80"]


@st.composite
def byte_mutation(draw, raw: bytes):
    n = len(raw)
    where = st.one_of(st.integers(0, min(n, 512)), st.integers(max(0, n - 512), n), st.integers(0, n))
    op = draw(st.sampled_from(("truncate", "flip", "insert", "delete", "overwrite", "repeat")))
    if op == "truncate":
        return "bytes.truncate", raw[:draw(st.integers(0, n - 1))]
    if op == "flip":
        out = bytearray(raw)
        for p in draw(st.lists(where, min_size=1, max_size=8)):
            out[min(p, n - 1)] ^= draw(st.integers(1, 255))
        return "bytes.flip", bytes(out)
    p, chunk = draw(where), draw(st.binary(min_size=1, max_size=32) | st.sampled_from(SPECIAL_BYTES))
    k = draw(st.integers(1, 64))
    return f"bytes.{op}", {"insert": raw[:p] + chunk + raw[p:], "delete": raw[:p] + raw[p + k:],
                           "overwrite": raw[:p] + chunk + raw[p + len(chunk):], "repeat": raw[:p + k] + raw[p:]}[op]


JSON_SCALAR = re.compile(r'-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|"(?:[^"\\]|\\.)*"|true|false|null')
JSON_TOKENS = ["1" * 5000, "-" + "9" * 400, "1e400", "-1E-400", "NaN", "-Infinity", '"\\ud800"', '"\\u0000"',
               "[" * 100_000 + "]" * 100_000, "{}", "[]", "0", "-0", "true", "null", '"' + "x" * 100_000 + '"',
               '{"a": 1, "a": 2}', "[1, 2", "}", "'x'"]
YAML_SCALAR = re.compile(r"(?<=: )[^\n]*\S|(?<=- )[^\n]*\S")
YAML_TOKENS = ["&a 1", "*a", "&a [1]", "!!python/object/apply:os.system ['true']", "!!binary aGk=", "!custom x",
               "!!str 1", "!!float x", "!!int 1.5", "2001-02-30", "2001-02-03", "2001-02-03 25:00:00", "1" * 5000,
               "0x" + "f" * 5000, "0b" + "1" * 20_000, "1:2:3", ".nan", "-.inf", "1e400", "[" * 10_000 + "]" * 10_000,
               "{a: 1, a: 2}", '"\\ud800"', '"\\x00"', "~", "{<<: {x: 1}}", "x" * 100_000, "'unterminated", "@", "%",
               "\t1", "[1, 2", "? [a]\n: 1", "|\n   block", ">-"]


@st.composite
def token_mutation(draw, raw: bytes, pattern, tokens, kind: str):
    """A scalar of the text (found by pattern) replaced by one of tokens or a few random characters."""
    text = raw.decode("utf-8")
    a, b = draw(st.sampled_from([m.span() for m in pattern.finditer(text)]))
    token = draw(st.sampled_from(tokens) | st.text(max_size=8))
    return kind, (text[:a] + token + text[b:]).encode("utf-8", "surrogatepass")


# ---- zip archives and .npy members -------------------------------------------------------------------------------
# Fields of the zip structures a reader trusts: (offset from the signature, struct format).
ZIP_FIELDS = {b"PK\x03\x04": ((6, "H"), (8, "H"), (18, "I"), (22, "I"), (26, "H"), (28, "H")),
              b"PK\x01\x02": ((8, "H"), (10, "H"), (20, "I"), (24, "I"), (28, "H"), (30, "H"), (42, "I")),
              b"PK\x05\x06": ((8, "H"), (10, "H"), (12, "I"), (16, "I"), (20, "H"))}
# Flags (1: encrypted, 0x800: UTF-8 names), compression methods (8 deflate, 12 bzip2, 14 LZMA, 93 zstd, 99 AES).
FIELD_VALUES = (0, 1, 8, 9, 12, 14, 93, 99, 0x800, 0xFFFF, 0xFFFFFFFF)


@st.composite
def zip_field(draw, raw: bytes):
    spots = [(i + off, fmt) for sig, fields in ZIP_FIELDS.items() for i in _find_all(raw, sig)
             for off, fmt in fields if i + off + struct.calcsize(fmt) <= len(raw)]
    at, fmt = draw(st.sampled_from(spots))
    limit = (1 << (8 * struct.calcsize(fmt))) - 1
    value = draw(st.sampled_from([v for v in FIELD_VALUES if v <= limit]) | st.integers(0, limit))
    return "zip.field", raw[:at] + struct.pack("<" + fmt, value) + raw[at + struct.calcsize(fmt):]


def _find_all(raw: bytes, sig: bytes):
    i = raw.find(sig)
    while i >= 0:
        yield i
        i = raw.find(sig, i + 1)


def zip_members(raw: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def zip_of(members: dict) -> bytes:
    """A zip archive of stored members, as np.savez writes (CRCs right: the damage is in the content)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out.getvalue()


NPY_DESCR = ["'|O'", "'<f8'", "'>i4'", "'|V0'", "'<U0'", "'|b1'", "'<M8[s]'", "'garbage'", "[('a', '<f4')]",
             "('<f4', (100000, 100000))", "[('a', '|O')]", "1", "None"]
NPY_SHAPES = ["()", "(0,)", "(-1,)", f"({2**62},)", f"({2**31}, {2**31})", "(" + "1, " * 64 + ")", "(1, 2", "None",
              "(1.5,)", "('a',)", "[3]", "(True,)"]


@st.composite
def npy_header(draw, raw: bytes):
    """One member's .npy header rewritten: its dtype, shape or order replaced, its text garbled, its version
    changed; the data after it and every CRC kept right."""
    members = zip_members(raw)
    name = draw(st.sampled_from(sorted(members)))
    data = members[name]
    size = struct.unpack("<H", data[8:10])[0]
    d = ast.literal_eval(data[10:10 + size].decode("latin1"))
    fields = {"descr": repr(d["descr"]), "fortran_order": repr(d["fortran_order"]), "shape": repr(d["shape"])}
    field = draw(st.sampled_from(("descr", "fortran_order", "shape", "text")))
    choices = {"descr": NPY_DESCR, "fortran_order": ["True", "'x'", "1"], "shape": NPY_SHAPES}
    if field == "text":
        header = draw(st.text(max_size=60) | st.sampled_from(["{}", "{'descr': '<f4'}", "[" * 5000]))
    else:
        fields[field] = draw(st.sampled_from(choices[field]))
        header = "{" + "".join(f"'{k}': {v}, " for k, v in fields.items()) + "}"
    major = draw(st.sampled_from([1, 1, 2, 3, 9]))
    text = (header + "\n").encode("utf-8" if major == 3 else "latin1", "replace")
    length = struct.pack("<H" if major == 1 else "<I", len(text) % (1 << (16 if major == 1 else 32)))
    members[name] = b"\x93NUMPY" + bytes([major, 0]) + length + text + data[10 + size:]
    return f"npy.{field}", zip_of(members)


@st.composite
def npz_arrays(draw, raw: bytes, values=ARRAYS):
    """The archive's arrays as np.savez writes them, one to three dropped, replaced (other dtypes and shapes, Python
    objects, NaN), added or retyped."""
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    kind, arrays = draw(tree_mutation(arrays, values=values, keys=st.text(min_size=1, max_size=8)))
    assume(isinstance(arrays, dict) and arrays)
    out = io.BytesIO()
    try:
        np.savez(out, **{str(k): v for k, v in arrays.items()})
    except (TypeError, ValueError, RuntimeError):  # ragged lists, more than 32 dimensions: nothing np.savez writes
        assume(False)
    return f"npz.{kind}", out.getvalue()


def npz_damage(raw: bytes):
    return st.one_of(byte_mutation(raw), zip_field(raw), npy_header(raw), npz_arrays(raw))
