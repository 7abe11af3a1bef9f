"""_core/files.atomic_write_bytes: temporaries named by their writer's pid; the next write to a target removes those
of writers that died mid-write (SIGKILL), never a live writer's."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time

from conftest import child_env

from resnet_native._core.files import atomic_write_bytes, atomic_write_text, remove_dead_temporaries

WAIT_S = 20.0

_CHILD = """
import sys, time
from resnet_native._core.files import atomic_write_bytes
def write(f):
    f.write(b"half")
    f.flush()
    print("writing", flush=True)
    time.sleep(600)
atomic_write_bytes(sys.argv[1], write)
"""


def _start_blocked_writer(target):
    """A child process blocked inside atomic_write_bytes(target) with its temporary on disk."""
    # From the target's folder: run from the checkout, `python -c` would import the source tree (no extension).
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(target)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=child_env(), cwd=target.parent)
    line = child.stdout.readline().strip()
    if line != "writing":
        child.kill()
        raise AssertionError(f"the writer did not start: {child.communicate(timeout=WAIT_S)[1]}")
    return child


def _temporaries(folder, name):
    return sorted(p for p in os.listdir(folder) if p.startswith(f".{name}.") and p.endswith(".tmp"))


def test_killed_writer_temporary_removed_by_next_write(tmp_path):
    target = tmp_path / "model.bin"
    child = _start_blocked_writer(target)
    try:
        (left,) = _temporaries(tmp_path, "model.bin")
        assert left.startswith(f".model.bin.{child.pid}.")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT_S)
    assert _temporaries(tmp_path, "model.bin") == [left]  # SIGKILL: nobody cleaned up
    atomic_write_text(target, "whole")
    assert target.read_text() == "whole"
    assert _temporaries(tmp_path, "model.bin") == []


def test_live_writer_temporary_kept(tmp_path):
    target = tmp_path / "cache.json"
    child = _start_blocked_writer(target)
    try:
        (live,) = _temporaries(tmp_path, "cache.json")
        atomic_write_text(target, "{}")
        assert remove_dead_temporaries(target) == []
        assert _temporaries(tmp_path, "cache.json") == [live]
        assert target.read_text() == "{}"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT_S)
    assert remove_dead_temporaries(target) == [tmp_path / live]


def test_other_targets_and_foreign_files_untouched(tmp_path):
    dead = _dead_pid()
    keep = [f".other.bin.{dead}.abc_12.tmp", ".model.bin.abc.tmp", f".model.bin.5.{dead}.xyz.tmp", "model.bin.tmp"]
    gone = f".model.bin.{dead}.k2j_x9.tmp"
    for name in keep + [gone]:
        (tmp_path / name).write_bytes(b"x")
    atomic_write_bytes(tmp_path / "model.bin", lambda f: f.write(b"new"))
    assert not (tmp_path / gone).exists()
    assert all((tmp_path / name).exists() for name in keep)
    assert (tmp_path / "model.bin").read_bytes() == b"new"


def test_failed_write_removes_own_temporary(tmp_path):
    def fail(f):
        f.write(b"x")
        raise RuntimeError("boom")

    try:
        atomic_write_bytes(tmp_path / "t", fail)
    except RuntimeError:
        pass
    assert os.listdir(tmp_path) == []


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    p.start()
    p.join(WAIT_S)
    return p.pid
