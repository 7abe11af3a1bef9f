"""warm_start.load_while_priming: the source decoded by a child while the first steps are primed and the network
built here, the same arrays as a plain load handed over in a shared block (or through the pipe when they do not fit
it), the child's cache write left to the run's end, a cached source loaded without either, and a bad source's error
raised by the parent's own load."""

import contextlib
import mmap
import multiprocessing
import time

import numpy as np
import pytest
from test_data_formats_cpu import assert_same, fake_arrays, write_image_folder, write_python_batches

from resnet_native.data import cifar10, image_decode
from resnet_native.training import warm_start
from resnet_native.training.config import TrainConfig, load_recipe
from resnet_native.training.stopwatch import Stopwatch


@pytest.fixture
def primed(monkeypatch):
    calls = []
    monkeypatch.setattr(warm_start, "prime_first_steps", lambda cfg: calls.append(cfg) or {"step 512": 0.5})
    return calls


def config():
    return TrainConfig.from_dict(load_recipe("B"))


def test_a_fresh_source_is_decoded_by_a_child_while_the_steps_are_primed(tmp_path, primed):
    fake = fake_arrays(np.random.default_rng(0))
    source = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    cache = tmp_path / "cache"
    cache.mkdir()
    spent, report = Stopwatch(), {}
    data = warm_start.load_while_priming(config(), source, cache, spent, report)
    assert_same(data, fake)
    assert all(isinstance(memory_of(getattr(data, name)), mmap.mmap) for name in cifar10.ARRAY_FIELDS)
    assert len(primed) == 1
    assert report["step 512"] == 0.5 and 0 < report["decode"] < 60  # the priming's phases and the child's seconds
    assert cifar10.cache_path_for(source, cache) is not None  # the child's cache, which the parent read
    assert set(spent.seconds) == {"warm-up", "data"}
    # Cached now: loaded at once, nothing primed.
    spent, report = Stopwatch(), {}
    assert_same(warm_start.load_while_priming(config(), source, cache, spent, report), fake)
    assert len(primed) == 1 and set(spent.seconds) == {"data"} and report == {}


def memory_of(array):
    """The object whose memory an array uses (following its views)."""
    while isinstance(array, np.ndarray):
        array = array.base
    return array.obj if isinstance(array, memoryview) else array


def test_arrays_too_large_for_the_shared_block_come_through_the_pipe(tmp_path, primed, monkeypatch):
    fake = fake_arrays(np.random.default_rng(5))
    source = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    (train_images, _), _ = fake
    monkeypatch.setattr(warm_start, "SHARED_BYTES", train_images.nbytes)  # the labels no longer fit
    data = warm_start.load_while_priming(config(), source, tmp_path, Stopwatch())
    assert_same(data, fake)
    assert all(getattr(data, name).flags.owndata for name in cifar10.ARRAY_FIELDS)


def test_without_shared_memory_the_arrays_come_through_the_pipe(tmp_path, primed, monkeypatch):
    fake = fake_arrays(np.random.default_rng(6))
    source = write_python_batches(tmp_path / "cifar-10-batches-py", fake)

    real_mmap = warm_start.mmap.mmap

    # Only the trainer's anonymous block is refused: multiprocessing's own heap (context.Value) maps a file-backed
    # arena through the same mmap module the first time a process needs one, and must still get it.
    def no_shared_memory(fileno, length, *args, **kwargs):
        if fileno == -1 and length == warm_start.SHARED_BYTES:
            raise OSError("no shared memory")
        return real_mmap(fileno, length, *args, **kwargs)

    monkeypatch.setattr(warm_start.mmap, "mmap", no_shared_memory)
    data = warm_start.load_while_priming(config(), source, tmp_path, Stopwatch())
    assert_same(data, fake)
    assert all(getattr(data, name).flags.owndata for name in cifar10.ARRAY_FIELDS)


@pytest.mark.parametrize("sizes, capacity, expected", [((100, 64, 1), 256, [0, 128, 192]), ((64, 64), 128, [0, 64]),
                                                       ((64, 65), 128, None)])
def test_shared_offsets_are_64_byte_aligned_and_fit(sizes, capacity, expected):
    assert warm_start._shared_offsets(list(sizes), capacity) == expected


def test_the_shared_block_holds_cifar10():
    sizes = [50_000 * 32 * 32 * 3, 50_000 * 4, 10_000 * 32 * 32 * 3, 10_000 * 4]  # uint8 images, int32 labels
    assert warm_start._shared_offsets(sizes, warm_start.SHARED_BYTES) is not None


def test_the_child_decodes_image_folders_with_its_own_pool(tmp_path, primed, monkeypatch, recwarn):
    """The child starts the decoding pool's workers (a daemonic process could not) and leaves the cache."""
    monkeypatch.setattr(image_decode, "PARALLEL_MIN_IMAGES", 4)
    monkeypatch.setattr(image_decode, "default_workers", lambda: 2)
    monkeypatch.setattr(image_decode, "CHUNK_IMAGES", 3)
    fake = fake_arrays(np.random.default_rng(2))
    source = write_image_folder(tmp_path / "png", fake)
    data = warm_start.load_while_priming(config(), source, tmp_path, Stopwatch())
    np.testing.assert_array_equal(data.train_images, cifar10.decode_source(source, workers=1).train_images)
    assert not [w for w in recwarn if "decoding it here" in str(w.message)]
    assert cifar10.cache_path_for(source, tmp_path) is not None


def test_a_bad_source_raises_the_parents_own_error(tmp_path, primed):
    source = tmp_path / "cifar-10-batches-py"
    source.mkdir()
    (source / "data_batch_1").write_bytes(b"not a pickle")
    (source / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="data_batch_1"), pytest.warns(RuntimeWarning, match="exit code 1"):
        warm_start.load_while_priming(config(), source, tmp_path, Stopwatch())
    assert len(primed) == 1


def test_a_priming_error_waits_for_the_child_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    fake = fake_arrays(np.random.default_rng(1))
    source = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    cache = tmp_path / "cache"
    cache.mkdir()

    def fail(cfg):
        raise RuntimeError("priming failed")

    monkeypatch.setattr(warm_start, "prime_first_steps", fail)
    with pytest.raises(RuntimeError, match="priming failed"):
        warm_start.load_while_priming(config(), source, cache, Stopwatch())
    assert [p.name for p in cache.iterdir() if p.name.endswith(".tmp")] == []
    assert cifar10.cache_path_for(source, cache) is not None


def decoding_children() -> list:
    return [p.name for p in multiprocessing.active_children() if p.name == "cifar10-decode"]


def test_the_network_is_built_before_the_wait_and_the_cache_write_is_left_to_the_run(tmp_path, primed,
                                                                                     monkeypatch):
    fake = fake_arrays(np.random.default_rng(3))
    source = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    cache, go = tmp_path / "cache", tmp_path / "go"
    cache.mkdir()

    def held_write(path, data, cache_dir):  # the child's cache write, held until the test lets it go
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return cifar10.write_cache(path, data, cache_dir)

    monkeypatch.setattr(warm_start, "write_cache", held_write)
    built, spent = [], Stopwatch()
    with contextlib.ExitStack() as stack:
        data = warm_start.load_while_priming(config(), source, cache, spent, meanwhile=lambda: built.append(
            len(primed)), cleanup=stack)
        assert_same(data, fake)  # received while the child still holds its write
        assert built == [1] and set(spent.seconds) == {"warm-up", "build", "data"}
        assert cifar10.cache_path_for(source, cache) is None
        assert decoding_children() == ["cifar10-decode"]
        go.touch()
    assert cifar10.cache_path_for(source, cache) is not None  # closing the stack waited for the write
    assert decoding_children() == []


def test_an_error_while_building_stops_the_sending_and_the_child_still_writes_the_cache(tmp_path, primed):
    """The arrays outgrow the pipe's buffer, so the child is still sending when the parent gives up on them."""
    fake = fake_arrays(np.random.default_rng(4))
    source = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    cache = tmp_path / "cache"
    cache.mkdir()

    def fail():
        time.sleep(0.5)
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"), contextlib.ExitStack() as stack:
        warm_start.load_while_priming(config(), source, cache, Stopwatch(), meanwhile=fail, cleanup=stack)
    assert decoding_children() == []
    assert [p.name for p in cache.iterdir() if p.name.endswith(".tmp")] == []
    assert_same(cifar10.load_cached(source, cache), fake)


@pytest.mark.parametrize("n, batch, expected", [(50_000, 512, (512, 336)), (50_000, 250, (250,)),
                                                (10_000, 1000, (1000,)), (100, 512, (100,)),
                                                (1000, 512, (512, 488))])
def test_batch_shapes(n, batch, expected):
    assert warm_start.batch_shapes(n, batch) == expected

