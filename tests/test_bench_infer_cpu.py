"""benchmarks/bench_infer.py without a GPU: per-call latency statistics driven by a fake clock, its command line
(quick defaults, the --compile selection), the rate and ratio columns and the Markdown table."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_infer  # noqa: E402


class _FakeClock:
    """Events that read a clock each call advances by its own duration."""

    def __init__(self, durations):
        self.durations, self.now, self.synced = durations, 0.0, 0

    def call(self, i):
        self.now += self.durations[i % len(self.durations)]

    def new_event(self):
        clock = self

        class Event:
            def record(self):
                self.at = clock.now

        return Event()

    def synchronize(self):
        self.synced += 1


def test_latency_is_per_call_with_median_and_p99():
    durations = [1.0] * 98 + [5.0, 9.0]
    clock = _FakeClock(durations)
    got = bench_infer.latency(clock.call, iters=100, warmup=100, new_event=clock.new_event,
                              elapsed_ms=lambda a, b: b.at - a.at, synchronize=clock.synchronize)
    assert got["median_ms"] == 1.0 and got["p99_ms"] == 9.0 and got["iters"] == 100
    assert got["mean_ms"] == pytest.approx((98 + 5 + 9) / 100)
    assert clock.synced == 2


def test_arguments_rates_ratios_and_markdown():
    args = bench_infer.resolve_args(["--quick", "--compile", "r50:256:fp16,resnet18:1:fp16", "--json", "x/out.json"])
    assert args.batches == (1, 32, 256) and args.dtypes == ("fp16",) and args.iters == 30
    assert args.compile == {("resnet50", 256, "fp16"), ("resnet18", 1, "fp16")} and args.markdown == "x/out.md"
    assert bench_infer.resolve_args([]).compile == set()
    assert len(bench_infer.resolve_args(["--compile", "all"]).compile) == 2 * 5 * 2
    with pytest.raises(SystemExit, match="--compile: expected"):
        bench_infer.resolve_args(["--compile", "r50:big:fp16"])
    with pytest.raises(SystemExit, match="--models"):
        bench_infer.resolve_args(["--models", "resnet34"])

    row = bench_infer.with_rates({"batch": 256, "median_ms": 2.0}, flops=int(790e9), peak_tflops=790.0)
    assert row["images_per_s"] == pytest.approx(128000) and row["tflops"] == pytest.approx(395.0)
    assert row["floor_pct"] == pytest.approx(50.0) and row["floor_ms"] == pytest.approx(1.0)
    config = dict(model="resnet18", dtype="fp16", batch=1)
    rows = [dict(config, impl="engine", median_ms=0.2), dict(config, impl="torch_graph", median_ms=0.3),
            dict(config, impl="torch_compile", median_ms=0.25), dict(config, batch=8, impl="engine", median_ms=1.0)]
    bench_infer.add_ratios(rows)
    assert rows[0]["vs_torch_graph"] == pytest.approx(2 / 3) and rows[0]["vs_torch_compile"] == pytest.approx(0.8)
    assert "vs_torch_graph" not in rows[3]
    table = bench_infer.markdown_table(rows)
    assert table.splitlines()[0].startswith("| model | dtype | batch | impl | median ms")
    assert "| resnet18 | fp16 | 1 | engine | 0.200 |" in table


def test_quantized_kernels_give_one_int8_engine_per_value():
    from resnet_native.inference import kernel_choice

    assert bench_infer.QUANTIZED_KERNELS == kernel_choice.QUANTIZED_KERNELS
    assert bench_infer.resolve_args([]).quantized_kernels == ("auto",)
    args = bench_infer.resolve_args(["--quantized-kernels", "auto,own,cudnn"])
    assert [bench_infer.quantized_impl("stem", k) for k in args.quantized_kernels] == [
        "engine_uint8", "engine_uint8_own", "engine_uint8_cudnn"]
    assert bench_infer.quantized_impl("layer3", "own") == "engine_uint8_from_layer3_own"
    with pytest.raises(SystemExit, match="--quantized-kernels"):
        bench_infer.resolve_args(["--quantized-kernels", "cutlass"])


def test_quantize_from_gives_one_quantised_engine_per_value():
    from resnet_native.quantization import prefix

    assert (bench_infer.QUANTIZE_FROM, bench_infer.AUTO) == (prefix.QUANTIZE_FROM, prefix.AUTO)
    assert bench_infer.resolve_args([]).quantize_from == ("stem",)
    args = bench_infer.resolve_args(["--quantize-from", "stem,layer2,auto"])
    assert args.quantize_from == ("stem", "layer2", "auto")
    assert [bench_infer.quantized_impl(q) for q in args.quantize_from] == [
        "engine_uint8", "engine_uint8_from_layer2", "engine_uint8_from_auto"]
    with pytest.raises(SystemExit, match="--quantize-from"):
        bench_infer.resolve_args(["--quantize-from", "layer9"])
    rows = [dict(model="resnet18", dtype="fp16", batch=8, impl="engine_uint8", median_ms=2.0),
            dict(model="resnet18", dtype="int8", batch=8, impl="engine_uint8", median_ms=4.0),
            dict(model="resnet18", dtype="int8", batch=8, impl="engine_uint8_from_layer1", median_ms=1.0)]
    bench_infer.add_ratios(rows)
    assert [r.get("x_fp16") for r in rows] == [None, 0.5, 2.0]
