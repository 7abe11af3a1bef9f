"""benchmarks/ without a GPU: the CUDA-graph (device-only) and host-time measurement loops driven by fake clocks,
bench_block's command line, and results_markdown's tables for runs with and without the new measurements."""

import pathlib
import sys

import pytest

import resnet_native as rn

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_block  # noqa: E402
import common  # noqa: E402
import results_markdown  # noqa: E402


class FakeGpu:
    """A stream whose work is `launch()`es of `ms_per_launch` each; events read the time the stream reached."""

    def __init__(self, ms_per_launch):
        self.ms_per_launch = ms_per_launch
        self.now = 0.0
        self.launches = 0
        self.synchronized = 0

    def launch(self):
        self.launches += 1
        self.now += self.ms_per_launch

    def new_event(self):
        gpu = self

        class Event:
            def record(self):
                self.at = gpu.now

            def synchronize(self):
                pass

        return Event()

    @staticmethod
    def elapsed_ms(start, end):
        return end.at - start.at

    def synchronize(self):
        self.synchronized += 1


def test_graphed_divides_one_replay_by_the_calls_it_holds():
    gpu = FakeGpu(ms_per_launch=2.0)
    result = common._graphed(gpu.launch, 20, warmup=3, repeats=5, new_event=gpu.new_event,
                             elapsed_ms=gpu.elapsed_ms, synchronize=gpu.synchronize)
    assert result["median_ms"] == pytest.approx(0.1) and result["min_ms"] == result["max_ms"]
    assert result["repeats"] == 5 and result["inner"] == 20
    # warm-up, then per sample an untimed replay (hides the launch latency) and the timed one
    assert gpu.launches == 3 + 2 * 5 and gpu.synchronized == 1


def test_host_time_is_wall_clock_per_call(monkeypatch):
    clock = {"t": 100.0}
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock["t"])
    calls, syncs = [], []

    def fn():
        calls.append(1)
        clock["t"] += 25e-6  # 25 us of host time per call

    result = common.host_time_us(fn, lambda: syncs.append(1), calls=100, warmup=4, repeats=3)
    assert result["median_us"] == pytest.approx(25.0) and result["calls"] == 100 and result["repeats"] == 3
    assert len(calls) == 4 + 3 * 100
    assert len(syncs) == 1 + 3  # after the warm-up and at the end of every sample (inside its timing)


def test_command_line_defaults_and_switches():
    args = bench_block.parse_args([])
    assert args.graphed and args.host_overhead and args.graph_calls == 20 and args.host_calls == 2000
    quick = bench_block.parse_args(["--quick"])
    assert quick.graph_calls == 5 and quick.host_calls == 200 and quick.block_table is bench_block.QUICK_BLOCKS
    off = bench_block.parse_args(["--quick", "--no-graphed", "--no-host-overhead", "--graph-calls", "7",
                                  "--host-calls", "50"])
    assert not off.graphed and not off.host_overhead and off.graph_calls == 7 and off.host_calls == 50
    for bad in (["--graph-calls", "0"], ["--host-calls", "-1"], ["--layouts", "CHWN"]):
        with pytest.raises(SystemExit):
            bench_block.parse_args(bad)


def test_bench_needs_a_gpu_and_says_so(capsys):
    if rn.cuda_available():
        pytest.skip("this machine has a GPU (tests/test_bench_gpu.py runs the bench)")
    assert bench_block.main(["--quick", "--no-torch"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def per_conv_row(direction, **timings):
    row = {"block": "basic_quick_s2", "conv": "conv1", "layout": "NHWC", "precision": "fp16", "n": 4, "c_in": 16,
           "c_out": 32, "kernel": 3, "stride": 2, "hw": 8, "direction": direction}
    row.update(timings)
    return row


def cells(line, header):
    return dict(zip(header, [c.strip() for c in line.strip("|").split("|")], strict=True))


def test_markdown_renders_device_time_and_host_cost_tables():
    d = {
        "engines": ["legacy", "graph"],
        "per_conv": [
            per_conv_row("forward", legacy_ms=0.050, legacy_graphed_ms=0.010, graph_ms=0.044, graph_graphed_ms=0.008,
                         torch_ms=0.030, torch_graphed_ms=0.009, legacy_graphed_ratio=0.010 / 0.009,
                         graph_graphed_ratio=0.008 / 0.009),
            per_conv_row("backward_data", legacy_ms=0.050, graph_ms=0.040,
                         graph_graphed_error="ValueError: capture failed", torch_ms=0.030),
        ],
        "host_overhead": [
            {"direction": "forward", "problem": "NHWC fp16 x=(8, 8, 8, 64) w=(64, 1, 1, 64)", "calls": 2000,
             "legacy_us": 21.5, "legacy_bare_us": 15.25, "legacy_device_us": 3.1, "graph_us": 24.0,
             "graph_bare_us": 18.0, "graph_device_us": 2.9, "torch_us": 9.0, "torch_device_us": 3.0},
        ],
    }
    lines = results_markdown.per_conv_graphed_table(d).splitlines()
    assert len(lines) == 4  # header, rule, both rows (one with a failed capture)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    forward, backward = cells(lines[2], header), cells(lines[3], header)
    assert forward["legacy graphed ms"] == "0.010" and forward["graph graphed ms"] == "0.008"
    assert forward["torch graphed ms"] == "0.009" and forward["graph/torch graphed"] == "0.89"
    assert forward["graph loop/graphed"] == "5.50" and forward["torch loop/graphed"] == "3.33"
    assert backward["graph graphed ms"] == "failed" and backward["legacy graphed ms"] == "-"

    host = results_markdown.host_overhead_table(d)
    assert host.startswith("NHWC fp16 x=(8, 8, 8, 64) w=(64, 1, 1, 64), 2000 calls")
    assert "| forward | 21.5 | 15.2 | 3.1 | 24.0 | 18.0 | 2.9 | 9.0 | 3.0 |" in host


def test_markdown_of_a_run_without_the_new_measurements():
    d = {"per_conv": [per_conv_row("forward", legacy_ms=0.05, torch_ms=0.03)]}
    assert results_markdown.per_conv_graphed_table(d) is None
    assert results_markdown.host_overhead_table(d) is None
    assert "0.050" in results_markdown.per_conv_table(d)


def test_text_columns_name_the_new_fields():
    keys = [k for k, _ in bench_block.per_conv_columns(["legacy", "graph"])]
    assert {"legacy_graphed_ms", "graph_graphed_ms", "torch_graphed_ms", "graph_graphed_ratio"} <= set(keys)
    keys = [k for k, _ in bench_block.host_overhead_columns(["graph"])]
    assert keys == ["direction", "graph_us", "graph_bare_us", "graph_device_us", "torch_us", "torch_device_us"]
