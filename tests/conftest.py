"""Shared test plumbing.

- `gpu` tests skip on machines without a usable CUDA GPU (CI has none); one summary line gives their number and
  the reason, also under -q, which hides skip reasons.
- `data` tests skip when the CIFAR-10 archive is absent.
- Every test is checked for leaked cuDNN descriptors: the C++ live counters must be back to where they were.
- Tiers: a test file's name ends in `_cpu.py` (runs anywhere; marked `cpu`) or `_gpu.py` (needs a GPU; marked `gpu`);
  any other test file name fails collection. `quick` marks the fast CPU tier chosen in QUICK below.
"""

import gc
import os
import pathlib
import zlib

import pytest

import resnet_native as rn
from resnet_native.ops import algo_cache

REPO = pathlib.Path(__file__).resolve().parent.parent
CIFAR_CANDIDATES = [
    REPO / ".data" / "cifar10-jpeg.tar.xz",
    REPO / ".data" / "cifar10-jpeg",
    REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.xz",
]


def cifar_path():
    """The CIFAR-10 JPEG copy (archive or extracted folder), or None."""
    env = os.environ.get("RESNET_NATIVE_CIFAR10")
    for p in ([pathlib.Path(env)] if env else []) + CIFAR_CANDIDATES:
        if p.exists():
            return p
    return None


def child_env(**extra):
    """Environment for a child Python run from another directory: the resnet_native this process imported
    (installed, or built in place) first on its path, so the child never picks up an unbuilt source tree."""
    path = [str(pathlib.Path(rn.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)), **extra)


def run_child(script: str, cwd) -> str:
    """Run `script` in a child Python (cwd, child_env()); fails the test unless it exits 0; returns its stdout."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=child_env(), cwd=cwd)
    assert out.returncode == 0, out.stderr
    return out.stdout


NO_GPU = "no CUDA GPU or driver"
_gpu_skip_reason = pytest.StashKey[str]()  # set at collection: the skip reason of gpu tests, or None


def gpu_unavailable_reason():
    """Why GPU tests skip here, starting with NO_GPU; None when a GPU is usable."""
    if rn.cuda_available():
        return None
    reason = rn._C.device_unavailable_reason()
    return reason if reason.startswith(NO_GPU) else f"{NO_GPU} ({reason})"


# ---------------------------------------------------------------------------------------------------------------
# Test tiers: `pytest -m quick` (the quick CPU tier, under 2 minutes on 2 cores), `pytest -q` (the full CPU tier,
# README's and CI's command; GPU tests skip), `pytest -q -m gpu` (the GPU tier, on a GPU machine).
# The tier of a file is in its name: `test_*_cpu.py` (marked `cpu`) or `test_*_gpu.py` (marked `gpu`).
# QUICK is the one place that says which CPU tests are also `quick`, by file:
#   ALL                  every test of the file;
#   all_but("name", ..)  every test except those (slow ones);
#   only("name", ..)     just those (for a big file whose few fast tests cover its area).
# Names are test functions (or test classes) of the file; a parametrized test is in or out as a whole. A file not
# listed is not in the quick tier. Collection fails for a key that is not a file in tests/ or a name the file lacks.
# ---------------------------------------------------------------------------------------------------------------
TIER_SUFFIXES = ("_cpu.py", "_gpu.py")
ALL = ("all_but", frozenset())


def all_but(*slow):
    return ("all_but", frozenset(slow))


def only(*fast):
    return ("only", frozenset(fast))


QUICK = {
    "test_bench_cpu.py": ALL,
    "test_bench_infer_cpu.py": ALL,
    "test_bench_serve_cpu.py": only(
        "test_percentiles_and_arguments",
    ),
    "test_boundary_cpu.py": ALL,
    "test_boundary_fuzz_cpu.py": only(
        "test_every_op_with_array_arguments_is_covered",
    ),
    "test_cache_bound_cpu.py": ALL,
    "test_checkpoint_cpu.py": all_but(
        "test_killed_writers_leave_nothing_a_restart_keeps",
        "test_malformed_checkpoints_raise_value_error_naming_the_file",
    ),
    "test_choice_cache_cpu.py": ALL,
    "test_classifier_cpu.py": all_but(
        "test_single_image_forms_agree",
        "test_the_onnxruntime_and_numpy_backends_agree",
        "test_without_a_gpu_the_release_runs_on_the_cpu_and_says_so_once",
    ),
    "test_config_cpu.py": all_but(
        "test_invalid_configurations_name_the_key",
    ),
    "test_conv_args_cpu.py": all_but(
        "test_bad_arguments_raise_before_device_access",
    ),
    "test_conv_key_cpu.py": ALL,
    "test_conv_cache_cpu.py": all_but(
        "test_key_differs_on_every_field",
    ),
    "test_conv_spec_cpu.py": ALL,
    "test_core_cpu.py": ALL,
    "test_data_augment_cpu.py": ALL,
    "test_data_autoaugment_cpu.py": all_but(
        "test_batched_policy_equals_pil",
    ),
    "test_data_formats_cpu.py": all_but(
        "test_real_cifar10_archive",
    ),
    "test_distributed_allreduce_cpu.py": ALL,
    "test_distributed_buckets_cpu.py": ALL,
    "test_distributed_launch_cpu.py": all_but(
        "test_one_failure_stops_the_others_and_names_its_rank",
        "test_the_launchers_timeout",
    ),
    "test_distributed_overlap_cpu.py": all_but(
        "test_an_overlapped_step_trains_like_the_plain_one",
        "test_backward_reports_every_parameter_once_in_the_order_it_is_final",
    ),
    "test_distributed_sharding_cpu.py": ALL,
    "test_distributed_store_cpu.py": all_but(
        "test_a_barrier_names_the_rank_that_never_comes",
        "test_a_master_that_never_listens",
        "test_a_missing_rank_is_named_on_every_waiting_rank_within_the_timeout",
    ),
    "test_distributed_world_cpu.py": ALL,
    "test_download_cpu.py": all_but(
        "test_interrupted_download_leaves_no_partial_file",
    ),
    "test_epoch_timeline_cpu.py": ALL,
    "test_graph_conv_cpu.py": all_but(
        "test_build_single_convolution",
    ),
    "test_inference_cpu.py": all_but(
        "test_engine_validates_its_arguments_first",
    ),
    "test_inference_plan_cpu.py": all_but(
        "test_bound_plan_equals_the_eval_graph_on_numpy_references",
        "test_buffers_never_hold_two_live_values_and_stay_few",
        "test_plan_shapes_strides_and_flops_follow_torchvision",
    ),
    "test_kernels_cpu.py": ALL,
    "test_layers_cpu.py": ALL,
    "test_loss_cpu.py": ALL,
    "test_models_cpu.py": all_but(
        "test_parameter_counts_match_torchvision",
        "test_state_dict_names_and_shapes_match_torchvision",
        "test_state_dict_round_trip_through_npz",
    ),
    "test_models_graph_cpu.py": only(
        "test_eval_uses_running_statistics_and_train_does_not",
        "test_forward_returns_a_copy_and_backward_needs_a_training_forward",
        "test_grad_scaler_loads_its_state_into_the_arrays_a_captured_step_reads",
        "test_grad_scaler_skips_the_step_on_inf",
        "test_model_input_validation",
    ),
    "test_multi_tensor_cpu.py": ALL,
    "test_names_cpu.py": ALL,
    "test_norm_cpu.py": ALL,
    "test_onnx_export_cpu.py": all_but(
        "test_every_supported_opset_runs_the_same",
        "test_export_from_a_release_reads_its_metadata",
        "test_nodes_and_initializers_are_named_after_the_plan",
        "test_onnxruntime_matches_the_float64_forward",
    ),
    "test_optim_cpu.py": ALL,
    "test_own_conv_cpu.py": ALL,
    "test_package_layers_cpu.py": ALL,
    "test_host_checks_cpu.py": ALL,
    "test_file_schemas_cpu.py": ALL,
    "test_atomic_files_cpu.py": ALL,
    "test_packaging_cpu.py": all_but(
        "test_gpu_skips_are_summarised_once_under_q",
    ),
    "test_pool_cpu.py": ALL,
    "test_quant_calibration_cpu.py": all_but(
        "test_malformed_files_name_the_file_and_the_field",
    ),
    "test_quant_fp8_cpu.py": ALL,
    "test_quant_int8_cpu.py": ALL,
    "test_quant_prefix_cpu.py": ALL,
    "test_quant_simulate_cpu.py": all_but(
        "test_fake_quant_logits_within_the_derived_tolerance",
        "test_one_shared_pass_calibrates_every_method_and_dtype_as_separate_passes_do",
        "test_the_fp32_forward_agrees_with_float64",
    ),
    "test_quantized_conv_cpu.py": all_but(
        "test_the_engine_quantises_what_the_simulation_quantises",
    ),
    "test_reference_cpu.py": all_but(
        "test_native_op_functions_hand_numpy_arrays_to_their_reference",
    ),
    "test_release_cpu.py": only(
        "test_damaged_release_files_are_named",
        "test_release_cli",
        "test_release_of_the_last_checkpoint",
        "test_release_quantize_arguments_are_checked",
        "test_release_round_trip",
    ),
    "test_serve_batcher_cpu.py": all_but(
        "test_the_batcher_needs_no_server_packages",
    ),
    "test_serve_cli_cpu.py": only(
        "test_a_taken_port_exits_1",
    ),
    "test_serve_http_cpu.py": ALL,
    "test_snapshot_cpu.py": ALL,
    "test_sync_norm_cpu.py": ALL,
    "test_tar_stream_cpu.py": all_but(
        "test_every_format_and_compression_reads_as_tarfile_reads_it",
    ),
    "test_train_cli_cpu.py": all_but(
        "test_optimizer_adapter_and_state_round_trip",
    ),
    "test_train_dp_cpu.py": all_but(
        "test_synchronized_batch_norm_keeps_every_rank_on_the_same_statistics",
        "test_two_ranks_train_to_bit_identical_weights_and_only_rank_0_writes",
    ),
    "test_train_dryrun_cpu.py": only(
        "test_a_batch_larger_than_the_training_set_is_rejected_before_training",
        "test_algorithm_cache_problems_only_warn",
        "test_out_of_range_labels_are_rejected_before_training",
        "test_the_models_convolutions_take_the_configured_engine",
        "test_trainer_refuses_bool_step_counts",
    ),
    "test_warm_start_cpu.py": all_but(
        "test_batch_shapes",
    ),
}


class UntieredTestFile(pytest.File):
    """Stands for a test file whose name says no tier: collecting it fails, with the rule."""

    def collect(self):
        raise self.CollectError(
            f"{self.path.name}: a test file's name must end in _cpu.py (runs without a GPU) or _gpu.py (needs one; "
            "its tests are marked gpu and skip without one); rename it (see the tiers in tests/conftest.py)"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    if not module_path.name.endswith(TIER_SUFFIXES):
        return UntieredTestFile.from_parent(parent, path=module_path)
    return None


def _quick_rule(item):
    """The item's QUICK entry (kind, names) checked against its module, or None when its file is not listed."""
    rule = QUICK.get(item.path.name)
    if rule is None:
        return None
    kind, names = rule
    unknown = sorted(n for n in names if not hasattr(item.module, n))
    if unknown:
        raise pytest.UsageError(f"tests/conftest.py QUICK[{item.path.name!r}] names no test of that file: {unknown}")
    return kind, names


def _is_quick(item, rule):
    kind, names = rule
    name = item.cls.__name__ if item.cls is not None and item.cls.__name__ in names else item.originalname
    return (name in names) == (kind == "only")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection, which then sees these markers
def pytest_collection_modifyitems(config, items):
    missing = sorted(f for f in QUICK if not (REPO / "tests" / f).is_file())
    if missing:
        raise pytest.UsageError(f"tests/conftest.py QUICK lists files that are not in tests/: {missing}")
    rules = {}
    for item in items:
        name = item.path.name
        if name.endswith("_gpu.py"):
            item.add_marker(pytest.mark.gpu)
        elif name.endswith("_cpu.py"):
            item.add_marker(pytest.mark.cpu)
            if name not in rules:
                rules[name] = _quick_rule(item)
            if rules[name] is not None and _is_quick(item, rules[name]):
                item.add_marker(pytest.mark.quick)

    reason = gpu_unavailable_reason()
    config.stash[_gpu_skip_reason] = reason
    no_gpu = None if reason is None else pytest.mark.skip(reason=reason)
    no_data = None if cifar_path() else pytest.mark.skip(
        reason="needs CIFAR-10 (.data/cifar10-jpeg.tar.xz or ../shared/data/cifar10-jpeg.tar.xz)"
    )
    for item in items:
        if no_gpu is not None and "gpu" in item.keywords:
            item.add_marker(no_gpu)
        if no_data is not None and "data" in item.keywords:
            item.add_marker(no_data)


def pytest_terminal_summary(terminalreporter, config):
    """'N tests skipped: no CUDA GPU or driver (...)', once, whatever the verbosity."""
    reason = config.stash.get(_gpu_skip_reason, None)
    if reason is None:
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple) and str(r.longrepr[2]).endswith(reason)]
    if skipped:
        terminalreporter.write_line(f"{len(skipped)} tests skipped: {reason}")


def pytest_collection_finish(session):
    """Moves what collection made (the test modules, their imports, every item) out of the collector's reach: each
    test's leak check runs gc.collect(), which would otherwise walk all of it (about 0.2 s a call, 2 cores, full
    collection: most of a quick test's time)."""
    gc.collect()
    gc.freeze()


def _live():
    gc.collect()
    return {k: v for k, v in rn.live_descriptors().items() if k != "handle"}


@pytest.fixture(autouse=True)
def no_descriptor_leaks(request):
    """Fails a test that leaves cuDNN descriptors alive (cached plans are dropped first)."""
    before = _live()
    yield
    if "allow_cached_descriptors" in request.keywords:
        return
    # Execution plans and descriptors held by caches are not leaks, but they must be releasable: drop them.
    drop = getattr(rn, "_drop_cached_descriptors", None)
    if drop is not None:
        drop()
    after = _live()
    grown = {k: (before.get(k, 0), v) for k, v in after.items() if v > before.get(k, 0)}
    assert not grown, f"descriptors leaked by this test (kind: (before, after)): {grown}"


@pytest.fixture
def rng(request):
    """A fresh NumPy generator per test, seeded from the test's name (reproducible, different per test)."""
    import numpy as np

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# The algorithm cache files' tests (test_conv_cache_cpu.py, test_choice_cache_cpu.py): an empty process cache, and
# a device identity the test can change (the file header's GPU model and cuDNN version).
@pytest.fixture
def empty_cache():
    rn.conv.clear_algorithm_cache()
    yield
    rn.conv.clear_algorithm_cache()


@pytest.fixture
def fake_gpu(monkeypatch):
    identity = {"value": ("Fake GPU 9000", 91900, 0)}
    monkeypatch.setattr(algo_cache, "_device_identity", lambda: identity["value"])
    return identity
