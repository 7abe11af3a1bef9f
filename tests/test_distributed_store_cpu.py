"""The TCP rendezvous store with real processes on loopback: check-in, set/get, barriers, the NCCL id exchange, and
the TimeoutErrors of a missing rank and of a rank 0 that never listens (resnet_native.distributed.store)."""

import json
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import child_env

from resnet_native.distributed import World, exchange_nccl_id, rendezvous
from resnet_native.distributed.launch import free_port

# One rank: rendezvous, then the steps named on its command line; prints one JSON line of results or the error.
RANK_SCRIPT = r"""
import json, sys, time
from resnet_native.distributed import World, exchange_nccl_id, rendezvous
rank, size, port = (int(a) for a in sys.argv[1:4])
timeout, steps = float(sys.argv[4]), sys.argv[5:]
world = World(rank, size, rank, "127.0.0.1", port)
t0, out, store = time.monotonic(), {"rank": rank}, None
try:
    store = rendezvous(world, timeout)
    for step in steps:
        if step == "nccl_id":
            out["id"] = exchange_nccl_id(store, world, lambda: bytes(range(128)) * 2, timeout).hex()
        elif step == "setget":
            store.set(f"from/{rank}", f"value of {rank}".encode())
            out["got"] = [store.get(f"from/{r}", timeout).decode() for r in range(size)]
        elif step.startswith("barrier"):
            if rank == 0 and step == "barrier_late0":
                time.sleep(0.5)
            store.barrier("b", timeout)
            out.setdefault("barriers", []).append(time.monotonic() - t0)
        elif step == "skip_barrier_on_last" and rank == size - 1:
            break
    store.barrier("end", timeout)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
finally:
    if store is not None:  # rank 0's close lets the others hang up first, so none loses an answer
        store.close()
out["elapsed"] = time.monotonic() - t0
print(json.dumps(out), flush=True)
"""


def run_ranks(ranks, size, timeout_s, steps=(), port=None, delays=None, limit_s=20.0):
    """Start the given ranks of a job of size as child Pythons (rank r after delays[r] s); their JSON results."""
    port = free_port() if port is None else port
    delays = delays or {}
    children = []
    start = time.monotonic()
    for rank in sorted(ranks, key=lambda r: delays.get(r, 0.0)):
        time.sleep(max(start + delays.get(rank, 0.0) - time.monotonic(), 0.0))
        children.append(subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(rank), str(size), str(port), str(timeout_s), *steps],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
            cwd=tempfile.gettempdir()))  # not the checkout: its unbuilt source tree would shadow the package
    results = {}
    for child in children:
        try:
            out, err = child.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            for c in children:
                c.kill()
            pytest.fail("a rank hung past its timeout")
        assert child.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        results[result["rank"]] = result
    return results


def test_three_ranks_meet_exchange_and_barrier():
    # Timeouts leave room for child Pythons that start slowly on a loaded 2-core CI machine.
    results = run_ranks(range(3), 3, 10.0, ["nccl_id", "setget", "barrier", "barrier"], delays={1: 0.3, 0: 0.6})
    assert all("error" not in r for r in results.values()), results
    assert {r["id"] for r in results.values()} == {(bytes(range(128)) * 2).hex()}  # rank 0's id, on every rank
    assert all(r["got"] == ["value of 0", "value of 1", "value of 2"] for r in results.values())
    assert all(len(r["barriers"]) == 2 for r in results.values())


def test_a_missing_rank_is_named_on_every_waiting_rank_within_the_timeout():
    results = run_ranks([0, 1], 4, 2.0)
    for rank in (0, 1):
        error = results[rank]["error"]
        assert error.startswith("TimeoutError: rendezvous at 127.0.0.1:"), error
        assert "ranks [2, 3] of 4 did not arrive within 2.0 s" in error
        assert 1.9 < results[rank]["elapsed"] < 8.0, results[rank]


def test_a_barrier_names_the_rank_that_never_comes():
    results = run_ranks(range(3), 3, 8.0, ["skip_barrier_on_last", "barrier"], limit_s=40.0)
    for rank in (0, 1):
        assert "barrier 'b' at 127.0.0.1:" in results[rank]["error"], results[rank]
        assert "ranks [2] of 3 did not arrive" in results[rank]["error"]
    assert "rank 0 stopped waiting" in results[2]["error"] or "ranks [0, 1]" in results[2]["error"]


def test_a_master_that_never_listens():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=f"rendezvous: no store at 127.0.0.1:{port} within 1.0 s"):
        rendezvous(World(1, 2, 1, "127.0.0.1", port), 1.0)
    assert time.monotonic() - t0 < 3.0


def test_single_process_store_get_and_exchange_in_process():
    world = World(0, 1, 0, "127.0.0.1", free_port())
    with rendezvous(world, 2.0) as store:
        store.set("k", b"\x00\xff" * 1000)
        assert store.get("k", 1.0) == b"\x00\xff" * 1000
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="key 'absent' was not set within 0.3 s"):
            store.get("absent", 0.3)
        assert time.monotonic() - t0 < 2.0
        store.barrier("alone", 1.0)
        store.barrier("alone", 1.0)  # a repeated name is a new barrier
        assert exchange_nccl_id(store, world, lambda: b"id") == b"id"
        with pytest.raises(TypeError, match="make_id: expected it to return bytes, got tuple"):
            exchange_nccl_id(store, world, lambda: (1, 2))
        with pytest.raises(TypeError, match="value: expected bytes"):
            store.set("k", "text")
        with pytest.raises(ValueError, match="timeout_s"):
            store.get("k", -1)


def test_rank0_port_taken_is_named():
    port = free_port()
    with rendezvous(World(0, 1, 0, "127.0.0.1", port), 2.0), pytest.raises(
            OSError, match=f"rank 0 cannot listen on 127.0.0.1:{port}"):
        rendezvous(World(0, 1, 0, "127.0.0.1", port), 1.0)
