"""Convolution tests of what is keyed and cached, without a GPU: the params key (every field round-trips and
tells problems apart), the algorithm cache and its file, last_algorithm, and the legacy descriptor groups built from
a key (cached, droppable, and leak-free when a build fails half-way). Argument validation is in
test_conv_args_cpu.py; specs and conv_output_shape in test_conv_spec_cpu.py.
"""

import json
import os
import re

import pytest

import resnet_native as rn
from resnet_native.ops import conv
from resnet_native.ops.conv import ConvSpec

C = rn._C
SPEC = ConvSpec(stride=1, padding=1)


def native(spec, direction="forward"):
    """The _C.ConvSpec the ops take for one direction of a spec."""
    return conv._native_spec(spec, direction)


BASE_KEY = (
    "conv2d.v1 dir=fwd dev=0 prec=fp16 layout=NHWC engine=legacy epi=bias+relu det=0 mode=find fixed=0 "
    "x=8,64,32,32 w=128,64,3,3 y=8,128,16,16 pad=1,1 stride=2,2 dil=1,1 groups=1 ws=none"
)

# Another value for every field of the key.
FIELD_VARIANTS = {
    "dir": ["bwd_data", "bwd_filter"],
    "dev": ["1"],
    "prec": ["fp32", "tf32", "bf16"],
    "layout": ["NCHW"],
    "engine": ["graph", "auto"],
    "epi": ["none", "bias", "bias+residual+relu", "relu"],
    "det": ["1"],
    "mode": ["heuristic", "fixed"],
    "fixed": ["1", "-1"],
    "x": ["9,64,32,32", "8,65,32,32", "8,64,33,32", "8,64,32,31"],
    "w": ["129,64,3,3", "128,63,3,3", "128,64,1,3", "128,64,3,5"],
    "y": ["9,128,16,16", "8,127,16,16", "8,128,15,16", "8,128,16,17"],
    "pad": ["0,1", "1,0"],
    "stride": ["1,2", "2,1"],
    "dil": ["2,1", "1,2"],
    "groups": ["2"],
    "ws": ["0", "1048576"],
}


def key_fields(key):
    return [token.split("=", 1)[0] for token in key.split()[1:]]


def with_field(key, name, value):
    tokens = key.split()
    for i, token in enumerate(tokens):
        if token.startswith(name + "="):
            tokens[i] = f"{name}={value}"
            return " ".join(tokens)
    raise AssertionError(f"no field {name} in {key}")


# ------------------------------------------------------------------------------------------------------------------
# The params key


def test_key_round_trips():
    assert C._testing.conv_params_roundtrip(BASE_KEY) == BASE_KEY
    assert C._testing.conv_params_equal(BASE_KEY, BASE_KEY)
    roundtrip = C._testing.conv_params_roundtrip(BASE_KEY)
    assert C._testing.conv_params_hash(BASE_KEY) == C._testing.conv_params_hash(roundtrip)


def test_every_field_is_covered_by_the_variants():
    assert set(key_fields(BASE_KEY)) == set(FIELD_VARIANTS)


@pytest.mark.parametrize(
    "name,value", [(n, v) for n, values in FIELD_VARIANTS.items() for v in values], ids=lambda x: str(x)
)
def test_key_differs_on_every_field(name, value):
    variant = with_field(BASE_KEY, name, value)
    assert C._testing.conv_params_roundtrip(variant) == variant
    assert not C._testing.conv_params_equal(BASE_KEY, variant)
    assert C._testing.conv_params_hash(BASE_KEY) != C._testing.conv_params_hash(variant)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "conv2d.v2" + BASE_KEY[len("conv2d.v1") :],
        BASE_KEY + " extra=1",
        BASE_KEY.replace(" ws=none", ""),
        with_field(BASE_KEY, "dir", "sideways"),
        with_field(BASE_KEY, "prec", "fp64"),
        with_field(BASE_KEY, "layout", "CHWN"),
        with_field(BASE_KEY, "engine", "cpu"),
        with_field(BASE_KEY, "epi", "bias+bias"),
        with_field(BASE_KEY, "epi", "gelu"),
        with_field(BASE_KEY, "det", "2"),
        with_field(BASE_KEY, "mode", "guess"),
        with_field(BASE_KEY, "x", "8,64,32"),
        with_field(BASE_KEY, "x", "8,64,32,32,1"),
        with_field(BASE_KEY, "w", "a,b,c,d"),
        with_field(BASE_KEY, "pad", "1,"),
        with_field(BASE_KEY, "dev", "-1"),
        with_field(BASE_KEY, "ws", "-5"),
        with_field(BASE_KEY, "groups", "99999999999"),
        BASE_KEY.replace("pad=", "padding="),
    ],
)
def test_malformed_keys_raise_value_error(bad):
    with pytest.raises(ValueError):
        C._testing.conv_params_roundtrip(bad)


def test_key_of_an_nhwc_call_uses_logical_dims():
    spec = ConvSpec(stride=2, padding=1, layout="NHWC", precision="bf16", algo="heuristic", deterministic=True)
    key = C.conv_key(C.Direction.forward, (8, 32, 32, 64), (128, 3, 3, 64), native(spec), "bias+relu")
    assert "x=8,64,32,32" in key and "w=128,64,3,3" in key and "y=8,128,16,16" in key
    assert "prec=bf16" in key and "layout=NHWC" in key and "mode=heuristic" in key and "det=1" in key
    assert "epi=bias+relu" in key and "dir=fwd" in key
    assert C._testing.conv_params_roundtrip(key) == key


def test_fixed_algorithm_is_part_of_the_key():
    spec = ConvSpec(algo="IMPLICIT_PRECOMP_GEMM")
    key = C.conv_key(C.Direction.forward, (2, 3, 8, 8), (4, 3, 3, 3), native(spec), "none")
    assert "mode=fixed" in key and "fixed=1" in key


# ------------------------------------------------------------------------------------------------------------------
# The algorithm cache and its file


def sample_choices():
    keys = [
        BASE_KEY,
        with_field(with_field(BASE_KEY, "dir", "bwd_data"), "epi", "none"),
        with_field(with_field(BASE_KEY, "engine", "graph"), "mode", "heuristic"),
    ]
    choices = [
        {"engine": "legacy", "mode": "find", "algo": 1, "math_type": 1, "knobs": "", "workspace": 4096,
         "time_ms": 0.25, "fused_path": "fused"},
        {"engine": "legacy", "mode": "heuristic", "algo": 0, "math_type": 3, "knobs": "", "workspace": 0,
         "time_ms": None, "fused_path": ""},
        {"engine": "graph", "mode": "heuristic", "algo": 17, "math_type": 0, "knobs": "TILE_K=2;SPLIT_K=1",
         "workspace": 1 << 20, "time_ms": None, "fused_path": ""},
    ]
    return list(zip(keys, choices, strict=True))


def insert_samples():
    for key, choice in sample_choices():
        C.algo_cache_insert(key, choice)


def comparable(entries):
    return sorted((e["key"], e["engine"], e["mode"], e["algo"], e["math_type"], e["knobs"], e["workspace"],
                   e["time_ms"], e["fused_path"]) for e in entries)


def test_cache_insert_lookup_and_entries(empty_cache):
    insert_samples()
    stats = conv.algorithm_cache_stats()
    assert stats["entries"] == 3
    assert set(stats) == {"hits", "misses", "finds", "entries", "capacity", "evictions"}
    found = C.algo_cache_lookup(BASE_KEY)
    assert found["algo_name"] == "IMPLICIT_PRECOMP_GEMM" and found["math_type_name"] == "TENSOR_OP_MATH"
    assert found["time_ms"] == pytest.approx(0.25) and found["fused_path"] == "fused"
    assert found["search_ms"] == 0.0  # inserted, not searched here
    graph = C.algo_cache_lookup(sample_choices()[2][0])
    assert graph["algo_name"] == "ENGINE_17" and graph["knobs"] == "TILE_K=2;SPLIT_K=1"
    assert conv.algorithm_cache_stats() == stats  # lookups for inspection count nothing
    assert len(conv.algorithm_cache_entries()) == 3
    conv.clear_algorithm_cache()
    assert conv.algorithm_cache_entries() == []
    assert C.algo_cache_lookup(BASE_KEY) is None


def test_cache_insert_rejects_bad_choices(empty_cache):
    good = dict(sample_choices()[0][1])
    for field, value in [("engine", "auto"), ("engine", "cpu"), ("mode", "guess"), ("algo", "one")]:
        with pytest.raises(ValueError):
            C.algo_cache_insert(BASE_KEY, dict(good, **{field: value}))
    bad = dict(good)
    del bad["workspace"]
    with pytest.raises(ValueError):
        C.algo_cache_insert(BASE_KEY, bad)
    assert conv.algorithm_cache_entries() == []


def test_cache_file_round_trip(empty_cache, fake_gpu, tmp_path):
    insert_samples()
    before = comparable(conv.algorithm_cache_entries())
    path = tmp_path / "algos.json"
    assert conv.save_algorithm_cache(path) == 3
    payload = json.loads(path.read_text())
    assert payload["format"] == "resnet_native.algorithm_cache" and payload["version"] == 1
    assert payload["gpu"] == "Fake GPU 9000" and payload["cudnn_version"] == 91900
    assert len(payload["entries"]) == 3
    assert sorted(os.listdir(tmp_path)) == ["algos.json"]  # the temporary file was renamed, nothing left over

    conv.clear_algorithm_cache()
    assert conv.load_algorithm_cache(path) == 3
    assert comparable(conv.algorithm_cache_entries()) == before

    # Saving again over the existing file replaces it.
    conv.clear_algorithm_cache()
    C.algo_cache_insert(*sample_choices()[0])
    assert conv.save_algorithm_cache(str(path)) == 1
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_cache_file_entries_are_rekeyed_to_the_current_device(empty_cache, fake_gpu, tmp_path):
    insert_samples()
    path = tmp_path / "algos.json"
    conv.save_algorithm_cache(path)
    conv.clear_algorithm_cache()
    fake_gpu["value"] = ("Fake GPU 9000", 91900, 3)
    assert conv.load_algorithm_cache(path) == 3
    assert all(" dev=3 " in e["key"] for e in conv.algorithm_cache_entries())


@pytest.mark.parametrize(
    "other", [("Other GPU", 91900, 0), ("Fake GPU 9000", 91901, 0)], ids=["other_gpu", "other_cudnn"]
)
def test_cache_file_from_another_gpu_or_cudnn_is_ignored(empty_cache, fake_gpu, tmp_path, other):
    insert_samples()
    path = tmp_path / "algos.json"
    conv.save_algorithm_cache(path)
    conv.clear_algorithm_cache()
    fake_gpu["value"] = other
    with pytest.warns(UserWarning, match="ignored"):
        assert conv.load_algorithm_cache(path) == 0
    assert conv.algorithm_cache_entries() == []


def test_malformed_cache_files_raise_and_add_nothing(empty_cache, fake_gpu, tmp_path):
    insert_samples()
    good = tmp_path / "good.json"
    conv.save_algorithm_cache(good)
    payload = json.loads(good.read_text())
    conv.clear_algorithm_cache()

    cases = {
        "not_json.json": "{ this is not json",
        "not_ours.json": json.dumps({"format": "something else", "entries": []}),
        "version.json": json.dumps(dict(payload, version=99)),
        "entries.json": json.dumps(dict(payload, entries={"a": 1})),
        "bad_key.json": json.dumps(dict(payload, entries=payload["entries"] + [dict(payload["entries"][0],
                                                                                     key="conv2d.v1 nonsense")])),
        "no_algo.json": json.dumps(dict(payload, entries=payload["entries"] + [
            {k: v for k, v in payload["entries"][0].items() if k != "algo"}])),
        "bad_engine.json": json.dumps(dict(payload, entries=[dict(payload["entries"][0], engine="auto")])),
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ValueError):
            conv.load_algorithm_cache(path)
        assert conv.algorithm_cache_entries() == [], name


# (which entry, field, value, what the message says) of entries save_algorithm_cache cannot have written.
# Entries: "fwd" (legacy forward), "bwd_data" (legacy), "graph".
BAD_ENTRIES = [
    ("fwd", "algo", -1, "'algo' -1 is not a forward algorithm (0 to 7)"),
    ("fwd", "algo", 10**6, "'algo' 1000000 is not a forward algorithm"),
    ("fwd", "algo", 8, "'algo' 8 is not a forward algorithm (0 to 7)"),
    ("bwd_data", "algo", 6, "'algo' 6 is not a backward_data algorithm (0 to 5)"),
    ("graph", "algo", -1, "'algo' -1 is not a graph engine id"),
    ("graph", "algo", 10**6, "'algo' 1000000 is not a graph engine id"),
    ("fwd", "math_type", 99, "'math_type' 99 is not a cuDNN math type"),
    ("fwd", "math_type", -1, "'math_type' -1 is not a cuDNN math type"),
    ("graph", "math_type", 3, "'math_type' 3 (the graph engine stores 0)"),
    ("fwd", "workspace", 2**62, "'workspace' 4611686018427387904 is outside 0 to"),
    ("fwd", "workspace", -1, "'workspace' -1 is outside"),
    ("fwd", "time_ms", -1.0, "'time_ms' -1.0 is not a duration"),
    ("fwd", "time_ms", "fast", "'time_ms' 'fast' is not a duration"),
    ("fwd", "time_ms", 1e39, "'time_ms' 1e+39 is not a duration"),  # finite, but past float32's range
    ("fwd", "knobs", 3, "'knobs' is not a string"),
    ("fwd", "mode", "guess", "'mode' 'guess' is not one of"),
    ("fwd", "engine", "auto", "'engine' 'auto' is not 'legacy' or 'graph'"),
    ("fwd", "algo", True, "lacks a valid 'algo'"),
    ("fwd", "key", ("stride", "0,0"), "'key': stride: every value must be between 1 and 2147483647, got (0, 0)"),
    ("fwd", "key", ("stride", "-2,2"), "'key': stride: every value must be between 1 and"),
    ("fwd", "key", ("groups", "0"), "'key': groups: must be between 1 and 2147483647, got 0"),
    ("fwd", "key", ("groups", "-1"), "'key': groups: must be between 1 and 2147483647, got -1"),
    ("fwd", "key", ("groups", "3"), "'key': x: C=64 input channels are not divisible by groups=3"),
    ("fwd", "key", ("dil", "0,1"), "'key': dilation: every value must be between 1 and 2147483647, got (0, 1)"),
    ("fwd", "key", ("pad", "-1,1"), "'key': padding: every value must be between 0 and 2147483647, got (-1, 1)"),
    ("fwd", "key", ("x", "0,64,32,32"), "'key': x: every dimension must be between 1 and 2147483647, got (0, 64"),
    ("fwd", "key", ("y", "8,128,16,17"), "'key': y=(8, 128, 16, 17): the output of x=(8, 64, 32, 32) and w="),
    ("fwd", "key", ("ws", "1024"), "'workspace' 4096 is outside 0 to 1024 bytes (the key's workspace cap)"),
]


def entry_index(entries, which):
    """The index of a sample entry in a saved file (found by content, not by the cache's order)."""
    for i, e in enumerate(entries):
        if e["engine"] == ("graph" if which == "graph" else "legacy") and (which == "graph"
                                                                          or f" dir={which} " in e["key"]):
            return i
    raise AssertionError(which)


@pytest.mark.parametrize("which, field, value, message", BAD_ENTRIES,
                         ids=[f"{w}.{f}={v}" for w, f, v, _ in BAD_ENTRIES])
def test_cache_entries_out_of_range_are_refused_naming_file_entry_and_field(empty_cache, fake_gpu, tmp_path, which,
                                                                             field, value, message):
    """Out-of-range algorithms, math types, workspaces and geometries (algo -1 or 10**6, math_type 99, workspace
    2**62, stride 0, groups 0, ...) add nothing to the cache."""
    insert_samples()
    good = tmp_path / "good.json"
    conv.save_algorithm_cache(good)
    payload = json.loads(good.read_text())
    conv.clear_algorithm_cache()
    index = entry_index(payload["entries"], which)
    entry = payload["entries"][index]
    entry[field] = with_field(entry["key"], *value) if field == "key" else value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=rf"^algorithm cache file {path}: entry {index}(: | ){re.escape(message)}"):
        conv.load_algorithm_cache(path)
    assert conv.algorithm_cache_entries() == []


@pytest.mark.parametrize("version", [True, "1", None, [1], 2])
def test_cache_file_version_must_be_the_int(empty_cache, fake_gpu, tmp_path, version):
    """version must be the int 1 (True == 1 in Python)."""
    insert_samples()
    path = tmp_path / "algos.json"
    conv.save_algorithm_cache(path)
    payload = json.loads(path.read_text())
    conv.clear_algorithm_cache()
    path.write_text(json.dumps(dict(payload, version=version)))
    with pytest.raises(ValueError, match=rf"^algorithm cache file {path}: format version .* is not supported"):
        conv.load_algorithm_cache(path)
    assert conv.algorithm_cache_entries() == []


def test_every_choice_the_cache_can_hold_passes_the_entry_checks(empty_cache, fake_gpu, tmp_path):
    """The checks refuse nothing a real run saves: every legacy algorithm of every direction, every math type, the
    graph engine's ids, a workspace at the key's cap."""
    entries = []
    for direction, short in (("forward", "fwd"), ("backward_data", "bwd_data"), ("backward_filter", "bwd_filter")):
        for algo in range(len(C.conv_algo_names(conv._NATIVE_DIRECTION[direction]))):
            for math_type in range(4):
                key = with_field(with_field(BASE_KEY, "dir", short), "fixed", str(algo))
                key = with_field(with_field(key, "mode", "fixed"), "ws", "8192")
                entries.append((key, {"engine": "legacy", "mode": "fixed", "algo": algo, "math_type": math_type,
                                      "knobs": "", "workspace": 8192, "time_ms": None, "fused_path": ""}))
    for engine_id in (0, 17, 63, 65535):
        key = with_field(with_field(BASE_KEY, "engine", "graph"), "mode", "heuristic")
        entries.append((key, {"engine": "graph", "mode": "heuristic", "algo": engine_id, "math_type": 0,
                              "knobs": "k=1", "workspace": 1 << 30, "time_ms": 0.0, "fused_path": "fused"}))
    path = tmp_path / "all.json"
    for key, choice in entries:
        conv.clear_algorithm_cache()
        C.algo_cache_insert(key, choice)
        conv.save_algorithm_cache(path)
        conv.clear_algorithm_cache()
        assert conv.load_algorithm_cache(path) == 1, (key, choice)
    # grouped and dilated geometries
    for fields in ({"groups": "4", "w": "128,16,3,3"}, {"dil": "2,2", "y": "8,128,15,15"},
                   {"stride": "1,1", "pad": "0,0", "y": "8,128,30,30"}):
        key = BASE_KEY
        for name, value in fields.items():
            key = with_field(key, name, value)
        conv.clear_algorithm_cache()
        C.algo_cache_insert(key, sample_choices()[0][1])
        conv.save_algorithm_cache(path)
        conv.clear_algorithm_cache()
        assert conv.load_algorithm_cache(path) == 1, key


def test_cache_file_io_needs_a_gpu_identity_without_one():
    if rn.cuda_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(rn.NoGPUError):
        conv.save_algorithm_cache("/nonexistent/never_written.json")


def test_last_algorithm_validates_and_is_empty_without_runs(empty_cache):
    assert conv.last_algorithm((2, 3, 8, 8), (4, 3, 3, 3), SPEC) is None
    assert conv.last_algorithm((2, 3, 8, 8), (4, 3, 3, 3), SPEC, "backward_filter") is None
    assert conv.last_algorithm((2, 3, 8, 8), (4, 3, 3, 3), SPEC, fused="relu+bias") is None
    with pytest.raises(ValueError, match="direction"):
        conv.last_algorithm((2, 3, 8, 8), (4, 3, 3, 3), SPEC, "sideways")
    with pytest.raises(ValueError, match="fused"):
        conv.last_algorithm((2, 3, 8, 8), (4, 3, 3, 3), SPEC, fused="bias+gelu")
    with pytest.raises(ValueError, match="fused"):
        conv.last_algorithm((2, 3, 8, 8), (4, 3, 3, 3), SPEC, "backward_data", fused="bias")
    with pytest.raises(ValueError, match="x_shape"):
        conv.last_algorithm((2, 3, 8), (4, 3, 3, 3), SPEC)
    assert conv.fused_name(bias=True, z=True, activation="relu") == "bias+residual+relu"
    assert conv.fused_name() is None


def test_last_algorithm_reads_what_the_cache_holds(empty_cache):
    spec = ConvSpec(padding=1, precision="fp16", layout="NHWC", algo="heuristic")
    key = C.conv_key(C.Direction.forward, (2, 8, 8, 3), (4, 3, 3, 3), native(spec), "bias+relu")
    C.algo_cache_insert(key, sample_choices()[0][1])
    found = conv.last_algorithm((2, 8, 8, 3), (4, 3, 3, 3), spec, fused="bias+relu")
    assert found is not None and found["key"] == key and found["algo_name"] == "IMPLICIT_PRECOMP_GEMM"
    assert conv.last_algorithm((2, 8, 8, 3), (4, 3, 3, 3), spec) is None  # the plain key is another entry


# ------------------------------------------------------------------------------------------------------------------
# Descriptor groups: built and destroyed without leaks, including when a build fails half-way


def live():
    return {k: v for k, v in rn.live_descriptors().items() if k != "handle" and v != 0}


GOOD_KEY = (
    "conv2d.v1 dir=fwd dev=0 prec=fp32 layout=NCHW engine=legacy epi=none det=0 mode=find fixed=0 "
    "x=8,3,32,32 w=16,3,3,3 y=8,16,32,32 pad=1,1 stride=1,1 dil=1,1 groups=1 ws=none"
)


@pytest.mark.parametrize(
    "bad,error",
    [
        (GOOD_KEY.replace("pad=1,1", "pad=-1,1"), rn.CudnnError),  # fails setting the convolution descriptor
        (GOOD_KEY.replace("stride=1,1", "stride=0,1"), rn.CudnnError),
        (GOOD_KEY.replace("w=16,3,3,3", "w=0,3,3,3"), rn.CudnnError),  # fails setting the filter
        (GOOD_KEY.replace("groups=1", "groups=2"), rn.CudnnError),  # fails in the output-dimension query
        (GOOD_KEY.replace("y=8,16,32,32", "y=8,16,31,32"), ValueError),  # fails after every descriptor is set
    ],
)
def test_half_built_descriptor_groups_leak_nothing(bad, error):
    before = live()
    for _ in range(3):
        with pytest.raises(error):
            C._testing.build_legacy_descriptors(bad)
        with pytest.raises(error):
            C._testing.build_legacy_descriptors(bad, cached=True)
    assert live() == before


def test_descriptor_groups_are_cached_and_droppable():
    rn._drop_cached_descriptors()
    before = live()
    C._testing.build_legacy_descriptors(GOOD_KEY)  # uncached: destroyed on return
    assert live() == before
    C._testing.build_legacy_descriptors(GOOD_KEY, cached=True)
    C._testing.build_legacy_descriptors(GOOD_KEY, cached=True)  # the same group
    grown = live()
    assert C._testing.legacy_descriptor_cache_size() == 1
    assert grown["tensor"] == before.get("tensor", 0) + 3 and grown["filter"] == before.get("filter", 0) + 1
    assert grown["convolution"] == before.get("convolution", 0) + 1
    assert grown["activation"] == before.get("activation", 0) + 2
    C._testing.build_legacy_descriptors(GOOD_KEY.replace("prec=fp32", "prec=fp16"), cached=True)
    assert C._testing.legacy_descriptor_cache_size() == 2
    rn._drop_cached_descriptors()
    assert C._testing.legacy_descriptor_cache_size() == 0
    assert live() == before
