"""Reading CIFAR-10 from a tar archive while decoding (resnet_native.data.tar_source): the pipelined path gives the
serial path's arrays and errors, and the decompressing reader gives the decompressed bytes. The formats themselves
are tested in test_data_formats.py."""

import bz2
import gzip
import io
import lzma
import tarfile
import threading

import numpy as np
import pytest

from resnet_native.data import cifar10, tar_source
from resnet_native.data.cifar10 import CLASSES, decode_source

COMPRESSIONS = ["w:xz", "w:gz", "w:bz2", "w"]


def jpeg(image) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG")
    return buf.getvalue()


def write_tar(path, members, mode):
    """members: [(name, bytes)], written in the given order."""
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def shuffled_jpeg_members(rng, per_class=(4, 2)):
    """An image-folder archive's members in an order that is not the output's: splits, classes and files
    shuffled, and one (split, class, file name) twice under different top folders (equal keys keep stream order)."""
    members = []
    for split, n in zip(("train", "test"), per_class, strict=True):
        for c in CLASSES:
            for i in range(n):
                image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                members.append((f"cifar10-jpeg/{split}/{c}/{i:04d}.jpg", jpeg(image)))
    members = [members[i] for i in rng.permutation(len(members))]
    members.insert(7, ("copy/train/Cat/0001.jpg", jpeg(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))))
    return members


@pytest.fixture
def pipelined(monkeypatch):
    """A threshold and chunks small enough that a few dozen images take the pool, in several chunks; records
    whether the pool was used."""
    monkeypatch.setattr(cifar10, "_PARALLEL_MIN_IMAGES", 8)
    monkeypatch.setattr(tar_source, "_CHUNK_IMAGES", 5)
    monkeypatch.setattr(tar_source, "_TAIL_CHUNK_MIN", 1)
    monkeypatch.setattr(tar_source, "_PIECE_BYTES", 4096)  # many pieces through the decompressing thread
    pools = []
    real = tar_source._fork_pool
    monkeypatch.setattr(tar_source, "_fork_pool", lambda workers: pools.append(workers) or real(workers))
    return pools


@pytest.mark.parametrize("mode", COMPRESSIONS)
def test_pipelined_tar_matches_serial(tmp_path, rng, pipelined, mode):
    archive = write_tar(tmp_path / "cifar.tar", shuffled_jpeg_members(rng), mode)
    threads = threading.active_count()
    serial = decode_source(archive, workers=1)
    assert not pipelined
    parallel = decode_source(archive, workers=2)
    assert pipelined == [2]
    assert threading.active_count() == threads  # no decompressing thread outlives the call
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        a, b = getattr(serial, name), getattr(parallel, name)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert serial.train_images.shape == (41, 32, 32, 3) and serial.test_images.shape == (20, 32, 32, 3)
    np.testing.assert_array_equal(serial.train_labels, np.repeat(np.arange(10), [4, 4, 4, 5, 4, 4, 4, 4, 4, 4]))


def test_pipelined_tar_bad_image_raises_naming_it(tmp_path, rng, pipelined):
    """A non-32x32 image raises ValueError naming it, as the serial path does; of two bad images, the one that
    comes first in the output order, wherever it is in the stream."""
    members = shuffled_jpeg_members(rng)
    big = jpeg(np.zeros((32, 40, 3), np.uint8))
    members.insert(3, ("cifar10-jpeg/test/dog/9999.jpg", big))
    archive = write_tar(tmp_path / "bad.tar.xz", members, "w:xz")
    with pytest.raises(ValueError, match=r"test/dog/9999\.jpg: expected a 32x32 image, got 40x32"):
        decode_source(archive, workers=2)
    assert pipelined == [2]
    members.append(("cifar10-jpeg/train/truck/9998.jpg", big))
    archive = write_tar(tmp_path / "two_bad.tar.xz", members, "w:xz")
    with pytest.raises(ValueError) as serial:
        decode_source(archive, workers=1)
    with pytest.raises(ValueError) as parallel:
        decode_source(archive, workers=2)
    assert str(parallel.value) == str(serial.value) == "train/truck/9998.jpg: expected a 32x32 image, got 40x32"


def test_pipelined_tar_stream_errors_win(tmp_path, rng, pipelined):
    """An error found while reading (a folder that is no class) is raised, not a decoding error found before it."""
    members = shuffled_jpeg_members(rng)
    members.insert(2, ("cifar10-jpeg/test/dog/9999.jpg", jpeg(np.zeros((32, 40, 3), np.uint8))))
    members.append(("cifar10-jpeg/train/kitten/0000.jpg", members[0][1]))
    archive = write_tar(tmp_path / "kitten.tar.xz", members, "w:xz")
    with pytest.raises(ValueError, match="'kitten' is not a CIFAR-10 class"):
        decode_source(archive, workers=2)


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("kind", ["xz", "gz", "bz2"])
def test_decompressing_reader_gives_the_decompressed_bytes(tmp_path, rng, monkeypatch, kind, threaded):
    monkeypatch.setattr(tar_source, "_PIECE_BYTES", 1000)
    monkeypatch.setattr(tar_source, "_COMPRESSED_READ", 333)
    raw = rng.integers(0, 4, 50_000, dtype=np.uint8).tobytes()  # compresses, into several reads and pieces
    compress = {"xz": lzma.compress, "gz": gzip.compress, "bz2": bz2.compress}[kind]
    (tmp_path / "f").write_bytes(compress(raw))
    reader = tar_source._DecompressingReader.open(tmp_path / "f")
    try:
        if threaded:
            reader.start_thread()
        got = b"".join(iter(lambda: reader.read(777), b""))
    finally:
        reader.close()
    assert got == raw
    (tmp_path / "plain").write_bytes(raw)
    assert tar_source._DecompressingReader.open(tmp_path / "plain") is None


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("kind", ["xz", "gz", "bz2"])
def test_decompressing_reader_raises_tarfiles_error_for_corrupt_data(tmp_path, rng, monkeypatch, kind, threaded):
    """Corrupt compressed data raises tarfile's own ReadError (as "r|*" does) when the reader gets to it."""
    monkeypatch.setattr(tar_source, "_PIECE_BYTES", 1000)
    raw = rng.integers(0, 4, 50_000, dtype=np.uint8).tobytes()
    compressed = bytearray({"xz": lzma.compress, "gz": gzip.compress, "bz2": bz2.compress}[kind](raw))
    compressed[len(compressed) // 2:len(compressed) // 2 + 64] = b"x" * 64
    (tmp_path / "f").write_bytes(compressed)
    reader = tar_source._DecompressingReader.open(tmp_path / "f")
    try:
        if threaded:
            reader.start_thread()
        with pytest.raises(tarfile.ReadError, match="invalid compressed data"):
            while reader.read(777):
                pass
        with pytest.raises(tarfile.ReadError):  # again, rather than waiting for a thread that has ended
            reader.read(777)
    finally:
        reader.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_cut_archive_raises_read_error_and_stops_the_thread(tmp_path, rng, pipelined, workers):
    archive = write_tar(tmp_path / "cifar.tar.xz", shuffled_jpeg_members(rng), "w:xz")
    data = archive.read_bytes()
    (tmp_path / "cut.tar.xz").write_bytes(data[: len(data) // 2])
    threads = threading.active_count()
    with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
        decode_source(tmp_path / "cut.tar.xz", workers=workers)
    assert pipelined == ([2] if workers == 2 else [])
    assert threading.active_count() == threads
