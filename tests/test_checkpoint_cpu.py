"""Checkpoint files on any machine: writes that lose nothing (modes follow the umask, a process killed mid-write
leaves nothing a restart keeps, best.npz is published before last.npz names it) and reads that fail clearly
(every malformed file is a ValueError naming the file and what is wrong, before anything large is allocated)."""

import io
import json
import multiprocessing
import os
import pathlib
import random
import signal
import stat
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from resnet_native._core.files import atomic_write_text
from resnet_native.formats import checkpoint
from resnet_native.formats.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from resnet_native.training import checkpoint_writer
from resnet_native.training.checkpoint_writer import CheckpointWriter, remove_stale_temporaries


# ---- modes --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask, mode", [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_written_files_honour_the_umask(tmp_path, umask, mode):
    """A written file gets 0o666 less the umask, as open() would give it (a private run folder stays private)."""
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        save_checkpoint(tmp_path / "c.npz", {"w": np.zeros(3)})
        atomic_write_text(tmp_path / "a.txt", "y")  # replacing an existing file too
    finally:
        os.umask(old)
    for name in ("a.txt", "c.npz"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    assert os.umask(old) == old  # the umask itself is left as it was


# ---- reading malformed files --------------------------------------------------------------------------------------
def npy_bytes(array) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=True)
    return buf.getvalue()


def tree_member(meta) -> bytes:
    return npy_bytes(np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))


def write_zip(path, members: dict):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def good(tmp_path):
    path = tmp_path / "good.npz"
    save_checkpoint(path, {"model": {"w": np.arange(6.0).reshape(2, 3)}, "step": 3, "pair": (1, "a"),
                           "by_index": {0: np.ones(2)}})
    return path


def huge_header_member(shape=(2**27,), dtype="<f8") -> bytes:
    """A .npy member whose header claims shape x dtype (1 GiB by default) and holds 64 bytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False, "shape": shape})
    return header.getvalue() + b"\0" * 64


def lzma_zip(members: dict) -> bytes:
    """A zip whose members are LZMA-compressed: a method np.savez never writes, whose decompressor raises its own
    errors (lzma.LZMAError) on damaged data."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_LZMA) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out.getvalue()


def npy_header_text(text: str) -> bytes:
    """A version 1.0 .npy member with `text` as its header (NumPy's parser falls back to tokenize on a header
    Python cannot parse, which raises tokenize.TokenError, no ValueError, for an unclosed bracket)."""
    header = text.encode("latin1") + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 8


def test_round_trip_still_works(tmp_path):
    state = load_checkpoint(good(tmp_path))
    np.testing.assert_array_equal(state["model"]["w"], np.arange(6.0).reshape(2, 3))
    assert state["step"] == 3 and state["pair"] == (1, "a") and list(state["by_index"]) == [0]
    assert state["model"]["w"].flags.writeable


def malformed_files(tmp_path):
    """{case: (path, what the message must say)} for every way a checkpoint file can be wrong."""
    raw = good(tmp_path).read_bytes()
    ref = {"x": {"__array__": "a0"}}
    cases = {
        "truncated": (raw[: len(raw) // 2], "truncated"),
        "cut_at_the_end": (raw[:-5], "truncated"),
        "empty": (b"", "empty"),
        "not_a_zip": (b"this is no checkpoint", "not an .npz file"),
        "zip_of_other_files": ({"readme.txt": b"hi"}, "'readme.txt' is not a .npy array"),
        "no_tree": ({"a0.npy": npy_bytes(np.zeros(2))}, "no __tree__ member"),
        "tree_not_json": ({"__tree__.npy": npy_bytes(np.frombuffer(b"\xff{", np.uint8))}, "not UTF-8 JSON"),
        "tree_of_floats": ({"__tree__.npy": npy_bytes(np.zeros(3))}, "not UTF-8 JSON"),
        "meta_is_a_list": ({"__tree__.npy": tree_member([1, 2])}, "unknown format"),
        "unknown_format": ({"__tree__.npy": tree_member({"format": "other/1", "tree": {}})},
                           "unsupported checkpoint format 'other/1'"),
        "no_format": ({"__tree__.npy": tree_member({"tree": {}})}, "unknown format"),
        "missing_tree": ({"__tree__.npy": tree_member({"format": FORMAT})}, "has no 'tree'"),
        "tree_is_a_list": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": [1, 2]})},
                           "tree is not an object"),
        "member_missing": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": ref})},
                           "tree.x: member 'a0' is missing"),
        "bad_reference": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": {"x": {"__array__": 5}}})},
                          "malformed array reference"),
        "bad_tuple": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": {"t": {"__tuple__": 3}}})},
                      "malformed tuple"),
        "bad_items": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": {"d": {"__items__": [[1]]}}})},
                      "malformed mapping"),
        "unhashable_key": ({"__tree__.npy": tree_member({"format": FORMAT,
                                                          "tree": {"d": {"__items__": [[[1], 2]]}}})},
                           "a key of type list"),
        "header_claims_more": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": ref}),
                                "a0.npy": huge_header_member()},
                               r"member 'a0': its header claims shape \(134217728,\) of float64 \(1073741824 bytes\), "
                               r"but the member holds 64 bytes"),
        "header_claims_less": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": ref}),
                                "a0.npy": npy_bytes(np.zeros(4))[:-8]}, "member 'a0': its header claims shape"),
        "negative_dims": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": ref}),
                           "a0.npy": huge_header_member((-1, -8), "|u1")}, "claims shape"),
        "not_npy": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": ref}), "a0.npy": b"garbage" * 10},
                    "member 'a0' is not a valid .npy array"),
        "objects": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": ref}),
                     "a0.npy": npy_bytes(np.array([{}, 1], dtype=object))}, "holds Python objects"),
        "lzma_member": (lzma_zip({"__tree__.npy": tree_member({"format": FORMAT, "tree": {}})}),
                        "member '__tree__' uses zip compression method 14"),
        "header_unclosed": ({"__tree__.npy": tree_member({"format": FORMAT, "tree": ref}),
                             "a0.npy": npy_header_text("{'descr': '<f8', 'fortran_order': False, 'shape': (1,")},
                            "member 'a0' is not a valid .npy array"),
    }
    out = {}
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.npz"
        if isinstance(content, dict):
            write_zip(path, content)
        else:
            path.write_bytes(content)
        out[name] = (path, message)
    return out


CASES = ["truncated", "cut_at_the_end", "empty", "not_a_zip", "zip_of_other_files", "no_tree", "tree_not_json",
         "tree_of_floats", "meta_is_a_list", "unknown_format", "no_format", "missing_tree", "tree_is_a_list",
         "member_missing", "bad_reference", "bad_tuple", "bad_items", "unhashable_key", "header_claims_more",
         "header_claims_less", "negative_dims", "not_npy", "objects", "lzma_member", "header_unclosed"]


@pytest.mark.parametrize("case", CASES)
def test_malformed_checkpoints_raise_value_error_naming_the_file(tmp_path, case):
    """No raw EOFError / BadZipFile / KeyError / AttributeError without the file name, and a tree that is not an
    object (a JSON list) is refused rather than returned."""
    path, message = malformed_files(tmp_path)[case]
    with pytest.raises(ValueError, match=rf"^{path}: .*{message}"):
        load_checkpoint(path)


def test_a_header_claiming_a_gigabyte_allocates_nothing(tmp_path):
    """A 200-byte file whose member header claims 1 GiB is refused before NumPy allocates anything for it."""
    path = malformed_files(tmp_path)["header_claims_more"][0]
    assert path.stat().st_size < 1000
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="header claims"):
            load_checkpoint(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_unreferenced_members_are_never_read(tmp_path, monkeypatch):
    path = tmp_path / "extra.npz"
    write_zip(path, {"__tree__.npy": tree_member({"format": FORMAT, "tree": {"x": 1}}),
                     "a0.npy": npy_bytes(np.zeros(1000))})
    read = []
    real = checkpoint.NpzReader.read
    monkeypatch.setattr(checkpoint.NpzReader, "read", lambda self, name: read.append(name) or real(self, name))
    assert load_checkpoint(path) == {"x": 1}
    assert read == ["__tree__"]


def test_a_missing_file_is_still_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "absent.npz")


# ---- stale temporaries ----------------------------------------------------------------------------------------------
N = 1 << 19  # float32 entries per state: 2 MiB, so that a random kill often lands inside a write


def numbered_state(i: int) -> dict:
    """State i of the save loop: every entry of `w` is i (a torn file could not hold that), and the best epoch
    so far is the last multiple of 3."""
    return {"i": i, "w": np.full(N, i, dtype=np.float32), "best": i - i % 3}


def check_complete(state) -> int:
    i = state["i"]
    assert state["w"].shape == (N,) and bool((state["w"] == i).all()), f"state {i} is torn"
    return i


def save_loop(folder: str, start: int, hang_at: int | None = None):
    """The child: writes states start, start+1, ... until killed; every third one is also best.npz. No folder is
    given to its writer, so what a kill leaves stays for the next start-up. hang_at: block for good in the middle
    of writing that state (a kill there always leaves a temporary file)."""
    folder = pathlib.Path(folder)
    if hang_at is not None:
        real = np.savez

        def savez_then_hang(f, **arrays):
            if arrays["a0"][0] == hang_at:  # a0 is the state's `w`
                f.write(b"PK\x03\x04 half a file")
                f.flush()
                time.sleep(3600)
            real(f, **arrays)

        np.savez = savez_then_hang
    with CheckpointWriter() as writer:
        i = start
        while True:
            writer.submit(folder / "last.npz", numbered_state(i), folder / "best.npz" if i % 3 == 0 else None)
            writer.flush()
            i += 1


def temporaries(folder: pathlib.Path) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".tmp", ".link")))


def test_killed_writers_leave_nothing_a_restart_keeps(tmp_path):
    """A save loop SIGKILLed at random times leaves temporaries behind; the writer of the next run removes them
    all, and last.npz / best.npz are whole states. Each child resumes after the state last.npz holds, as --resume
    does."""
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(os.environ.get("RESNET_NATIVE_FUZZ_SEED", "kill-loop"))
    left_behind = 0

    def resume_point():
        last = tmp_path / "last.npz"
        return check_complete(load_checkpoint(last)) + 1 if last.exists() else 1

    def run_child(delay, hang_at=None):
        child = ctx.Process(target=save_loop, args=(str(tmp_path), resume_point(), hang_at), daemon=True)
        child.start()
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL

    for _ in range(20):
        run_child(rng.uniform(0.05, 0.4))
        left_behind = max(left_behind, len(temporaries(tmp_path)))
    seen = resume_point() - 1
    hang_at = seen + 2
    run_child(1.5, hang_at=hang_at)  # completes state seen + 1, then dies inside the write of seen + 2
    assert temporaries(tmp_path), "the certain mid-write kill left no temporary file"
    left_behind = max(left_behind, len(temporaries(tmp_path)))

    # A run starting (or resuming) in this folder: its writer removes every dead write first.
    with CheckpointWriter(tmp_path, ("last.npz", "best.npz")):
        assert temporaries(tmp_path) == []
    last, best = load_checkpoint(tmp_path / "last.npz"), load_checkpoint(tmp_path / "best.npz")
    i, b = check_complete(last), check_complete(best)  # complete states, never torn ones
    assert i == seen + 1, (i, seen)  # the newest complete state
    # best is never behind what last names, and at most the state in flight ahead of it
    assert b % 3 == 0 and last["best"] <= b <= i + 1, (b, last["best"], i)
    assert left_behind >= 1


def test_remove_stale_temporaries_touches_only_the_named_files(tmp_path):
    names = [".last.npz.abc123.tmp", ".best.npz.x.tmp", ".last.npz.link", ".other.npz.q.tmp", "last.npz",
             ".last.npz.tmp.keep", "x.tmp", ".[ab].npz.z.tmp", ".a.npz.q.tmp"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    removed = remove_stale_temporaries(tmp_path, ["last.npz", "best.npz", "[ab].npz"])
    assert sorted(p.name for p in removed) == [".[ab].npz.z.tmp", ".best.npz.x.tmp", ".last.npz.abc123.tmp",
                                               ".last.npz.link"]
    # another file's temporaries, and names the glob of '[ab].npz' would match unescaped ('.a.npz...'), stay
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".other.npz.q.tmp", "last.npz", ".last.npz.tmp.keep", "x.tmp", ".a.npz.q.tmp"])


# ---- publishing order: best.npz before last.npz ----------------------------------------------------------------
class Died(BaseException):
    """The process 'dies' at a rename (nothing after it happens)."""


# A trainer's submissions for epochs 1..6 with checkpoint_every=2: (epoch, test accuracy, due); best whenever the
# accuracy improves (epochs 1, 2, 3, 5).
EPOCHS = [(1, 0.3, False), (2, 0.5, True), (3, 0.6, False), (4, 0.55, True), (5, 0.7, False), (6, 0.65, True)]


def trainer_like_run(folder: pathlib.Path):
    best = {"test_acc": -1.0, "epoch": -1}
    with CheckpointWriter(folder, ("last.npz", "best.npz")) as writer:
        for epoch, acc, due in EPOCHS:
            is_best = acc > best["test_acc"]
            if is_best:
                best = {"test_acc": acc, "epoch": epoch}
            if due or is_best:  # as Trainer.run submits
                state = {"epoch": epoch, "best": dict(best), "w": np.full(8, epoch, np.float32)}
                if due:
                    writer.submit(folder / "last.npz", state, folder / "best.npz" if is_best else None)
                else:
                    writer.submit(folder / "best.npz", state)
                writer.flush()


def assert_consistent(folder: pathlib.Path):
    """What every prefix of the publications must leave: last.npz never names a best epoch newer than what
    best.npz holds, and each file is a whole state."""
    last = load_checkpoint(folder / "last.npz") if (folder / "last.npz").exists() else None
    best = load_checkpoint(folder / "best.npz") if (folder / "best.npz").exists() else None
    for state in filter(None, (last, best)):
        assert (state["w"] == state["epoch"]).all()
    if last is not None:
        assert best is not None, "last.npz names a best epoch but there is no best.npz"
        assert best["epoch"] >= last["best"]["epoch"], (
            f"last.npz (epoch {last['epoch']}) names epoch {last['best']['epoch']} as best, best.npz holds epoch "
            f"{best['epoch']}")
        assert best["best"]["test_acc"] >= last["best"]["test_acc"]
    if best is not None:
        assert best["best"]["epoch"] == best["epoch"]  # best.npz is the state of its own best epoch


def count_renames(monkeypatch, die_at=None):
    calls = []
    real = os.replace

    def replace(src, dst):
        calls.append(pathlib.Path(dst).name)
        if die_at is not None and len(calls) == die_at:
            raise Died(f"killed before renaming onto {dst}")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_every_prefix_of_the_publications_is_consistent(tmp_path, monkeypatch):
    """A death at any rename of a run's publications leaves last.npz naming no best epoch newer than the one
    best.npz holds (best.npz is written first, then last.npz linked to it)."""
    calls = count_renames(monkeypatch)
    trainer_like_run(tmp_path / "full")
    monkeypatch.undo()
    assert_consistent(tmp_path / "full")
    assert len(calls) >= 6
    # best first, then last, in the epochs that are both due and best
    assert calls[calls.index("last.npz") - 1] == "best.npz"
    for k in range(1, len(calls) + 1):
        folder = tmp_path / f"died_at_{k}"
        count_renames(monkeypatch, die_at=k)
        with pytest.raises(RuntimeError, match="writing a checkpoint failed: killed before renaming"):
            trainer_like_run(folder)
        monkeypatch.undo()
        assert_consistent(folder)


def test_best_is_written_first_even_without_hard_links(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError("hard links are not supported here")

    monkeypatch.setattr(checkpoint_writer.os, "link", no_links)
    trainer_like_run(tmp_path)
    assert_consistent(tmp_path)
    assert load_checkpoint(tmp_path / "last.npz")["epoch"] == 6
    assert load_checkpoint(tmp_path / "best.npz")["epoch"] == 5
    assert temporaries(tmp_path) == []
