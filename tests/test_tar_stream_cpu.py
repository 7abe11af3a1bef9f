"""tar_stream.regular_files against tarfile: the same (name, bytes) for every format tarfile writes, clear errors
for corrupt or truncated archives, and Unsupported (tarfile's turn) for what it does not model; the xz reader
on its read-ahead thread against lzma.open."""

import io
import lzma
import tarfile
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resnet_native.data import cifar10, tar_stream

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def write_tar(path, files, fmt=tarfile.PAX_FORMAT, mode="w", extras=True):
    """files: [(name, bytes)]; with extras, a directory, a symlink and a hard link are mixed in."""
    with tarfile.open(path, mode, format=fmt) as tar:
        if extras:
            d = tarfile.TarInfo("dir")
            d.type = tarfile.DIRTYPE
            tar.addfile(d)
        for i, (name, data) in enumerate(files):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            if extras and i == 0:
                for kind, link_name in ((tarfile.SYMTYPE, "sym"), (tarfile.LNKTYPE, "hard")):
                    link = tarfile.TarInfo(link_name)
                    link.type, link.linkname = kind, name
                    tar.addfile(link)
    return path


def by_tarfile(path):
    return list(cifar10._tar_regular_files(path))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_every_format_and_compression_reads_as_tarfile_reads_it(tmp_path, fmt, mode):
    files = [("a.txt", b"hello"), ("empty", b""), ("sub/" + "x" * 150 + ".jpg", b"\xff" * 513),
             ("block", bytes(range(256)) * 2), ("t\u00e9st/caf\u00e9.png", b"z" * 1000)]
    if fmt == "ustar":  # ustar holds a long name only as prefix + name, each part short
        files[2] = ("sub/" + "x" * 90 + "/" + "y" * 90 + ".jpg", files[2][1])
    path = write_tar(tmp_path / "a.tar", files, FORMATS[fmt], mode)
    got = list(tar_stream.regular_files(path))
    assert got == by_tarfile(path)
    assert got == files


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.text(st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1,
                                  max_size=160),
                          st.binary(max_size=1500)), min_size=0, max_size=6),
       st.sampled_from(["gnu", "pax"]))
def test_random_archives_match_tarfile(tmp_path_factory, files, fmt):
    path = write_tar(tmp_path_factory.mktemp("h") / "r.tar", files, FORMATS[fmt], extras=False)
    assert list(tar_stream.regular_files(path)) == by_tarfile(path)


def _patched_header(path, index, patch, fix_checksum=True):
    """Rewrite header block `index` (0-based block number) of an uncompressed tar."""
    raw = bytearray(path.read_bytes())
    h = raw[index * 512:(index + 1) * 512]
    patch(h)
    if fix_checksum:
        h[148:156] = b" " * 8
        h[148:156] = b"%06o\0 " % sum(h)
    raw[index * 512:(index + 1) * 512] = h
    path.write_bytes(bytes(raw))


def test_a_wrong_checksum_is_a_corrupt_archive(tmp_path):
    path = write_tar(tmp_path / "c.tar", [("a", b"1"), ("b", b"2")], tarfile.GNU_FORMAT, extras=False)
    _patched_header(path, 2, lambda h: h.__setitem__(slice(0, 1), b"c"), fix_checksum=False)
    with pytest.raises(ValueError, match="checksum"):
        list(tar_stream.regular_files(path))


def test_a_truncated_archive_raises(tmp_path):
    path = write_tar(tmp_path / "t.tar", [("a", b"x" * 3000)], tarfile.GNU_FORMAT, extras=False)
    path.write_bytes(path.read_bytes()[:1200])
    with pytest.raises(ValueError, match="truncated"):
        list(tar_stream.regular_files(path))
    path.write_bytes(path.read_bytes()[:700])
    with pytest.raises(ValueError, match="truncated"):
        list(tar_stream.regular_files(path))


def test_a_corrupt_size_field_raises(tmp_path):
    path = write_tar(tmp_path / "s.tar", [("a", b"x")], tarfile.GNU_FORMAT, extras=False)
    _patched_header(path, 0, lambda h: h.__setitem__(slice(124, 136), b"9zz\0" + b"\0" * 8))
    with pytest.raises(ValueError, match="numeric field"):
        list(tar_stream.regular_files(path))


@pytest.mark.parametrize("what", ["v7 header", "base-256 size", "sparse member"])
def test_what_it_does_not_model_is_unsupported(tmp_path, what):
    path = write_tar(tmp_path / "u.tar", [("a", b"x" * 10)], tarfile.GNU_FORMAT, extras=False)
    patch = {"v7 header": lambda h: h.__setitem__(slice(257, 265), b"\0" * 8),
             "base-256 size": lambda h: h.__setitem__(slice(124, 136), b"\x80" + b"\0" * 10 + b"\x0a"),
             "sparse member": lambda h: h.__setitem__(slice(156, 157), b"S")}[what]
    _patched_header(path, 0, patch)
    with pytest.raises(tar_stream.Unsupported):
        list(tar_stream.regular_files(path))


def test_a_cifar_archive_it_does_not_model_is_read_by_tarfile(tmp_path):
    """A pre-POSIX (v7) archive of CIFAR-10 image folders: decode_source falls back to tarfile, same images."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    files = []
    for i, (split, cls) in enumerate([("train", "cat"), ("train", "dog"), ("test", "cat"), ("test", "ship")]):
        buf = io.BytesIO()
        Image.fromarray(images[i]).save(buf, format="PNG")
        files.append((f"cifar/{split}/{cls}/{i:04d}.png", buf.getvalue()))
    path = write_tar(tmp_path / "v7.tar", files, tarfile.GNU_FORMAT, extras=False)
    expected = cifar10.decode_source(path, workers=1)
    for block in range(0, len(path.read_bytes()) // 512):
        raw = path.read_bytes()[block * 512:(block + 1) * 512]
        if raw[257:262] == b"ustar":
            _patched_header(path, block, lambda h: h.__setitem__(slice(257, 265), b"\0" * 8))
    with pytest.raises(tar_stream.Unsupported):
        list(tar_stream.regular_files(path))
    got = cifar10.decode_source(path, workers=1)
    np.testing.assert_array_equal(got.train_images, expected.train_images)
    np.testing.assert_array_equal(got.test_labels, expected.test_labels)
    np.testing.assert_array_equal(got.train_images[1], images[1])


def test_a_truncated_global_header_raises(tmp_path):
    path = tmp_path / "g.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "x" * 2000}) as tar:
        info = tarfile.TarInfo("a")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    assert path.read_bytes()[156:157] == b"g"
    path.write_bytes(path.read_bytes()[:1024])
    with pytest.raises(ValueError, match="truncated tar archive in a global header"):
        list(tar_stream.regular_files(path))


def random_files(rng, count=40, largest=200_000):
    return [(f"m{i}", rng.integers(0, 256, int(rng.integers(0, largest)), dtype=np.uint8).tobytes())
            for i in range(count)]


def test_xz_in_many_pieces_concatenated_streams_and_trailing_bytes_read_as_lzma_open_reads_them(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setattr(tar_stream, "_PIECE", 4096)  # many compressed pieces
    monkeypatch.setattr(tar_stream, "_OUT_PIECE", 10_000)  # and many calls per piece
    files = random_files(np.random.default_rng(0))
    raw = write_tar(tmp_path / "a.tar", files, extras=False).read_bytes()
    half = len(raw) // 2
    cases = {"one stream": lzma.compress(raw),
             "two streams": lzma.compress(raw[:half]) + lzma.compress(raw[half:]),
             "trailing bytes": lzma.compress(raw) + b"\0" * 8 + b"not xz"}
    for name, data in cases.items():
        path = tmp_path / f"{name}.tar.xz"
        path.write_bytes(data)
        with lzma.open(path) as f:
            assert f.read() == raw, name
        assert list(tar_stream.regular_files(path)) == files, name


def test_a_truncated_or_corrupt_xz_stream_is_a_value_error_naming_the_file(tmp_path):
    data = lzma.compress(write_tar(tmp_path / "a.tar", random_files(np.random.default_rng(1)), extras=False)
                         .read_bytes())
    path = tmp_path / "cut.tar.xz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.tar\.xz: truncated xz stream"):
        list(tar_stream.regular_files(path))
    path = tmp_path / "bad.tar.xz"
    path.write_bytes(data[:200] + bytes(b ^ 0x5A for b in data[200:400]) + data[400:])
    with pytest.raises(ValueError, match=r"bad\.tar\.xz: corrupt xz stream"):
        list(tar_stream.regular_files(path))


def test_a_reader_that_stops_early_stops_the_read_ahead_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(tar_stream, "_PIECE", 4096)
    monkeypatch.setattr(tar_stream.ReadAhead, "QUEUED", 1)  # the thread blocks on the full queue
    files = random_files(np.random.default_rng(2), count=60)
    path = tmp_path / "a.tar.xz"
    path.write_bytes(lzma.compress(write_tar(tmp_path / "a.tar", files, extras=False).read_bytes()))
    reader = tar_stream.regular_files(path)
    assert next(reader) == files[0]
    reader.close()
    assert not [t for t in threading.enumerate() if t.name == "tar-read-ahead"]
