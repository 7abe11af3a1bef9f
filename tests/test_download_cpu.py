"""download() on small archives the tests make, served from file:// URLs and a loopback HTTP server: verified,
extracted, into the cache folder by default; a checksum mismatch or an interrupted transfer leaves nothing behind."""

import contextlib
import hashlib
import http.server
import importlib
import io
import tarfile
import threading

import pytest
from test_data_formats_cpu import archive_of_python_batches, assert_same, fake_arrays

from resnet_native.data import cifar10
from resnet_native.data.cifar10 import load_cifar10

# The package exports the download() function under the module's name; the tests need the module.
download = importlib.import_module("resnet_native.data.download")


@pytest.fixture
def fake(rng):
    return fake_arrays(rng)


@pytest.fixture
def payload(tmp_path, fake):
    return archive_of_python_batches(tmp_path / "build", fake)


def publish(monkeypatch, url, payload, *, md5=None):
    """Make `url` the official python archive, with payload's checksums (or a wrong md5)."""
    monkeypatch.setitem(download.ARCHIVES, "python", (url, md5 or hashlib.md5(payload).hexdigest(),
                                                      hashlib.sha256(payload).hexdigest(), "cifar-10-batches-py"))


def served_file(tmp_path, payload):
    path = tmp_path / "served" / "cifar-10-python.tar.gz"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(payload)
    return path


@contextlib.contextmanager
def http_server(payload: bytes, send: int | None = None):
    """A loopback HTTP server that announces len(payload) bytes and sends the first `send` of them (all: None),
    then closes the connection. Yields the archive's URL."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload if send is None else payload[:send])
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_download_verifies_and_extracts(tmp_path, fake, payload, monkeypatch):
    source = served_file(tmp_path, payload)
    publish(monkeypatch, source.as_uri(), payload)
    root = download.download(tmp_path / "data", progress=False)
    assert root == tmp_path / "data" / "cifar-10-batches-py"
    assert_same(load_cifar10(root, cache=False), fake)
    source.unlink()
    assert download.download(tmp_path / "data") == root  # verified archive present: no second fetch
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["cifar-10-batches-py", "cifar-10-python.tar.gz"]


def test_download_goes_to_the_cache_folder_by_default(tmp_path, fake, payload, monkeypatch):
    monkeypatch.setenv("RESNET_NATIVE_CACHE", str(tmp_path / "cache"))
    publish(monkeypatch, served_file(tmp_path, payload).as_uri(), payload)
    root = download.download(progress=False)
    assert root == cifar10.user_cache_dir() / "cifar-10-batches-py" == tmp_path / "cache" / "cifar10" / root.name
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RESNET_NATIVE_CIFAR10", raising=False)
    assert cifar10.default_data_path() == root  # where the trainer looks for it


def test_download_over_http_with_a_progress_bar(tmp_path, fake, payload, monkeypatch, capsys):
    with http_server(payload) as url:
        publish(monkeypatch, url, payload)
        root = download.download(tmp_path / "data")
    assert_same(load_cifar10(root, cache=False), fake)
    assert "downloading cifar-10-python.tar.gz" in capsys.readouterr().err


def test_interrupted_download_leaves_no_partial_file(tmp_path, payload, monkeypatch):
    with http_server(payload, send=len(payload) // 2) as url:
        publish(monkeypatch, url, payload)
        with pytest.raises(Exception, match="IncompleteRead|interrupted"):
            download.download(tmp_path / "data", progress=False)
    assert list((tmp_path / "data").iterdir()) == []
    with http_server(payload) as url:  # the next call fetches it whole
        publish(monkeypatch, url, payload)
        assert (download.download(tmp_path / "data", progress=False) / "data_batch_1").is_file()


def test_download_rejects_bad_checksum(tmp_path, payload, monkeypatch):
    publish(monkeypatch, served_file(tmp_path, payload).as_uri(), payload, md5="0" * 32)
    with pytest.raises(ValueError, match="checksum mismatch"):
        download.download(tmp_path / "data", progress=False)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == []  # nothing half-written left behind


def test_interrupted_extraction_is_redone(tmp_path, fake, payload, monkeypatch):
    publish(monkeypatch, served_file(tmp_path, payload).as_uri(), payload)
    real_extractall = tarfile.TarFile.extractall

    def interrupted(self, path=".", members=None, **kw):
        # Everything but one training batch lands (test_batch included), then the disk fills up.
        kept = [m for m in (members or self.getmembers()) if not m.name.endswith("data_batch_3")]
        real_extractall(self, path, members=kept, **kw)
        raise OSError("No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "extractall", interrupted)
    data = tmp_path / "data"
    with pytest.raises(OSError, match="No space left"):
        download.download(data, progress=False)
    assert sorted(p.name for p in data.iterdir()) == ["cifar-10-python.tar.gz"]  # no half folder, no temporary
    monkeypatch.setattr(tarfile.TarFile, "extractall", real_extractall)
    root = download.download(data, progress=False)
    assert (root / "data_batch_3").is_file()
    assert_same(load_cifar10(root, cache=False), fake)


def test_safe_extract_refuses_escaping_members(tmp_path):
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match="outside"):
        download.safe_extract(evil, tmp_path / "root")
    assert not (tmp_path / "outside.txt").exists()


def _tar_with_special_modes(path):
    """A folder with setgid + sticky and group/other write, a setuid executable, a setgid world-writable file,
    each owned by uid 4242 in the archive."""
    with tarfile.open(path, "w") as tar:
        folder = tarfile.TarInfo("cifar-10-batches-py")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o3777
        members = [(folder, None)]
        for name, mode in (("run.sh", 0o4755), ("data_batch_1", 0o2666), ("plain", 0o644), ("secret", 0o000)):
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size, info.mode = 1, mode
            members.append((info, io.BytesIO(b"x")))
        for info, body in members:
            info.uid = info.gid = 4242
            info.uname = info.gname = "someone"
            tar.addfile(info, body)
    return path


@pytest.mark.parametrize("filter_kind", ["data", "none"])
def test_safe_extract_never_keeps_setuid_setgid_or_sticky_bits(tmp_path, monkeypatch, filter_kind):
    """Members never keep setuid, setgid or sticky bits (nor, extracted as root, their archive owner), even on a
    Python whose tarfile has no data filter: "none" extracts with every filter off, as such a Python does."""
    import os
    import stat

    if filter_kind == "none":
        monkeypatch.setattr(download, "_extract_options",
                            lambda: {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {})
    archive = _tar_with_special_modes(tmp_path / "modes.tar")
    download.safe_extract(archive, tmp_path / "root")
    root = tmp_path / "root" / "cifar-10-batches-py"
    for path in [root, *root.iterdir()]:
        mode = path.stat().st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX), (path.name, oct(mode))
        assert not mode & (stat.S_IWGRP | stat.S_IWOTH), (path.name, oct(mode))
        assert mode & stat.S_IRUSR and mode & stat.S_IWUSR, (path.name, oct(mode))  # the owner can read it
        assert path.stat().st_uid == os.getuid() and path.stat().st_gid == os.getgid()
    assert stat.S_IMODE((root / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "plain").stat().st_mode) == 0o644
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
