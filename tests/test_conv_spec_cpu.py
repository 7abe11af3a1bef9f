"""resnet_native.conv.ConvSpec and the native specs it builds (resnet_native._C.ConvSpec, one per direction):
validation of every field and range, algorithm names resolved per direction, the default engine, the typed enums'
names, and conv_output_shape's arithmetic and shape checks. None of this needs a GPU.
"""

import copy
import dataclasses
import itertools
import pickle

import pytest

import resnet_native as rn
from resnet_native._core import names
from resnet_native.ops import conv
from resnet_native.ops.conv import ConvSpec

C = rn._C
INT32_MAX = 2**31 - 1


def native(spec, direction="forward"):
    """The _C.ConvSpec the ops take for one direction of a spec."""
    return conv._native_spec(spec, direction)


def mode_and_fixed(native_spec):
    return (native_spec.algo_mode.name, native_spec.fixed_algo)


# ------------------------------------------------------------------------------------------------------------------
# Specs


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"stride": 0}, "stride"),
        ({"stride": (1, 2, 3)}, "stride"),
        ({"stride": 1.5}, "stride"),
        ({"padding": -1}, "padding"),
        ({"dilation": (1, 0)}, "dilation"),
        ({"groups": 0}, "groups"),
        ({"groups": True}, "groups"),
        ({"layout": "CHWN"}, "layout"),
        ({"precision": "fp64"}, "precision"),
        ({"engine": "cpu"}, "engine"),
        ({"algo": "nonsense"}, "algo"),
        ({"algo": "fwd=FOO"}, "algo"),
        ({"algo": "sideways=GEMM"}, "algo"),
        ({"algo": "fwd"}, "algo"),
        ({"algo": 3}, "algo"),
        ({"deterministic": "yes"}, "deterministic"),
    ],
)
def test_bad_specs_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConvSpec(**kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"stride": 2**31}, "stride"),
        ({"stride": (1, 2**70)}, "stride"),
        ({"padding": (0, 2**31)}, "padding"),
        ({"dilation": 2**31}, "dilation"),
        ({"groups": 2**31}, "groups"),
        ({"groups": 2**64}, "groups"),
        ({"algo": "ENGINE_4294967297"}, "algo"),  # would be engine 1 if truncated to 32 bits
        ({"algo": "ENGINE_2147483648"}, "algo"),
        ({"algo": "fwd=ENGINE_99999999999999999999999"}, "algo"),
    ],
)
def test_out_of_range_specs_raise_value_error_when_created(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConvSpec(**kwargs)


def test_native_spec_checks_every_range():
    good = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    assert C.ConvSpec(**good) == C.ConvSpec()
    assert C.ConvSpec(stride=(INT32_MAX, 1), padding=(INT32_MAX, 0), groups=INT32_MAX).groups == INT32_MAX
    assert C.ConvSpec(algo_mode=C.AlgoMode.fixed, fixed_algo=INT32_MAX).fixed_algo == INT32_MAX
    for name, bad in [("stride", (0, 1)), ("stride", (1, INT32_MAX + 1)), ("padding", (-1, 0)),
                      ("padding", (0, INT32_MAX + 1)), ("dilation", (1, 0)), ("groups", 0), ("groups", INT32_MAX + 1),
                      ("stride", (1, 2**64)), ("stride", (1,)), ("stride", "ab")]:
        with pytest.raises(ValueError, match=f"^{name}: "):
            C.ConvSpec(**dict(good, **{name: bad}))
    for fixed in (-1, INT32_MAX + 1, 2**32 + 1, 2**70):
        with pytest.raises(ValueError, match="^algo: "):
            C.ConvSpec(algo_mode=C.AlgoMode.fixed, fixed_algo=fixed)
    with pytest.raises(TypeError, match="stride"):
        C.ConvSpec(stride=(1.5, 1))
    with pytest.raises(TypeError, match="groups"):
        C.ConvSpec(groups=True)
    # The fixed index is only kept where the mode is fixed: other modes key it as 0.
    assert C.ConvSpec(algo_mode=C.AlgoMode.find, fixed_algo=5).fixed_algo == 0
    assert C.ConvSpec(precision=C.Precision.fp16) != C.ConvSpec()
    assert "precision=fp16" in repr(C.ConvSpec(precision=C.Precision.fp16))


def test_native_enums_carry_the_package_names():
    assert tuple(C.Direction.__members__) == names.DIRECTIONS
    assert tuple(C.Engine.__members__) == names.ENGINES
    assert tuple(C.AlgoMode.__members__) == names.ALGO_MODES
    assert conv.ENGINES == names.ENGINES and conv.DIRECTIONS == names.DIRECTIONS and conv.LAYOUTS == names.LAYOUTS


def test_spec_normalises_ints_to_pairs_and_resolves_algorithms():
    spec = ConvSpec(stride=2, padding=[1, 0], dilation=(1, 2))
    assert spec.stride == (2, 2) and spec.padding == (1, 0) and spec.dilation == (1, 2)
    assert mode_and_fixed(native(ConvSpec(algo="find"))) == ("find", 0)
    assert mode_and_fixed(native(ConvSpec(algo="heuristic"), "backward_filter")) == ("heuristic", 0)
    assert mode_and_fixed(native(ConvSpec(algo="implicit_precomp_gemm"))) == ("fixed", 1)
    mixed = ConvSpec(algo="fwd=IMPLICIT_GEMM;bwd_filter=ALGO_1")
    assert mode_and_fixed(native(mixed)) == ("fixed", 0)
    assert mode_and_fixed(native(mixed, "backward_data")) == ("heuristic", 0)
    assert mode_and_fixed(native(mixed, "backward_filter")) == ("fixed", 1)
    # FFT exists in every direction, with different enum values.
    fft = ConvSpec(algo="FFT")
    assert [native(fft, d).fixed_algo for d in conv.DIRECTIONS] == [4, 2, 2]
    # A fixed legacy name with engine='auto' runs on the legacy engine.
    assert native(ConvSpec(algo="GEMM", engine="auto")).engine == C.Engine.legacy
    # The native spec carries every field of the spec.
    full = native(ConvSpec(stride=(2, 3), padding=(1, 0), dilation=(1, 2), groups=2, layout="NHWC",
                           precision="bf16", algo="ENGINE_7", engine="graph", deterministic=True))
    assert (full.stride, full.padding, full.dilation, full.groups) == ((2, 3), (1, 0), (1, 2), 2)
    assert (full.layout, full.precision, full.engine) == (C.Layout.NHWC, C.Precision.bf16, C.Engine.graph)
    assert mode_and_fixed(full) == ("fixed", 7) and full.deterministic is True


def test_default_engine():
    assert conv.default_engine() == "auto"
    assert ConvSpec().engine == "auto"
    try:
        conv.set_default_engine("legacy")
        assert ConvSpec().engine == "legacy"
        assert ConvSpec(engine="graph").engine == "graph"
    finally:
        conv.set_default_engine("auto")
    assert ConvSpec().engine == "auto"
    with pytest.raises(ValueError, match="engine"):
        conv.set_default_engine("fastest")


def test_untimed_search_turns_find_into_heuristic_within_its_block():
    spec = ConvSpec(algo="fwd=find;bwd_data=ALGO_1;bwd_filter=find")
    searched = native(spec)
    assert mode_and_fixed(searched) == ("find", 0)
    with conv.untimed_search():
        assert mode_and_fixed(native(spec)) == ("heuristic", 0)
        assert mode_and_fixed(native(spec, "backward_data")) == ("fixed", 1)  # a named algorithm stays
        assert mode_and_fixed(native(spec, "backward_filter")) == ("heuristic", 0)
        assert native(spec) is native(spec)  # kept on the spec, beside the searched one
        with conv.untimed_search():
            pass
        assert mode_and_fixed(native(spec)) == ("heuristic", 0)  # an inner block's exit leaves the outer one
    assert native(spec) is searched
    with pytest.raises(RuntimeError), conv.untimed_search():
        raise RuntimeError
    assert mode_and_fixed(native(spec)) == ("find", 0)


def test_a_partial_batch_runs_untimed_and_a_full_one_searches():
    from resnet_native.training.builders import partial_batch_search

    spec = ConvSpec()
    with partial_batch_search(336, 512):
        assert mode_and_fixed(native(spec)) == ("heuristic", 0)
    with partial_batch_search(512, 512):
        assert mode_and_fixed(native(spec)) == ("find", 0)


def test_native_specs_are_built_once_per_spec_and_direction():
    spec = ConvSpec(stride=2, padding=1, algo="fwd=IMPLICIT_GEMM;bwd_data=ALGO_1")
    forward = native(spec)
    assert native(spec) is forward  # kept on the spec
    assert mode_and_fixed(forward) == ("fixed", 0) and mode_and_fixed(native(spec, "backward_data")) == ("fixed", 1)
    assert mode_and_fixed(native(spec, "backward_filter")) == ("heuristic", 0)
    twin = ConvSpec(stride=2, padding=1, algo="fwd=IMPLICIT_GEMM;bwd_data=ALGO_1")
    # What is kept is not a field: equality, hashing and repr are those of the fields alone.
    assert twin == spec and hash(twin) == hash(spec) and repr(twin) == repr(spec)
    assert native(twin) == forward and native(twin) is not forward
    assert native(twin, "backward_data") != forward
    assert mode_and_fixed(native(dataclasses.replace(spec, algo="heuristic"))) == ("heuristic", 0)
    restored = pickle.loads(pickle.dumps(spec))
    assert restored == spec and "_native_specs" not in vars(restored)  # resolved again where it is used
    assert native(restored, "backward_data") == native(spec, "backward_data")
    assert "_native_specs" not in vars(copy.copy(spec))
    unresolvable = ConvSpec(algo="ALGO_1")  # a backward algorithm name: no forward algorithm of that name
    for _ in range(2):  # an error is not cached away
        with pytest.raises(ValueError, match="forward"):
            native(unresolvable)


# ------------------------------------------------------------------------------------------------------------------
# conv_output_shape


def formula(x_nchw, w_kcrs, stride, padding, dilation):
    n, _, h, w = x_nchw
    k, _, r, s = w_kcrs
    p = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return (n, k, p, q)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_output_shape_matches_the_formula(layout):
    checked = 0
    for (h, w), (r, s), stride, padding, dilation, groups in itertools.product(
        [(7, 7), (8, 13), (32, 32), (1, 5)],
        [(1, 1), (3, 3), (1, 3), (5, 2)],
        [(1, 1), (2, 2), (3, 1)],
        [(0, 0), (1, 1), (2, 0)],
        [(1, 1), (2, 2), (1, 3)],
        [1, 2],
    ):
        if h + 2 * padding[0] < dilation[0] * (r - 1) + 1 or w + 2 * padding[1] < dilation[1] * (s - 1) + 1:
            continue
        x_nchw, w_kcrs = (3, 4 * groups, h, w), (6 * groups, 4, r, s)
        spec = ConvSpec(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
        expected = formula(x_nchw, w_kcrs, stride, padding, dilation)
        if layout == "NHWC":
            x_shape = (x_nchw[0], h, w, x_nchw[1])
            w_shape = (w_kcrs[0], r, s, w_kcrs[1])
            expected = (expected[0], expected[2], expected[3], expected[1])
        else:
            x_shape, w_shape = x_nchw, w_kcrs
        assert conv.conv_output_shape(x_shape, w_shape, spec) == expected
        checked += 1
    assert checked > 300


@pytest.mark.parametrize(
    "x_shape,w_shape,spec,match",
    [
        ((2**62 + 1, 3, 8, 8), (4, 3, 3, 3), ConvSpec(), "^x_shape: every dimension"),  # was keyed as N = 1
        ((2**31, 3, 8, 8), (4, 3, 3, 3), ConvSpec(), "^x_shape: every dimension"),
        ((2, 3, 8, 8), (4, 3, 3, 2**31), ConvSpec(), "^w_shape: every dimension"),
        ((2, 3, 8, -8), (4, 3, 3, 3), ConvSpec(), "^x_shape: every dimension"),
        ((2**64, 3, 8, 8), (4, 3, 3, 3), ConvSpec(), "^x_shape: "),
        # Every dimension fits, their product does not even fit 64 bits.
        ((2**20, 2**20, 2**20, 2**20), (1, 2**20, 1, 1), ConvSpec(), "^x_shape: .* 32-bit"),
        ((1, 1, INT32_MAX, 1), (1, 1, 1, 1), ConvSpec(padding=(INT32_MAX, 0)), "^output: .* 32-bit"),
    ],
)
def test_conv_output_shape_rejects_shapes_beyond_32_bits(x_shape, w_shape, spec, match):
    with pytest.raises(ValueError, match=match):
        conv.conv_output_shape(x_shape, w_shape, spec)
    with pytest.raises(ValueError, match=match):
        conv.last_algorithm(x_shape, w_shape, spec)


def test_conv_output_shape_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="smaller"):
        conv.conv_output_shape((1, 3, 4, 4), (2, 3, 5, 5), ConvSpec())
    with pytest.raises(ValueError, match="input channels per group"):
        conv.conv_output_shape((1, 3, 8, 8), (2, 4, 3, 3), ConvSpec())
    with pytest.raises(ValueError, match="w_shape"):
        conv.conv_output_shape((1, 3, 8, 8), (2, 3, 3), ConvSpec())
