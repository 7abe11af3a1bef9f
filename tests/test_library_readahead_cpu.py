"""library_readahead: which files the trainer reads ahead, in what order, and that nothing it meets raises."""

import os

import pytest

from resnet_native import library_readahead


def test_the_wheels_libraries_come_in_the_order_a_step_needs_them():
    files = [os.path.basename(p) for p in library_readahead.library_files()]
    if not files:
        pytest.skip("no nvidia-* wheels installed here")
    assert any(f.startswith("libcudnn_engines_precompiled") for f in files)
    first = {prefix: next(i for i, f in enumerate(files) if f.startswith(prefix))
             for prefix in ("libcudnn_graph", "libcudnn_engines_precompiled", "libcudnn_adv")}
    assert first["libcudnn_graph"] < first["libcudnn_engines_precompiled"] < first["libcudnn_adv"], files
    assert not any(f.startswith(("libnccl", "libnvblas")) for f in files)  # not loaded by a training step


def test_readahead_reads_what_it_can_and_skips_the_rest(tmp_path):
    readable = tmp_path / "libx.so"
    readable.write_bytes(os.urandom(3 << 20))
    unreadable = tmp_path / "missing.so"
    thread = library_readahead.readahead([str(unreadable), str(readable), str(tmp_path)])  # a folder, too
    thread.join(timeout=30)
    assert not thread.is_alive() and thread.daemon
    library_readahead.evict([str(readable), str(unreadable)])  # never raises either
