"""benchmarks/bench_block.py --quick on the GPU, restricted to one small block: every per-conv cell also has its
device time from a CUDA-graph replay, the host-cost table is filled for each engine (through the Python API and
the bare _C binding) and PyTorch, and results_markdown renders both new tables from the JSON."""

import json
import pathlib
import sys

import pytest

pytestmark = pytest.mark.gpu

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_block  # noqa: E402
import results_markdown  # noqa: E402


def test_quick_bench_records_device_time_and_host_cost(tmp_path):
    path = tmp_path / "bench_block.json"
    argv = ["--quick", "--blocks", "basic_quick_s2", "--layouts", "NHWC", "--precisions", "fp16", "--variants",
            "fused", "--algos", "find", "--json", str(path)]
    assert bench_block.main(argv) == 0
    d = json.loads(path.read_text())
    engines = d["engines"]
    assert "legacy" in engines
    with_torch = d["environment"].get("torch") is not None

    assert len(d["per_conv"]) == 3 * 3  # projection, conv1, conv2 x three directions
    for row in d["per_conv"]:
        where = f"{row['conv']} {row['direction']}"
        for e in engines:
            assert row.get(f"{e}_ms", 0) > 0, (where, row.get(f"{e}_error"))
            assert row.get(f"{e}_graphed_ms", 0) > 0, (where, row.get(f"{e}_graphed_error"))
        if with_torch:  # torch's own capture may fail; the bench must then say why in the row
            assert "torch_graphed_ms" in row or row.get("torch_graphed_error"), where

    host = d["host_overhead"]
    assert [r["direction"] for r in host] == ["forward", "backward_data", "backward_filter"]
    for r in host:
        assert r["calls"] == 200 and r["problem"] == bench_block.host_probe_name()
        for e in engines:
            for field in ("us", "bare_us", "device_us"):
                assert r.get(f"{e}_{field}", 0) > 0, (r["direction"], e, field, r.get(f"{e}_error"))
        if with_torch:
            assert r.get("torch_us", 0) > 0 or r.get("torch_error"), r["direction"]

    graphed = results_markdown.per_conv_graphed_table(d)
    assert graphed is not None and len(graphed.splitlines()) == 2 + 9
    host_table = results_markdown.host_overhead_table(d)
    assert host_table is not None and "| forward |" in host_table
