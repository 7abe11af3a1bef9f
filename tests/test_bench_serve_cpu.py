"""benchmarks/bench_serve.py without a GPU, on the fake engine: a bounded run of every mode, its JSON and table,
and that batching beats one engine call per image when each call has a large fixed cost."""

import json
import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

import bench_serve  # noqa: E402


def test_percentiles_and_arguments():
    assert bench_serve.percentile([], 50) is None
    samples = list(range(1, 101))
    assert bench_serve.percentile(samples, 50) == 50 and bench_serve.percentile(samples, 99) == 99
    assert bench_serve.percentile([3.0], 99) == 3.0
    args = bench_serve.resolve_args(["--fake-engine-ms", "20,0.1", "--modes", "batched,sequential"])
    assert args.modes == ("batched", "sequential") and args.clients == 32
    for bad in (["--fake-engine-ms", "20"], ["--fake-engine-ms", "1,1", "--modes", "fast"],
                ["--fake-engine-ms", "1,1", "--clients", "0"], ["--release", "x", "--fake-engine-ms", "1,1"], []):
        with pytest.raises(SystemExit):
            bench_serve.resolve_args(bad)


def test_a_bounded_run_and_batching_beats_one_call_per_image(tmp_path, capsys):
    out = tmp_path / "serve.json"
    limit = 40.0
    start = time.monotonic()
    payload = bench_serve.main(["--fake-engine-ms", "25,0.05", "--clients", "16", "--requests", "200",
                                "--time-limit-s", str(limit), "--max-delay-ms", "2", "--out", str(out)])
    wall = time.monotonic() - start
    assert wall < limit + 20.0  # the limit, plus starting and stopping servers
    assert json.loads(out.read_text())["modes"].keys() == payload["modes"].keys() == set(bench_serve.MODES)
    for mode, row in payload["modes"].items():
        assert row["images_per_s"] > 0 and row["p50_ms"] > 0 and row["p99_ms"] >= row["p50_ms"], mode
        assert row["failed"] == 0 and (row["ok"] == 200 or row["stopped_by"] == "time_limit"), row
    batched, sequential = payload["modes"]["batched"], payload["modes"]["sequential"]
    assert batched["max_batch"] == 256 and batched["mean_batch"] > 2
    assert payload["modes"]["server_batch_1"]["mean_batch"] == 1.0
    assert sequential["p50_ms"] >= 25.0  # every call pays the fixed cost
    # 16 clients, 25 ms per call: batches of several images per call. 16 images a call would give 16x; demand 3x.
    assert batched["images_per_s"] > 3 * sequential["images_per_s"], payload["modes"]
    assert payload["batched_over_sequential"] == pytest.approx(batched["images_per_s"] / sequential["images_per_s"])
    table = capsys.readouterr().out
    assert "| mode | max batch |" in table and "| batched | 256 | 2.0 | 16 |" in table


def test_the_time_limit_stops_every_mode(tmp_path):
    start = time.monotonic()
    payload = bench_serve.main(["--fake-engine-ms", "50,0", "--clients", "4", "--requests", "100000",
                                "--time-limit-s", "4", "--modes", "server_batch_1,sequential",
                                "--out", str(tmp_path / "serve.json")])
    assert time.monotonic() - start < 4 + 15.0
    rows = payload["modes"]
    assert [r["stopped_by"] for r in rows.values()] == ["time_limit", "time_limit"]
    assert all(0 < r["ok"] < 100 for r in rows.values()), rows  # about 2 s each at 50 ms a call


def test_workers_run_the_server_as_a_child_process(tmp_path, monkeypatch):
    for bad in (["--fake-engine-ms", "1,1", "--workers", "0"], ["--model", "resnet18", "--workers", "2"]):
        with pytest.raises(SystemExit):
            bench_serve.resolve_args(bad)
    monkeypatch.chdir(tmp_path)  # the child server imports the resnet_native this process did, from anywhere
    start = time.monotonic()
    payload = bench_serve.main(["--fake-engine-ms", "5,0.01", "--workers", "2", "--clients", "8", "--requests", "200",
                                "--time-limit-s", "20", "--modes", "batched,server_batch_1", "--client-processes", "0",
                                "--out", str(tmp_path / "serve.json")])
    assert time.monotonic() - start < 20 + 15.0
    for mode, row in payload["modes"].items():
        assert row["workers"] == 2 and row["failed"] == 0 and row["ok"] > 0 and row["images_per_s"] > 0, row
        assert row["batches"] > 0, mode
    assert payload["modes"]["server_batch_1"]["mean_batch"] == 1.0
