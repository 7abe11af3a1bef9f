"""FP8 E4M3FN on the host: all 256 codes against a table built from the bit definition, nearest rounding with ties
to even for every float16 and every midpoint, saturation at 448, NaN; ml_dtypes cross-check when installed."""

from fractions import Fraction

import numpy as np
import pytest

from resnet_native.quantization.fp8 import (
    E4M3_MAX,
    decode_e4m3,
    dequantize_fp8,
    encode_e4m3,
    fake_quantize_fp8,
    fp8_scale,
    quantize_fp8,
)


def definition_table() -> list:
    """The value of each code from the bit definition (exact Fractions; None for NaN)."""
    table = []
    for code in range(256):
        s, e, m = code >> 7, (code >> 3) & 15, code & 7
        if e == 15 and m == 7:
            table.append(None)
            continue
        v = Fraction(m, 8) * Fraction(1, 2**6) if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
        table.append(-v if s else v)
    return table


TABLE = definition_table()
FINITE = np.array([c for c in range(128) if TABLE[c] is not None])  # non-negative finite codes, increasing value


def test_all_256_codes_decode_to_the_definition():
    values = decode_e4m3(np.arange(256, dtype=np.uint8))
    for code, expected in enumerate(TABLE):
        if expected is None:
            assert np.isnan(values[code]), hex(code)
        else:
            assert Fraction(float(values[code])) == expected, hex(code)
            assert np.signbit(values[code]) == bool(code & 0x80)
    assert values[0x7E] == E4M3_MAX == 448 and values[1] == 2.0**-9 and np.isnan(values[[0x7F, 0xFF]]).all()


def test_every_code_encodes_to_itself():
    codes = np.array([c for c in range(256) if TABLE[c] is not None], np.uint8)
    assert np.array_equal(encode_e4m3(decode_e4m3(codes)), codes)


def _nearest(a: np.ndarray) -> np.ndarray:
    """Brute force: the non-negative code nearest |a|, ties to the even code, saturating at 448."""
    values = np.array([float(TABLE[c]) for c in FINITE])
    d = np.abs(np.minimum(a, E4M3_MAX)[:, None] - values[None, :])
    best = d.min(axis=1, keepdims=True)
    tied = d == best
    even = tied & (FINITE[None, :] % 2 == 0)
    return FINITE[np.where(even.any(axis=1), even.argmax(axis=1), tied.argmax(axis=1))]


def test_every_float16_and_every_midpoint_rounds_to_the_nearest_code():
    halves = np.arange(1 << 15, dtype=np.uint16).view(np.float16).astype(np.float64)
    halves = halves[np.isfinite(halves)]
    values = np.array([float(TABLE[c]) for c in FINITE])
    mids = (values[1:] + values[:-1]) / 2
    probes = np.concatenate([halves, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf),
                             [448.0, 463.99, 464.0, 500.0, 1e30]])
    assert np.array_equal(encode_e4m3(probes), _nearest(probes))
    assert np.array_equal(encode_e4m3(-probes), _nearest(probes) | 0x80)


def test_ties_go_to_the_even_code():
    # 1 + 1/16 lies halfway between 1 (0x38) and 1.125 (0x39); 1 + 3/16 between 1.125 and 1.25 (0x3A).
    assert encode_e4m3(np.array([1 + 1 / 16, 1 + 3 / 16, 2.0**-10, 3 * 2.0**-10])).tolist() == [0x38, 0x3A, 0, 2]


def test_saturation_nan_and_signed_zero():
    codes = encode_e4m3(np.array([449.0, 1e6, np.inf, -np.inf, -1e6, np.nan, -0.0, -1e-9]))
    assert codes.tolist() == [0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x7F, 0x80, 0x80]
    with pytest.raises(TypeError, match="codes: expected a uint8"):
        decode_e4m3(np.zeros(2, np.int8))


def test_ml_dtypes_agrees_where_installed(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    codes = np.arange(256, dtype=np.uint8)
    theirs = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert np.array_equal(decode_e4m3(codes), theirs, equal_nan=True)
    # ml_dtypes converts without saturating (NaN past 464): compare inside the finite range.
    x = np.concatenate([rng.standard_normal(100_000) * 40, rng.uniform(-463.9, 463.9, 10_000), rng.laplace(size=1000)])
    assert np.array_equal(encode_e4m3(x), x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def test_fp8_scaling_per_tensor_and_per_channel(rng):
    w = rng.standard_normal((4, 8)) * np.array([[0.01], [1], [100], [0]])
    s = fp8_scale(w, axis=0)
    assert np.allclose(s[:3], np.abs(w[:3]).max(axis=1) / 448) and s[3] == 1.0
    q = quantize_fp8(w, s, axis=0)
    assert np.all(decode_e4m3(q[:3]).__abs__().max(axis=1) == 448)
    back = dequantize_fp8(q, s, axis=0)
    # E4M3 keeps 3 mantissa bits: relative error <= 2**-4 above the subnormals (2**-6 in scaled units).
    normal = np.abs(w / s[:, None]) >= 2.0**-6
    assert np.all(np.abs(back - w)[normal] <= np.abs(w)[normal] * 2.0**-4)
    x = rng.standard_normal(1000)
    assert np.array_equal(fake_quantize_fp8(x, fp8_scale(x)), dequantize_fp8(quantize_fp8(x, fp8_scale(x)),
                                                                             fp8_scale(x)))


def test_rounding_by_arithmetic_is_the_code_round_trip_bit_for_bit(rng):
    """round_e4m3 (binade steps and rint, what the fake-quant forward uses) against decode(encode(x)): every float16,
    every midpoint between neighbouring codes and the doubles next to it, past 448, random magnitudes over 2**+-40,
    signed zeros, infinities and NaN; the sign bit included."""
    from resnet_native.quantization.fp8 import round_e4m3

    values = decode_e4m3(np.arange(0x7F, dtype=np.uint8))  # the non-negative finite values, increasing
    mids = (values[1:] + values[:-1]) / 2
    x = np.concatenate([
        np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64),
        mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), values, [448.0, 460.0, 464.0, 470.0, 1e30],
        rng.standard_normal(20000) * np.exp2(rng.uniform(-40, 40, 20000)), [0.0, -0.0, np.inf, -np.inf, np.nan],
    ])
    x = np.concatenate([x, -x])
    got = round_e4m3(x)
    with np.errstate(invalid="ignore"):  # the table search's inf - inf
        want = decode_e4m3(encode_e4m3(x))
    assert np.array_equal(got, want, equal_nan=True)
    finite = ~np.isnan(x)  # NaN has one code, whatever its sign
    assert np.array_equal(np.signbit(got[finite]), np.signbit(want[finite]))
    w = np.nan_to_num(x[:4000]).clip(-1e6, 1e6).reshape(4, 1000)  # per-channel scales, as for a weight
    s = fp8_scale(w, axis=0)
    assert np.array_equal(fake_quantize_fp8(w, s, axis=0), dequantize_fp8(quantize_fp8(w, s, axis=0), s, axis=0),
                          equal_nan=True)
