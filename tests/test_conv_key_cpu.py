"""The algorithm cache's one parser and checker, in C++, without a GPU: _C.parse_conv_key (a key's typed fields, and
ValueErrors naming the key and the field) and the checks of algo_cache_insert / algo_cache_insert_entries (every
field of a choice, the same refusals as a cache file's load; a refused list inserts nothing)."""

import re

import pytest
from test_conv_cache_cpu import BAD_ENTRIES, BASE_KEY, sample_choices, with_field

import resnet_native as rn

C = rn._C


def test_parse_conv_key_gives_typed_fields():
    fields = C.parse_conv_key(BASE_KEY)
    assert fields == {
        "dir": "fwd", "direction": "forward", "dev": 0, "prec": "fp16", "layout": "NHWC", "engine": "legacy",
        "epi": "bias+relu", "det": False, "mode": "find", "fixed": 0, "x": (8, 64, 32, 32), "w": (128, 64, 3, 3),
        "y": (8, 128, 16, 16), "pad": (1, 1), "stride": (2, 2), "dil": (1, 1), "groups": 1, "ws": None, "out": None,
    }
    capped = C.parse_conv_key(with_field(with_field(BASE_KEY, "ws", "1048576"), "dir", "bwd_data"))
    assert capped["ws"] == 1 << 20 and capped["direction"] == "backward_data"
    assert C.parse_conv_key(BASE_KEY + " out=fp32")["out"] == "fp32"


@pytest.mark.parametrize("field, value, message", [
    ("x", "8,64,32", "field 'x': expected 4 comma-separated numbers, got '8,64,32'"),
    ("w", "a,b,c,d", "field 'w': bad number 'a'"),
    ("dir", "sideways", "field 'dir': "),
    ("dev", "-1", "field 'dev': bad number '-1'"),
    ("ws", "-5", "field 'ws': bad workspace cap '-5'"),
])
def test_parse_conv_key_names_the_field_and_the_key(field, value, message):
    bad = with_field(BASE_KEY, field, value)
    pattern = rf"^malformed convolution key \({re.escape(message)}.*\): '{re.escape(bad)}'$"
    with pytest.raises(ValueError, match=pattern):
        C.parse_conv_key(bad)


def test_parse_conv_key_checks_the_geometry():
    bad = with_field(BASE_KEY, "stride", "0,0")
    with pytest.raises(ValueError, match=rf"^convolution key '{re.escape(bad)}': stride: every value must be"):
        C.parse_conv_key(bad)
    with pytest.raises(ValueError, match=r": y=\(8, 128, 16, 17\): the output of"):
        C.parse_conv_key(with_field(BASE_KEY, "y", "8,128,16,17"))


SAMPLE = {"fwd": 0, "bwd_data": 1, "graph": 2}


def bad_entry(which, field, value):
    key, choice = sample_choices()[SAMPLE[which]]
    entry = dict(choice, key=key, algo_name="whatever")
    entry[field] = with_field(key, *value) if field == "key" else value
    return entry


@pytest.mark.parametrize("which, field, value, message", BAD_ENTRIES,
                         ids=[f"{w}.{f}={v}" for w, f, v, _ in BAD_ENTRIES])
def test_insert_entries_refuses_what_a_save_cannot_have_written(empty_cache, which, field, value, message):
    good_key, good = sample_choices()[0]
    entries = [dict(good, key=good_key), bad_entry(which, field, value)]
    with pytest.raises(ValueError, match=rf"^entry 1(: | ){re.escape(message)}"):
        C.algo_cache_insert_entries(entries)
    assert C.algo_cache_entries() == []  # nothing inserted, the good entry neither


def test_insert_checks_the_choice_and_names_the_field(empty_cache):
    key, choice = sample_choices()[0]
    with pytest.raises(ValueError, match=re.escape("'algo' 8 is not a forward algorithm (0 to 7)")):
        C.algo_cache_insert(key, dict(choice, algo=8))
    with pytest.raises(ValueError, match="^lacks a valid 'workspace'"):
        C.algo_cache_insert(key, {k: v for k, v in choice.items() if k != "workspace"})
    with pytest.raises(ValueError, match=r"^'key': malformed convolution key \(field 'x'"):
        C.algo_cache_insert(with_field(key, "x", "1,2"), choice)
    with pytest.raises(ValueError, match="^'key': groups: must be between 1"):
        C.algo_cache_insert(with_field(key, "groups", "0"), choice)
    assert C.algo_cache_entries() == []


def test_insert_entries_inserts_all_re_keyed(empty_cache):
    entries = [dict(choice, key=key, algo_name="x") for key, choice in sample_choices()]
    assert C.algo_cache_insert_entries(entries, device=3) == 3
    keys = [key for key, _ in C.algo_cache_entries()]
    assert len(keys) == 3 and all(" dev=3 " in k for k in keys)
    with pytest.raises(ValueError, match="^entry 0 is not an object with a 'key'"):
        C.algo_cache_insert_entries([{"engine": "legacy"}])
    with pytest.raises(ValueError, match="^entries: expected a list"):
        C.algo_cache_insert_entries({"key": BASE_KEY})
