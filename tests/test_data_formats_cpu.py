"""CIFAR-10 readers on tiny generated fixtures: every format decodes to the same arrays; the cache; where the data
set is looked for. download() is tested in test_download_cpu.py."""

import glob
import io
import os
import pathlib
import pickle
import tarfile
import zipfile

import numpy as np
import pytest

from resnet_native.data import cifar10, image_decode
from resnet_native.data.cifar10 import CLASSES, decode_source, detect_format, load_cifar10

TRAIN_PER_CLASS, TEST_PER_CLASS = 3, 2


def fake_arrays(rng):
    """Random images sorted by class (the order image folders decode to), as CIFAR-10 arrays."""
    def split(per_class):
        labels = np.repeat(np.arange(10, dtype=np.int32), per_class)
        images = rng.integers(0, 256, (len(labels), 32, 32, 3), dtype=np.uint8)
        return images, labels

    return split(TRAIN_PER_CLASS), split(TEST_PER_CLASS)


@pytest.fixture
def fake(rng):
    return fake_arrays(rng)


def write_python_batches(root: pathlib.Path, fake):
    (tr, trl), (te, tel) = fake
    root.mkdir(parents=True)
    chunks = np.array_split(np.arange(len(trl)), 5)
    for i, idx in enumerate(chunks):
        batch = {b"batch_label": b"training batch", b"labels": trl[idx].tolist(),
                 b"data": tr[idx].transpose(0, 3, 1, 2).reshape(len(idx), -1),
                 b"filenames": [b"x.png"] * len(idx)}
        (root / f"data_batch_{i + 1}").write_bytes(pickle.dumps(batch, protocol=2))
    test = {b"labels": tel.tolist(), b"data": te.transpose(0, 3, 1, 2).reshape(len(tel), -1)}
    (root / "test_batch").write_bytes(pickle.dumps(test, protocol=2))
    (root / "batches.meta").write_bytes(pickle.dumps({b"label_names": [c.encode() for c in CLASSES]}))
    return root


def write_binary_batches(root: pathlib.Path, fake):
    (tr, trl), (te, tel) = fake
    root.mkdir(parents=True)

    def records(images, labels):
        flat = images.transpose(0, 3, 1, 2).reshape(len(labels), -1)
        return np.concatenate([labels.astype(np.uint8)[:, None], flat], axis=1).tobytes()

    for i, idx in enumerate(np.array_split(np.arange(len(trl)), 5)):
        (root / f"data_batch_{i + 1}.bin").write_bytes(records(tr[idx], trl[idx]))
    (root / "test_batch.bin").write_bytes(records(te, tel))
    return root


def write_image_folder(root: pathlib.Path, fake, formats=("PNG",)):
    """train/<class>/NNNN.<ext> and test/<class>/NNNN.<ext>, cycling through the given PIL formats."""
    from PIL import Image

    ext = {"PNG": "png", "BMP": "bmp", "TIFF": "tiff", "JPEG": "jpg"}
    k = 0
    for split, (images, labels) in zip(("train", "test"), fake, strict=True):
        for i, (im, label) in enumerate(zip(images, labels, strict=True)):
            d = root / split / CLASSES[label]
            d.mkdir(parents=True, exist_ok=True)
            fmt = formats[k % len(formats)]
            k += 1
            Image.fromarray(im).save(d / f"{i:04d}.{ext[fmt]}", format=fmt)
    return root


def make_tar(path: pathlib.Path, folder: pathlib.Path, arcname: str, mode: str):
    with tarfile.open(path, mode) as tar:
        tar.add(folder, arcname=arcname)
    return path


def archive_of_python_batches(build_dir: pathlib.Path, fake_or_rng) -> bytes:
    """The bytes of a cifar-10-python.tar.gz look-alike (cifar-10-batches-py/ inside) holding `fake` (or random
    arrays drawn from a generator)."""
    fake = fake_arrays(fake_or_rng) if isinstance(fake_or_rng, np.random.Generator) else fake_or_rng
    py = write_python_batches(build_dir / "cifar-10-batches-py", fake)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(py, arcname="cifar-10-batches-py")
    return buf.getvalue()


def assert_same(data, fake):
    (tr, trl), (te, tel) = fake
    np.testing.assert_array_equal(data.train_images, tr)
    np.testing.assert_array_equal(data.train_labels, trl)
    np.testing.assert_array_equal(data.test_images, te)
    np.testing.assert_array_equal(data.test_labels, tel)
    assert data.train_images.dtype == np.uint8 and data.train_labels.dtype == np.int32
    assert data.train_images.shape == (10 * TRAIN_PER_CLASS, 32, 32, 3)


def test_python_batches(tmp_path, fake):
    root = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    assert detect_format(root) == ("python", root)
    assert_same(decode_source(root), fake)
    # A parent folder holding the batches folder is accepted too.
    assert detect_format(tmp_path) == ("python", root)


def test_binary_batches(tmp_path, fake):
    root = write_binary_batches(tmp_path / "cifar-10-batches-bin", fake)
    assert detect_format(root) == ("binary", root)
    assert_same(decode_source(root), fake)


def test_image_folder_lossless_formats(tmp_path, fake):
    root = write_image_folder(tmp_path / "png", fake, formats=("PNG", "BMP", "TIFF"))
    (root / "train" / "cat" / "notes.txt").write_text("not an image: ignored")
    assert detect_format(root)[0] == "folder"
    assert_same(decode_source(root, workers=1), fake)


@pytest.mark.parametrize("mode", ["w:xz", "w:gz", "w"])
def test_tar_of_image_folder(tmp_path, fake, mode):
    folder = write_image_folder(tmp_path / "png", fake)
    archive = make_tar(tmp_path / "cifar.tar", folder, "cifar10-png", mode)
    assert detect_format(archive)[0] == "tar"
    assert_same(decode_source(archive, workers=1), fake)


def test_tar_of_python_and_binary_batches(tmp_path, fake):
    py = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    assert_same(decode_source(make_tar(tmp_path / "py.tar.gz", py, "cifar-10-batches-py", "w:gz")), fake)
    b = write_binary_batches(tmp_path / "cifar-10-batches-bin", fake)
    assert_same(decode_source(make_tar(tmp_path / "bin.tar.gz", b, "cifar-10-batches-bin", "w:gz")), fake)


def test_jpeg_folder_and_tar_agree_with_pil(tmp_path, fake):
    from PIL import Image

    folder = write_image_folder(tmp_path / "jpg", fake, formats=("JPEG",))
    archive = make_tar(tmp_path / "cifar10-jpeg.tar.xz", folder, "cifar10-jpeg", "w:xz")
    from_folder = decode_source(folder, workers=1)
    from_tar = decode_source(archive, workers=1)
    np.testing.assert_array_equal(from_folder.train_images, from_tar.train_images)
    np.testing.assert_array_equal(from_folder.test_labels, from_tar.test_labels)
    first = np.asarray(Image.open(folder / "train" / "airplane" / "0000.jpg").convert("RGB"))
    np.testing.assert_array_equal(from_folder.train_images[0], first)
    # JPEG is lossy: close to the originals, not equal.
    err = np.abs(from_folder.train_images.astype(int) - fake[0][0].astype(int)).mean()
    assert 0 < err < 80


def test_parallel_decode_matches_serial(tmp_path, fake, monkeypatch):
    folder = write_image_folder(tmp_path / "png", fake)
    serial = decode_source(folder, workers=1)
    monkeypatch.setattr(image_decode, "PARALLEL_MIN_IMAGES", 4)
    parallel = decode_source(folder, workers=2)
    np.testing.assert_array_equal(parallel.train_images, serial.train_images)
    np.testing.assert_array_equal(parallel.test_images, serial.test_images)


def test_bad_sources_raise_clear_errors(tmp_path, fake):
    from PIL import Image

    with pytest.raises(FileNotFoundError):
        detect_format(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="expected python batches"):
        detect_format(tmp_path / "empty")
    bad = write_image_folder(tmp_path / "badclass", fake)
    (bad / "train" / "cat").rename(bad / "train" / "kitten")
    with pytest.raises(ValueError, match="kitten"):
        decode_source(bad, workers=1)
    big = write_image_folder(tmp_path / "big", fake)
    Image.new("RGB", (40, 32)).save(big / "test" / "dog" / "9999.png")
    with pytest.raises(ValueError, match="9999.png.*32x32"):
        decode_source(big, workers=1)
    py = write_python_batches(tmp_path / "py", fake)
    (py / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        decode_source(py)


def test_python_batch_refuses_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        cifar10.parse_python_batch(pickle.dumps({b"data": Evil(), b"labels": []}))


def test_binary_batch_rejects_truncated_file():
    with pytest.raises(ValueError, match="whole number"):
        cifar10.parse_binary_batch(b"\x00" * 3000)


# ----------------------------------------------------------------------------------------------------------------
# Cache


def test_cache_round_trip_and_invalidation(tmp_path, fake, monkeypatch):
    folder = write_image_folder(tmp_path / "png", fake)
    cache = tmp_path / "cache"
    first = load_cifar10(folder, cache_dir=cache, workers=1)
    files = list(cache.glob("*.npz"))
    assert len(files) == 1 and files[0].name.startswith("png.cifar10cache-")
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]

    def no_decode(*a, **k):
        raise AssertionError("decoded again although the cache is valid")

    monkeypatch.setattr(cifar10, "decode_source", no_decode)
    again = load_cifar10(folder, cache_dir=cache)
    assert_same(again, fake)
    np.testing.assert_array_equal(again.train_images, first.train_images)

    # Changing the source (here: a file's mtime) changes the key: decoded again, the stale cache removed.
    monkeypatch.undo()
    f = sorted((folder / "test" / "ship").iterdir())[0]
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    calls = []
    real = cifar10.decode_source
    monkeypatch.setattr(cifar10, "decode_source", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert_same(load_cifar10(folder, cache_dir=cache, workers=1), fake)
    assert calls == [1]
    new_files = list(cache.glob("*.npz"))
    assert len(new_files) == 1 and new_files[0] != files[0]


def test_corrupt_cache_is_rebuilt(tmp_path, fake):
    py = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    cache = tmp_path / "cache"
    load_cifar10(py, cache_dir=cache)
    (path,) = cache.glob("*.npz")
    path.write_bytes(b"garbage")
    assert_same(load_cifar10(py, cache_dir=cache), fake)
    with np.load(path) as z:
        assert z["train_images"].shape == (30, 32, 32, 3)


def _damaged_copies(raw: bytes) -> dict:
    """Ways a cache file ends up damaged: cut short by a full disk or a killed copy, overwritten, zeroed."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False,
                                                  "shape": (2**30, 32, 32, 3)})
    huge = io.BytesIO()
    with zipfile.ZipFile(huge, "w") as zf:
        for name in ("train_images", "train_labels", "test_images", "test_labels"):
            zf.writestr(f"{name}.npy", header.getvalue() + b"\0" * 16)
    return {"cut_in_half": raw[: len(raw) // 2], "cut_at_the_end": raw[:-10], "first_bytes_only": raw[:10],
            "empty": b"", "zip_magic_then_garbage": b"PK\x03\x04" + b"x" * 200, "zeros": b"\0" * len(raw),
            "member_bytes_flipped": raw[:200] + bytes(b ^ 0xFF for b in raw[200:400]) + raw[400:],
            "header_claims_terabytes": huge.getvalue()}


@pytest.mark.parametrize("damage", sorted(_damaged_copies(b"x" * 1000)))
def test_damaged_cache_is_treated_as_absent_and_rebuilt(tmp_path, fake, damage):
    """A damaged cache (cut short, garbage, a header claiming terabytes) is no error: the source is decoded again
    and the cache rewritten, so later loads do not fail until the file is deleted by hand."""
    py = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    cache = tmp_path / "cache"
    load_cifar10(py, cache_dir=cache)
    (path,) = cache.glob("*.npz")
    good = path.read_bytes()
    path.write_bytes(_damaged_copies(good)[damage])
    assert_same(load_cifar10(py, cache_dir=cache), fake)  # decoded again
    (again,) = cache.glob("*.npz")
    assert again == path and path.read_bytes() == good  # and the cache rewritten whole
    assert_same(load_cifar10(py, cache_dir=cache), fake)


def test_cache_with_wrong_arrays_is_rebuilt(tmp_path, fake):
    py = write_python_batches(tmp_path / "cifar-10-batches-py", fake)
    cache = tmp_path / "cache"
    load_cifar10(py, cache_dir=cache)
    (path,) = cache.glob("*.npz")
    (tr, trl), (te, tel) = fake
    for arrays in (dict(train_images=tr, train_labels=trl, test_images=te),  # a member missing
                   dict(train_images=tr, train_labels=trl.astype(np.int64), test_images=te, test_labels=tel),
                   dict(train_images=tr, train_labels=trl[:-1], test_images=te, test_labels=tel),
                   dict(train_images=tr[..., 0], train_labels=trl, test_images=te, test_labels=tel)):
        cifar10.atomic_write_npz(path, arrays)
        assert_same(load_cifar10(py, cache_dir=cache), fake)


def test_stale_cache_removal_escapes_the_source_name(tmp_path, fake):
    """Stale caches are matched by the source's name escaped: a source named '[ab]' must not remove source 'a''s
    cache (the unescaped pattern '[ab].cifar10cache-*.npz' matches 'a.cifar10cache-<key>.npz')."""
    a = write_python_batches(tmp_path / "src" / "a", fake)
    load_cifar10(a)
    (a_cache,) = (tmp_path / "src").glob("a.cifar10cache-*.npz")
    for name in ("[ab]", "a*", "?", "a.cifar10cache-"):
        other = write_python_batches(tmp_path / "src" / name, fake)
        load_cifar10(other)
        assert a_cache.is_file(), f"loading source {name!r} removed source 'a''s cache"
    caches = sorted(p.name for p in (tmp_path / "src").glob("*.npz"))
    assert len(caches) == 5
    # A source's own stale caches (an older key) still go.
    stale = tmp_path / "src" / "[ab].cifar10cache-0123456789abcdef0123.npz"
    stale.write_bytes(b"old")
    os.utime(tmp_path / "src" / "[ab]" / "test_batch", ns=(0, 10**9))  # the source changed: a new key
    load_cifar10(tmp_path / "src" / "[ab]")
    assert not stale.exists() and a_cache.is_file()
    assert len(list((tmp_path / "src").glob(glob.escape("[ab]") + ".cifar10cache-*.npz"))) == 1
    # And the other way round: source 'a''s pattern 'a.cifar10cache-*.npz' matches the cache of a source named
    # 'a.cifar10cache-', which must stay when 'a' replaces its own.
    os.utime(a / "test_batch", ns=(0, 10**9))
    load_cifar10(a)
    assert not a_cache.exists()
    assert len(list((tmp_path / "src").glob("a.cifar10cache-.cifar10cache-*.npz"))) == 1
    assert len(list((tmp_path / "src").glob("*.npz"))) == 5


def test_cache_next_to_source_then_user_dir(tmp_path, fake, monkeypatch):
    py = write_python_batches(tmp_path / "src" / "cifar-10-batches-py", fake)
    load_cifar10(py)
    assert len(list((tmp_path / "src").glob("cifar-10-batches-py.cifar10cache-*.npz"))) == 1

    # A read-only source folder: the cache goes to the user cache dir instead.
    monkeypatch.setenv("RESNET_NATIVE_CACHE", str(tmp_path / "usercache"))
    real = cifar10.atomic_write_npz

    def refuse_next_to_source(target, arrays):
        if pathlib.Path(target).parent == (tmp_path / "ro").resolve():
            raise PermissionError("read-only")
        real(target, arrays)

    monkeypatch.setattr(cifar10, "atomic_write_npz", refuse_next_to_source)
    ro = write_python_batches(tmp_path / "ro" / "cifar-10-batches-py", fake)
    assert_same(load_cifar10(ro), fake)
    assert len(list((tmp_path / "usercache" / "cifar10").glob("*.npz"))) == 1
    assert cifar10.cache_path_for(ro).parent == tmp_path / "usercache" / "cifar10"


def test_default_data_path(tmp_path, monkeypatch):
    monkeypatch.setenv("RESNET_NATIVE_CIFAR10", str(tmp_path / "x"))
    assert cifar10.default_data_path() == tmp_path / "x"
    monkeypatch.delenv("RESNET_NATIVE_CIFAR10")
    monkeypatch.setenv("RESNET_NATIVE_CACHE", str(tmp_path / "usercache"))
    monkeypatch.chdir(tmp_path)
    assert cifar10.default_data_path() is None
    # Where download() puts it: the cache folder (--cache-dir when given), searched after .data/.
    (tmp_path / "usercache" / "cifar10" / "cifar-10-python.tar.gz").parent.mkdir(parents=True)
    (tmp_path / "usercache" / "cifar10" / "cifar-10-python.tar.gz").write_bytes(b"")
    assert cifar10.default_data_path() == tmp_path / "usercache" / "cifar10" / "cifar-10-python.tar.gz"
    (tmp_path / "mine" / "cifar-10-batches-bin").mkdir(parents=True)
    assert cifar10.default_data_path(tmp_path / "mine") == tmp_path / "mine" / "cifar-10-batches-bin"
    (tmp_path / ".data" / "cifar-10-batches-py").mkdir(parents=True)
    assert cifar10.default_data_path() == pathlib.Path(".data/cifar-10-batches-py")
    assert cifar10.search_folders() == [pathlib.Path(".data"), tmp_path / "usercache" / "cifar10"]


# ----------------------------------------------------------------------------------------------------------------
# The real data set (skipped without it)


@pytest.mark.data
def test_real_cifar10_archive():
    from conftest import cifar_path

    d = load_cifar10(cifar_path(), cache=False)
    assert d.train_images.shape == (50000, 32, 32, 3) and d.test_images.shape == (10000, 32, 32, 3)
    assert np.bincount(d.train_labels).tolist() == [5000] * 10
    assert np.bincount(d.test_labels).tolist() == [1000] * 10
    # README: the test set's per-channel mean is 0.494, 0.485, 0.451.
    np.testing.assert_allclose(d.test_images.mean(axis=(0, 1, 2)) / 255, [0.494, 0.485, 0.451], atol=2e-3)
