"""benchmarks/bench_tta.py without a GPU: the ratio column against the same model and batch without TTA, the
modes it times (the package's), and its refusal of an unknown model before any GPU work."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_tta  # noqa: E402

from resnet_native._core.names import TTA_MODES  # noqa: E402


def test_each_row_is_divided_by_its_own_plain_row():
    rows = [dict(model="resnet18", batch=b, tta=t, median_ms=ms)
            for b, t, ms in ((1, "none", 0.2), (1, "flip", 0.5), (8, "none", 1.0), (8, "flip-shift", 6.5))]
    rows.append(dict(model="resnet50", batch=1, tta="flip", median_ms=3.0))  # no plain row: no ratio
    bench_tta.add_ratios(rows)
    assert [r.get("x_none") for r in rows] == [1.0, pytest.approx(2.5), 1.0, 6.5, None]
    table = bench_tta.markdown_table(rows, bench_tta.COLUMNS)
    assert table.splitlines()[0] == "| model | batch | tta | median ms | p99 ms | images/s | x none |"
    assert "| resnet18 | 8 | flip-shift | 6.500 |" in table


def test_it_times_every_mode_and_refuses_unknown_models():
    assert bench_tta.MODES == TTA_MODES
    args = bench_tta.build_parser().parse_args([])
    assert (args.models, args.batches, args.dtype) == ("resnet18,resnet50", "1,32,256,1024", "fp16")
    with pytest.raises(SystemExit, match="--models: unknown resnet34"):
        bench_tta.main(["--models", "resnet18,resnet34"])
