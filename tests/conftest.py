"""Shared test plumbing.

- `gpu` tests skip on machines without a usable CUDA GPU (CI has none); one summary line gives their number and
  the reason, also under -q, which hides skip reasons.
- `data` tests skip when the CIFAR-10 archive is absent.
- Every test is checked for leaked cuDNN descriptors: the C++ live counters must be back to where they were.
"""

import gc
import os
import pathlib
import zlib

import pytest

import resnet_native as rn

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


def pytest_collection_modifyitems(config, items):
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
    monkeypatch.setattr(rn.conv, "_device_identity", lambda: identity["value"])
    return identity
