"""The benchmark page's recipe filter: which recorded runs count as a recipe as shipped."""

import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from benchmark_page.recipes_section import as_shipped  # noqa: E402


def recipe_c(**progressive):
    return {"recipe": "C", "epochs": 72, "epochs_done": 72, "completed": True,
            "progressive": {"size": 20, "until": 0.6, **progressive}}


def test_a_run_counts_as_recipe_c_whether_its_summary_names_the_second_stage_or_not():
    assert as_shipped("C", recipe_c(), "--seed 3") == "3"  # a summary from before the second stage existed
    assert as_shipped("C", recipe_c(mid_size=0, mid_until=0.0), "--seed 0 --seed 4") == "4"  # the last one wins


def test_a_second_stage_is_not_recipe_c():
    assert as_shipped("C", recipe_c(mid_size=24, mid_until=0.8), "--seed 0") is None
    assert as_shipped("C", recipe_c(), "--seed 0 --progressive-mid-size 24") is None
    assert as_shipped("C", recipe_c(size=24), "--seed 0") is None
    assert as_shipped("C", {**recipe_c(), "epochs": 64, "epochs_done": 64}, "--seed 0 --epochs 64") is None


def test_recipe_c_starts_from_a_whitened_stem():
    assert as_shipped("C", {**recipe_c(), "stem": {"init": "whiten", "whiten_eps": 5e-4, "frozen": False}},
                      "--seed 1") == "1"
    assert as_shipped("C", recipe_c(), "--seed 2 --stem-init whiten") == "2"  # a summary from before it was recorded
    assert as_shipped("C", {**recipe_c(), "stem": {"init": "random", "frozen": False}}, "--seed 0") is None
    assert as_shipped("C", {**recipe_c(), "stem": {"init": "whiten", "frozen": True}}, "--seed 0") is None
    assert as_shipped("C", recipe_c(), "--seed 0 --stem-init random") is None
    assert as_shipped("C", recipe_c(), "--seed 0", folder=("2026-12-07", 44)) is None  # the definition before

