"""`python -m resnet_native.train --nproc N ...`: N processes of the trainer on this host, one per GPU.

Each child gets torchrun's variables (world.py) for its rank, MASTER_ADDR=127.0.0.1 and a free loopback port, and
NCCL_NVLS_ENABLE=0 (NVLink multicast stays off: it needs fabric setup these hosts do not have). The launcher waits
for all of them. When one exits non-zero, the others are stopped (SIGTERM, SIGKILL after a grace period): a job
whose rank died would otherwise hang in its next collective. SIGINT / SIGTERM to the launcher stop them the same
way. Children inherit the launcher's stdout and stderr.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from .._core.names import bounded_int
from .world import DEFAULT_ADDR

POLL_S = 0.05  # how often the launcher looks at its children
GRACE_S = 5.0  # between SIGTERM and SIGKILL
TRAINER = ("-m", "resnet_native.train")  # after sys.executable: the default child command


def free_port(addr: str = DEFAULT_ADDR) -> int:
    """A TCP port nothing listens on at addr now (the kernel's pick; another process could take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def without_option(argv: Sequence[str], option: str) -> list[str]:
    """argv without `option VALUE` / `option=VALUE`, abbreviations argparse accepts (`--npr 2`) included."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if len(name) > 2 and name.startswith("--") and option.startswith(name):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def child_env(rank: int, nproc: int, port: int, env=None) -> dict:
    """The environment of rank's child: the launcher's (or env) plus the variables that place it."""
    return dict(os.environ if env is None else env, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR=DEFAULT_ADDR, MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")


def stop(children: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every live child; SIGKILL those still alive after grace_s; reap them all."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def launch(nproc: int, argv: Sequence[str], master_port: int | None = None, timeout_s: float | None = None,
           command: Sequence[str] | None = None, grace_s: float = GRACE_S, env=None) -> int:
    """Run nproc children of `command + argv` (command: [sys.executable, '-m', 'resnet_native.train']) and wait.

    Returns 0 when every child exits 0. Otherwise the others are stopped and the launcher prints which rank
    failed with which code and returns that code (128 + the signal for a child killed by one, 1 when
    timeout_s passes first or a signal stops the launcher: then 128 + that signal)."""
    nproc = bounded_int("nproc", nproc, 1, 1 << 16, "processes")
    if isinstance(argv, str) or not all(isinstance(a, str) for a in argv):
        raise TypeError(f"argv: expected a sequence of str, got {argv!r}")
    port = free_port() if master_port is None else bounded_int("master_port", master_port, 1, 65535, "TCP ports")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)
                                  or timeout_s <= 0):
        raise ValueError(f"timeout_s: expected a number of seconds > 0 or None, got {timeout_s!r}")
    cmd = [sys.executable, *TRAINER] if command is None else list(command)
    received: list[int] = []  # signals the launcher got while its children ran
    previous = _forward_signals(received)
    children: list[subprocess.Popen] = []
    try:
        for rank in range(nproc):
            children.append(subprocess.Popen([*cmd, *argv], env=child_env(rank, nproc, port, env)))
        return _wait(children, timeout_s, grace_s, received)
    finally:
        stop(children, grace_s)  # nothing left behind, whatever happened (a no-op when all have exited)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait(children, timeout_s, grace_s, received) -> int:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        codes = [child.poll() for child in children]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            running = [r for r, c in enumerate(codes) if c is None]
            _report(f"rank {rank} exited with code {code}" + (f"; stopping ranks {running}" if running else ""))
            stop(children, grace_s)
            return code if code > 0 else 128 - code
        if all(code == 0 for code in codes):
            return 0
        if received:
            _report(f"got signal {received[0]}; stopping ranks {[r for r, c in enumerate(codes) if c is None]}")
            stop(children, grace_s)
            return 128 + received[0]
        if deadline is not None and time.monotonic() > deadline:
            _report(f"ranks {[r for r, c in enumerate(codes) if c is None]} still running after {timeout_s} s; "
                    f"stopping them")
            stop(children, grace_s)
            return 1
        time.sleep(POLL_S)


def _forward_signals(received: list[int]) -> dict:
    """Record SIGINT / SIGTERM in received instead of dying with the children left running; the previous
    handlers, to restore. Only the main thread can set handlers: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, lambda s, _frame: received.append(s))
    return previous


def _report(message: str) -> None:
    print(f"resnet_native launch: {message}", file=sys.stderr, flush=True)
