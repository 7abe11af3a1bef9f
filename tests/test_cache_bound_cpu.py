"""The bounds of the algorithm cache and of the graph engine's plan cache, without a GPU: past its capacity each
cache evicts its least recently used entries (an op's lookup makes an entry the most recently used, inspection
does not), counts the evictions, evicts at once when the capacity shrinks, and refuses capacities that are not
positive ints. A cache file longer than the capacity leaves its most recently used entries. The plan cache is
filled with placeholder plans (test hooks: empty plans under negative engine ids, never executed); plans pinned as
during a CUDA-graph capture are never evicted. Both caches share one LRU container (csrc/core/lru_map.h).
The same bound with real plans on a GPU: test_graph_conv_cache_gpu.py.
"""

import json
import re

import numpy as np
import pytest

import resnet_native as rn
from resnet_native.ops import algo_cache as cache_module
from resnet_native.ops import conv

C = rn._C

BASE_KEY = (
    "conv2d.v1 dir=fwd dev=0 prec=fp16 layout=NHWC engine=legacy epi=none det=0 mode=find fixed=0 "
    "x=8,64,32,32 w=128,64,3,3 y=8,128,16,16 pad=1,1 stride=2,2 dil=1,1 groups=1 ws=none"
)
CHOICE = {"engine": "legacy", "mode": "find", "algo": 1, "math_type": 1, "knobs": "", "workspace": 4096,
          "time_ms": 0.25, "fused_path": ""}


def key(n):
    """A distinct valid key per n (the batch size, in x and y)."""
    return BASE_KEY.replace("x=8,", f"x={n},").replace("y=8,", f"y={n},")


def cached_keys():
    """The algorithm cache's keys, the least recently used first."""
    return [e["key"] for e in conv.algorithm_cache_entries()]


def insert(*ns):
    for n in ns:
        C.algo_cache_insert(key(n), CHOICE)


@pytest.fixture
def algo_cache():
    """An empty algorithm cache; its capacity restored afterwards."""
    capacity = conv.algorithm_cache_capacity()
    conv.clear_algorithm_cache()
    yield
    conv.clear_algorithm_cache()
    conv.set_algorithm_cache_capacity(capacity)


@pytest.fixture
def plan_cache():
    """An empty plan cache; its capacity restored afterwards."""
    capacity = conv.plan_cache_capacity()
    C.graph_clear_plans()
    yield
    C.graph_clear_plans()
    conv.set_plan_cache_capacity(capacity)


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(cache_module, "_device_identity", lambda: ("Fake GPU 9000", 91900, 0))


# ------------------------------------------------------------------------------------------------------------------
# The algorithm cache


def test_default_capacities_and_stats_fields(algo_cache, plan_cache):
    assert conv.algorithm_cache_capacity() == 4096
    assert conv.plan_cache_capacity() == 1024
    stats = conv.algorithm_cache_stats()
    assert set(stats) == {"hits", "misses", "finds", "entries", "capacity", "evictions"}
    assert stats["capacity"] == 4096 and stats["entries"] == 0
    plans = conv.plan_cache_stats()
    assert set(plans) == {"plans", "capacity", "evictions", "pinned"}
    assert (plans["plans"], plans["capacity"], plans["pinned"]) == (0, 1024, 0)


def test_inserting_past_the_capacity_evicts_the_least_recently_used(algo_cache):
    conv.set_algorithm_cache_capacity(4)
    evictions = conv.algorithm_cache_stats()["evictions"]
    insert(1, 2, 3, 4, 5, 6)
    assert cached_keys() == [key(n) for n in (3, 4, 5, 6)]
    stats = conv.algorithm_cache_stats()
    assert stats["entries"] == 4 and stats["capacity"] == 4
    assert stats["evictions"] == evictions + 2
    assert C.algo_cache_lookup(key(1)) is None and C.algo_cache_lookup(key(2)) is None


def test_a_lookup_promotes_and_inspection_does_not(algo_cache):
    conv.set_algorithm_cache_capacity(3)
    insert(1, 2, 3)
    before = conv.algorithm_cache_stats()
    assert C._testing.algo_cache_touch(key(1))  # as a convolution looks its problem up: 1 is now the most recent
    assert not C._testing.algo_cache_touch(key(99))
    after = conv.algorithm_cache_stats()
    assert (after["hits"], after["misses"]) == (before["hits"] + 1, before["misses"] + 1)
    assert cached_keys() == [key(n) for n in (2, 3, 1)]
    # Inspection (last_algorithm's lookup, the entries list) leaves the order alone: 2 is still the oldest.
    assert C.algo_cache_lookup(key(2)) is not None
    conv.algorithm_cache_entries()
    insert(4)
    assert cached_keys() == [key(n) for n in (3, 1, 4)]


def test_replacing_an_entry_promotes_it_and_evicts_nothing(algo_cache):
    conv.set_algorithm_cache_capacity(3)
    insert(1, 2, 3)
    evictions = conv.algorithm_cache_stats()["evictions"]
    C.algo_cache_insert(key(1), dict(CHOICE, algo=2))
    assert cached_keys() == [key(n) for n in (2, 3, 1)]
    assert C.algo_cache_lookup(key(1))["algo"] == 2
    assert conv.algorithm_cache_stats()["evictions"] == evictions


def test_shrinking_the_capacity_evicts_at_once_and_growing_keeps_everything(algo_cache):
    conv.set_algorithm_cache_capacity(10)
    insert(*range(1, 9))
    C._testing.algo_cache_touch(key(2))
    evictions = conv.algorithm_cache_stats()["evictions"]
    conv.set_algorithm_cache_capacity(3)
    assert cached_keys() == [key(n) for n in (7, 8, 2)]
    assert conv.algorithm_cache_stats()["evictions"] == evictions + 5
    conv.set_algorithm_cache_capacity(100)
    assert cached_keys() == [key(n) for n in (7, 8, 2)]
    insert(9)
    assert len(cached_keys()) == 4
    # Clearing is no eviction, and keeps the counters.
    conv.clear_algorithm_cache()
    stats = conv.algorithm_cache_stats()
    assert stats["entries"] == 0 and stats["evictions"] == evictions + 5 and stats["capacity"] == 100


def test_a_capacity_of_one_keeps_the_newest(algo_cache):
    conv.set_algorithm_cache_capacity(1)
    insert(1, 2, 3)
    assert cached_keys() == [key(3)]


SETTERS = {"algorithm": conv.set_algorithm_cache_capacity, "plan": conv.set_plan_cache_capacity}
NOT_AN_INT = "capacity: expected an int number of entries, got "
OUT_OF_RANGE = "capacity: expected a number of entries between 1 and 9223372036854775807, got "


@pytest.mark.parametrize("which", SETTERS)
@pytest.mark.parametrize(
    "value,error,message",
    [
        (True, TypeError, NOT_AN_INT + "True"),  # True == 1 in Python
        (False, TypeError, NOT_AN_INT + "False"),
        (2.0, TypeError, NOT_AN_INT + "2.0"),
        ("8", TypeError, NOT_AN_INT + "'8'"),
        (None, TypeError, NOT_AN_INT + "None"),
        (0, ValueError, OUT_OF_RANGE + "0"),
        (-1, ValueError, OUT_OF_RANGE + "-1"),
        (2**63, ValueError, OUT_OF_RANGE + "9223372036854775808"),
    ],
    ids=repr,
)
def test_capacities_must_be_positive_ints(algo_cache, plan_cache, which, value, error, message):
    before = (conv.algorithm_cache_capacity(), conv.plan_cache_capacity())
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        SETTERS[which](value)
    assert (conv.algorithm_cache_capacity(), conv.plan_cache_capacity()) == before


def test_numpy_integers_are_capacities_and_the_native_setters_check_too(algo_cache, plan_cache):
    conv.set_algorithm_cache_capacity(np.int64(7))
    conv.set_plan_cache_capacity(np.uint16(5))
    assert (conv.algorithm_cache_capacity(), conv.plan_cache_capacity()) == (7, 5)
    assert conv.algorithm_cache_stats()["capacity"] == 7 and conv.plan_cache_stats()["capacity"] == 5
    for setter in (C.algo_cache_set_capacity, C.graph_set_plan_cache_capacity):
        with pytest.raises(ValueError, match="^capacity: must be at least 1"):
            setter(0)
        with pytest.raises(ValueError, match="^capacity: must be at least 1"):
            setter(-5)
    assert (conv.algorithm_cache_capacity(), conv.plan_cache_capacity()) == (7, 5)


# ------------------------------------------------------------------------------------------------------------------
# The cache file


def test_a_file_round_trip_restores_the_order(algo_cache, fake_gpu, tmp_path):
    insert(1, 2, 3, 4)
    C._testing.algo_cache_touch(key(2))
    order = cached_keys()
    assert order == [key(n) for n in (1, 3, 4, 2)]
    path = tmp_path / "algos.json"
    assert conv.save_algorithm_cache(path) == 4
    assert [e["key"] for e in json.loads(path.read_text())["entries"]] == order  # least recently used first
    conv.clear_algorithm_cache()
    assert conv.load_algorithm_cache(path) == 4
    assert cached_keys() == order


def test_a_file_longer_than_the_capacity_leaves_its_most_recent_entries(algo_cache, fake_gpu, tmp_path):
    insert(*range(1, 7))
    C._testing.algo_cache_touch(key(1))  # order now 2, 3, 4, 5, 6, 1
    path = tmp_path / "algos.json"
    conv.save_algorithm_cache(path)
    conv.clear_algorithm_cache()
    insert(50, 51)  # cached before the load: evicted first
    conv.set_algorithm_cache_capacity(3)
    evictions = conv.algorithm_cache_stats()["evictions"]
    assert conv.load_algorithm_cache(path) == 6  # what the file holds
    assert cached_keys() == [key(n) for n in (5, 6, 1)]
    assert conv.algorithm_cache_stats()["evictions"] == evictions + 5  # 50, 51, then the file's 2, 3 and 4
    assert conv.algorithm_cache_stats()["entries"] == 3


# ------------------------------------------------------------------------------------------------------------------
# The plan cache, with placeholder plans


def plan_stats():
    return conv.plan_cache_stats()


def add(n, pin=False):
    return C._testing.graph_plan_cache_add_placeholder(key(n), -1, "", pin)


def test_plan_cache_evicts_the_least_recently_used(plan_cache):
    conv.set_plan_cache_capacity(3)
    evictions = plan_stats()["evictions"]
    for n in (1, 2, 3):
        assert add(n)
    assert C._testing.graph_plan_cache_find(key(1), -1)  # 1 is now the most recently used
    assert add(4)  # evicts 2
    stats = plan_stats()
    assert stats["plans"] == 3 and C.graph_num_plans() == 3
    assert stats["evictions"] == evictions + 1
    assert not C._testing.graph_plan_cache_find(key(2), -1)
    assert all(C._testing.graph_plan_cache_find(key(n), -1) for n in (3, 1, 4))
    # Keys differ by knobs and engine id too.
    assert C._testing.graph_plan_cache_add_placeholder(key(4), -1, "TILE_K=2")
    assert C._testing.graph_plan_cache_add_placeholder(key(4), -2)
    assert not C._testing.graph_plan_cache_find(key(3), -1) and not C._testing.graph_plan_cache_find(key(1), -1)
    assert plan_stats()["evictions"] == evictions + 3


def test_a_cached_plan_of_the_same_key_is_kept(plan_cache):
    conv.set_plan_cache_capacity(2)
    assert add(1) and add(2)
    assert not add(1)  # kept, not replaced (a captured graph may launch it), and now the most recently used
    assert add(3)  # evicts 2
    assert C._testing.graph_plan_cache_find(key(1), -1) and not C._testing.graph_plan_cache_find(key(2), -1)
    assert plan_stats()["plans"] == 2


def test_pinned_plans_are_never_evicted(plan_cache):
    conv.set_plan_cache_capacity(2)
    assert add(1, pin=True)  # cached during a capture
    assert add(2)
    assert C._testing.graph_plan_cache_find(key(2), -1, "", True)  # found during a capture: pinned too
    assert add(2) is False and plan_stats()["pinned"] == 2  # pinned once
    for n in range(3, 8):
        assert add(n)
    stats = plan_stats()
    # The two pinned plans stay beyond the capacity, beside the most recently used plan.
    assert stats["pinned"] == 2 and stats["plans"] == 3
    assert C._testing.graph_plan_cache_find(key(1), -1) and C._testing.graph_plan_cache_find(key(2), -1)
    assert C._testing.graph_plan_cache_find(key(7), -1)
    assert not any(C._testing.graph_plan_cache_find(key(n), -1) for n in range(3, 7))
    # Shrinking skips them too; clearing drops them.
    conv.set_plan_cache_capacity(1)
    assert plan_stats()["plans"] == 3
    C.graph_clear_plans()
    assert plan_stats()["plans"] == 0 and plan_stats()["pinned"] == 0


def test_shrinking_the_plan_capacity_evicts_at_once(plan_cache):
    conv.set_plan_cache_capacity(8)
    for n in range(1, 7):
        add(n)
    evictions = plan_stats()["evictions"]
    conv.set_plan_cache_capacity(2)
    assert plan_stats()["plans"] == 2 and plan_stats()["evictions"] == evictions + 4
    assert C._testing.graph_plan_cache_find(key(5), -1) and C._testing.graph_plan_cache_find(key(6), -1)
    rn._drop_cached_descriptors()  # drops plans too, keeping the capacity
    assert plan_stats()["plans"] == 0 and plan_stats()["capacity"] == 2


def test_placeholders_take_negative_engine_ids_only(plan_cache):
    with pytest.raises(ValueError, match="^engine_id: placeholder plans take negative engine ids, got 0"):
        C._testing.graph_plan_cache_add_placeholder(key(1), 0)
    with pytest.raises(ValueError, match="engine_id"):
        C._testing.graph_plan_cache_find(key(1), 17)
    assert plan_stats()["plans"] == 0
