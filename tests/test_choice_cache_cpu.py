"""InferenceEngine(quantize_from='auto')'s choice in the algorithm cache file (inference/choice_cache.py), without
a GPU: the key (the plan's structure, not its weights, and every field of the problem), the round trip beside the
conv entries, the merge (a conv-only save and another engine's choice keep what they did not make), choices of
another GPU or cuDNN ignored, malformed sections refused, and files without the section. The engine reusing a
stored choice is test_quantized_conv_gpu.py's."""

import json

import pytest
from quant_helpers import tiny_resnet18_state
from test_conv_cache_cpu import comparable, insert_samples

from resnet_native.inference import build_plan
from resnet_native.inference import choice_cache as cc
from resnet_native.ops import conv
from resnet_native.quantization.prefix import QUANTIZE_FROM

PLAN = build_plan(tiny_resnet18_state(), "cifar", "fp32")
ARGS = dict(dtype="int8", batch=4, cuda_graph=True, candidates=QUANTIZE_FROM, conv_engine="auto",
            deterministic=False, tune_fusion=True)
TIMES = {"stem": 0.5, "layer1": 0.4375, "layer2": 0.1 + 0.2, "layer3": 0.3125, "layer4": 0.625}


def key(**changes):
    return cc.choice_key(PLAN, **dict(ARGS, **changes))


def read(path):
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------------------------------
# The key


def test_the_fingerprint_is_the_structure_not_the_weights():
    same = build_plan(tiny_resnet18_state(seed=7), "cifar", "fp32")
    assert cc.plan_fingerprint(same) == cc.plan_fingerprint(PLAN)
    deeper = tiny_resnet18_state()
    deeper.update({k.replace("layer1.1.", "layer1.2."): v for k, v in deeper.items() if k.startswith("layer1.1.")})
    others = [build_plan(tiny_resnet18_state(num_classes=5), "cifar", "fp32"),
              build_plan(tiny_resnet18_state(), "cifar", "fp32", image_size=(32, 48)),
              build_plan(tiny_resnet18_state(), "cifar", "fp16"),
              build_plan(deeper, "cifar", "fp32")]
    prints = {cc.plan_fingerprint(p) for p in others}
    assert len(prints) == len(others) and cc.plan_fingerprint(PLAN) not in prints
    assert all(len(p) == 16 and int(p, 16) >= 0 for p in prints)


def test_the_key_is_readable_and_tells_every_field_apart():
    base = key()
    assert base.startswith("quantize_from.v1 plan=") and " stem=cifar image=32x32 classes=10 convs=21 " in base
    assert base.endswith(" dtype=int8 batch=4 cuda_graph=1 conv_engine=auto det=0 tune_fusion=1 "
                         "candidates=stem,layer1,layer2,layer3,layer4")
    assert key(batch=4) == base and cc.choice_key(build_plan(tiny_resnet18_state(seed=3), "cifar", "fp32"),
                                                  **ARGS) == base
    variants = [key(dtype="fp8"), key(batch=8), key(cuda_graph=False), key(candidates=QUANTIZE_FROM[1:]),
                key(conv_engine="graph"), key(deterministic=True), key(tune_fusion=False),
                cc.choice_key(build_plan(tiny_resnet18_state(), "cifar", "fp32", image_size=16), **ARGS)]
    assert len(set(variants)) == len(variants) and base not in variants
    assert "image=16x16" in variants[-1]


# ------------------------------------------------------------------------------------------------------------------
# The file


def test_a_choice_round_trips_beside_the_conv_entries(empty_cache, fake_gpu, tmp_path):
    path = tmp_path / "algos.json"
    assert cc.load_choices(path) == {}  # no file yet
    insert_samples()
    conv.save_algorithm_cache(path)
    assert cc.load_choices(path) == {}  # a file without the section
    assert cc.store_choice(path, key(), "layer3", TIMES)
    assert cc.load_choices(path) == {key(): {"quantize_from": "layer3", "times_ms": TIMES}}
    assert list(cc.load_choices(path)[key()]["times_ms"]) == list(QUANTIZE_FROM)
    assert cc.load_choices(path)[key()]["times_ms"]["layer2"] == 0.1 + 0.2  # floats exactly
    payload = read(path)
    assert set(payload) == {"format", "version", "gpu", "cudnn_version", "entries", cc.SECTION}
    before = comparable(conv.algorithm_cache_entries())
    conv.clear_algorithm_cache()
    assert conv.load_algorithm_cache(path) == 3  # the conv entries load as before
    assert comparable(conv.algorithm_cache_entries()) == before


def test_saves_keep_the_choices_they_did_not_make(empty_cache, fake_gpu, tmp_path):
    path = tmp_path / "algos.json"
    insert_samples()
    conv.save_algorithm_cache(path)
    cc.store_choice(path, key(), "layer3", TIMES)
    cc.store_choice(path, key(batch=8), "layer4", TIMES)
    payload = read(path)
    payload["another_section"] = {"kept": [1, 2]}  # any section conv does not own is carried as it is
    path.write_text(json.dumps(payload))
    # A conv-only save (training's, or any code's in this or another process), with other conv entries.
    conv.clear_algorithm_cache()
    assert conv.save_algorithm_cache(path) == 0
    assert read(path)["entries"] == [] and read(path)["another_section"] == {"kept": [1, 2]}
    assert set(cc.load_choices(path)) == {key(), key(batch=8)}
    # Another engine's choice is added; one of the same problem replaces the old.
    cc.store_choice(path, key(dtype="fp8"), "stem", TIMES)
    cc.store_choice(path, key(), "layer1", dict(TIMES, layer1=0.01))
    choices = cc.load_choices(path)
    assert set(choices) == {key(), key(batch=8), key(dtype="fp8")}
    assert choices[key()]["quantize_from"] == "layer1" and choices[key(batch=8)]["quantize_from"] == "layer4"
    assert read(path)["another_section"] == {"kept": [1, 2]}


@pytest.mark.parametrize("other", [("Other GPU", 91900, 0), ("Fake GPU 9000", 90100, 0)],
                         ids=["other_gpu", "other_cudnn"])
def test_choices_of_another_gpu_or_cudnn_are_ignored_and_not_carried(empty_cache, fake_gpu, tmp_path, other):
    path = tmp_path / "algos.json"
    insert_samples()
    conv.save_algorithm_cache(path)
    cc.store_choice(path, key(), "layer3", TIMES)
    written = path.read_bytes()
    fake_gpu["value"] = other
    assert cc.load_choices(path) == {}
    assert not cc.store_choice(path, key(), "layer1", TIMES)  # writes nothing into another machine's file
    assert path.read_bytes() == written
    with pytest.warns(UserWarning, match="ignored"):
        assert conv.load_algorithm_cache(path) == 0
    conv.save_algorithm_cache(path)  # now this machine's file: the other machine's choices go with its header
    assert cc.load_choices(path) == {} and cc.SECTION not in read(path)
    assert cc.store_choice(path, key(), "layer1", TIMES)
    assert cc.load_choices(path)[key()]["quantize_from"] == "layer1"


def test_a_save_replaces_a_file_that_is_no_cache_whole(empty_cache, fake_gpu, tmp_path):
    path = tmp_path / "algos.json"
    path.write_text("not json")
    with pytest.raises(ValueError, match="not JSON"):
        cc.load_choices(path)
    insert_samples()
    conv.save_algorithm_cache(path)
    assert cc.load_choices(path) == {} and len(read(path)["entries"]) == 3


def good_record():
    return {"quantize_from": "layer3", "times_ms": dict(TIMES)}


BAD_SECTIONS = {
    "not an object": ([1, 2], "is not an object of {key: choice}"),
    "another kind of key": ({key().replace("quantize_from.v1", "fusion.v1"): good_record()}, "is not a"),
    "a key without candidates": ({key().rsplit(" candidates=", 1)[0]: good_record()}, "is not a"),
    "a key token without '='": ({key() + " loose": good_record()}, "is not a"),
    "an unknown candidate": ({key(candidates=("stem", "layer9")): good_record()}, "is not a"),
    "a repeated candidate": ({key(candidates=("stem", "stem")): good_record()}, "is not a"),
    "a record that is no object": ({key(): "layer3"}, "is not an object with 'quantize_from'"),
    "a choice that is no candidate": ({key(): dict(good_record(), quantize_from="layer9")}, "not one of its"),
    "a choice outside the key's candidates": ({key(candidates=("layer1", "layer2")): good_record()},
                                              "not one of its"),
    "a candidate without a time": ({key(): dict(good_record(), times_ms={"stem": 1.0})}, "one time per candidate"),
    "a time of no candidate": ({key(): dict(good_record(), times_ms=dict(TIMES, layer9=1.0))},
                               "one time per candidate"),
    "times that are no object": ({key(): dict(good_record(), times_ms=[1.0])}, "one time per candidate"),
    "a zero time": ({key(): dict(good_record(), times_ms=dict(TIMES, stem=0))}, "not a positive duration"),
    "a negative time": ({key(): dict(good_record(), times_ms=dict(TIMES, stem=-1.0))}, "not a positive duration"),
    "an infinite time": ({key(): dict(good_record(), times_ms=dict(TIMES, stem=float("inf")))},
                         "not a positive duration"),
    "a boolean time": ({key(): dict(good_record(), times_ms=dict(TIMES, stem=True))}, "not a positive duration"),
    "a string time": ({key(): dict(good_record(), times_ms=dict(TIMES, stem="1.0"))}, "not a positive duration"),
    "a time past float's range": ({key(): dict(good_record(), times_ms=dict(TIMES, stem=10**400))},
                                  "not a positive duration"),  # was an OverflowError
}


@pytest.mark.parametrize("which", list(BAD_SECTIONS))
def test_malformed_sections_raise_naming_the_file_and_change_nothing(empty_cache, fake_gpu, tmp_path, which):
    section, message = BAD_SECTIONS[which]
    path = tmp_path / "algos.json"
    insert_samples()
    conv.save_algorithm_cache(path)
    payload = read(path)
    payload[cc.SECTION] = section
    path.write_text(json.dumps(payload))
    written = path.read_bytes()
    with pytest.raises(ValueError, match=str(path)) as error:
        cc.load_choices(path)
    assert cc.SECTION in str(error.value) and message in str(error.value), str(error.value)
    with pytest.raises(ValueError, match=str(path)):
        cc.store_choice(path, key(batch=8), "layer1", TIMES)  # no merge into a damaged section
    assert path.read_bytes() == written
    conv.clear_algorithm_cache()
    assert conv.load_algorithm_cache(path) == 3  # the conv entries are another section: unaffected


def test_store_refuses_what_a_load_would_refuse(empty_cache, fake_gpu, tmp_path):
    path = tmp_path / "algos.json"
    conv.save_algorithm_cache(path)
    written = path.read_bytes()
    for bad in [dict(TIMES, stem=float("nan")), {"stem": 1.0}]:
        with pytest.raises(ValueError, match=str(path)):
            cc.store_choice(path, key(), "stem", bad)
    assert path.read_bytes() == written
    assert not cc.store_choice(tmp_path / "missing.json", key(), "stem", TIMES)
    assert not (tmp_path / "missing.json").exists()


def test_a_file_as_older_versions_wrote_it_loads(empty_cache, fake_gpu, tmp_path):
    """The section is optional: a file without it holds no choices, and its conv entries load as before."""
    path = tmp_path / "algos.json"
    insert_samples()
    conv.save_algorithm_cache(path)
    old = {k: v for k, v in read(path).items() if k in ("format", "version", "gpu", "cudnn_version", "entries")}
    path.write_text(json.dumps(old))
    assert cc.load_choices(path) == {}
    conv.clear_algorithm_cache()
    assert conv.load_algorithm_cache(path) == 3
    assert cc.store_choice(path, key(), "layer2", TIMES)
    assert read(path)["entries"] == old["entries"]  # the choice is added, the rest kept as it was
