"""The local launcher (resnet_native.distributed.launch) with tiny child scripts instead of the trainer: the
variables each rank gets, one failure stopping the rest, SIGKILL after the grace period, the launcher's own
timeout and signals; and `python -m resnet_native.train --nproc N` dispatching to it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import child_env

import resnet_native._core.runtime
from resnet_native.distributed import launch
from resnet_native.distributed.launch import without_option
from resnet_native.training import cli

PLACES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NCCL_NVLS_ENABLE")

# A rank: writes its pid and variables to <folder>/<rank>.json, then does what its argument says for its rank.
CHILD = r"""
import json, os, signal, sys, time
folder, plan = sys.argv[1], dict(a.split("=") for a in sys.argv[2:])
rank = os.environ["RANK"]
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NCCL_NVLS_ENABLE")
with open(os.path.join(folder, rank + ".json"), "w") as f:
    json.dump(dict({k: os.environ[k] for k in names}, pid=os.getpid()), f)
action = plan.get(rank, "ok")
if action == "fail":
    time.sleep(0.3)
    sys.exit(3)
if action == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if action in ("sleep", "stubborn"):
    time.sleep(60)
"""


@pytest.fixture
def child(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return [sys.executable, str(script)]


def records(folder, nproc):
    return [json.loads((folder / f"{r}.json").read_text()) for r in range(nproc)]


def gone(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False  # (a reaped child's pid is free: the launcher waits for every child it stops)


def test_every_rank_gets_its_place(child, tmp_path):
    assert launch(3, [str(tmp_path)], master_port=29999, command=child, timeout_s=20) == 0
    got = records(tmp_path, 3)
    for rank, env in enumerate(got):
        assert {k: env[k] for k in PLACES} == {"RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank),
                                               "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                                               "MASTER_PORT": "29999", "NCCL_NVLS_ENABLE": "0"}
    launch(2, [str(tmp_path)], command=child, timeout_s=20)
    assert 1 <= int(records(tmp_path, 1)[0]["MASTER_PORT"]) <= 65535  # a free port when none is given


def test_one_failure_stops_the_others_and_names_its_rank(child, tmp_path, capfd):
    t0 = time.monotonic()
    code = launch(3, [str(tmp_path), "1=fail", "0=sleep", "2=stubborn"], command=child, timeout_s=20, grace_s=1.0)
    assert code == 3 and time.monotonic() - t0 < 10
    err = capfd.readouterr().err
    assert "rank 1 exited with code 3; stopping ranks [0, 2]" in err
    assert all(gone(r["pid"]) for r in records(tmp_path, 3))  # the stubborn one too: SIGKILL after the grace


def test_the_launchers_timeout(child, tmp_path, capfd):
    t0 = time.monotonic()
    # 3 s: long enough for both children to have started (and written their records) on a loaded CI machine.
    assert launch(2, [str(tmp_path), "0=sleep", "1=sleep"], command=child, timeout_s=3.0, grace_s=1.0) == 1
    assert time.monotonic() - t0 < 10
    assert "ranks [0, 1] still running after 3.0 s; stopping them" in capfd.readouterr().err
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


def test_sigterm_to_the_launcher_stops_the_children(child, tmp_path):
    script = (f"import sys; from resnet_native.distributed import launch; "
              f"sys.exit(launch(2, [{str(tmp_path)!r}, '0=sleep', '1=sleep'], command={child!r}, grace_s=1.0))")
    launcher = subprocess.Popen([sys.executable, "-c", script], env=child_env(), stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path)  # not the checkout: its unbuilt source tree would shadow the package
    deadline = time.monotonic() + 10
    while not all((tmp_path / f"{r}.json").exists() for r in range(2)):  # both children are up
        assert time.monotonic() < deadline and launcher.poll() is None, "children never started"
        time.sleep(0.05)
    time.sleep(0.3)  # the JSON file is written; let its writer finish
    launcher.send_signal(signal.SIGTERM)
    try:
        _, err = launcher.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        launcher.kill()
        pytest.fail("the launcher did not stop on SIGTERM")
    assert launcher.returncode == 128 + signal.SIGTERM and f"got signal {int(signal.SIGTERM)}" in err
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


def test_arguments_are_checked(child):
    with pytest.raises(ValueError, match="nproc: expected a number of processes between 1"):
        launch(0, [], command=child)
    with pytest.raises(TypeError, match="argv: expected a sequence of str"):
        launch(1, "--epochs 1", command=child)
    with pytest.raises(ValueError, match="timeout_s"):
        launch(1, [], command=child, timeout_s=0)


def test_without_option():
    assert without_option(["--nproc", "2", "--epochs", "1"], "--nproc") == ["--epochs", "1"]
    assert without_option(["--epochs", "1", "--nproc=4"], "--nproc") == ["--epochs", "1"]
    assert without_option(["--npr", "4", "--no-progress"], "--nproc") == ["--no-progress"]


# ----------------------------------------------------------------------------------------------------------------
# The trainer's --nproc


def test_cli_nproc_dispatches_to_the_launcher(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "launch", lambda nproc, argv: calls.append((nproc, argv)) or 0)
    argv = ["--epochs", "3", "--nproc", "2", "--data", str(tmp_path)]
    assert cli.main(argv) == {"nproc": 2}
    assert calls == [(2, ["--epochs", "3", "--data", str(tmp_path)])]
    monkeypatch.setattr(cli, "launch", lambda nproc, argv: 7)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 7
    # No data found: the launcher downloads once and hands every rank --data.
    monkeypatch.setattr(cli, "launch", lambda nproc, argv: calls.append((nproc, argv)) or 0)
    monkeypatch.setattr(cli, "locate_data", lambda args, parser: None)
    monkeypatch.setattr(cli, "fetch_data", lambda args: tmp_path / "fetched")
    assert cli.main(["--nproc", "3", "--download"]) == {"nproc": 3}
    assert calls[-1] == (3, ["--download", "--data", str(tmp_path / "fetched")])


def test_cli_refusals_of_a_job(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "launch", lambda *a: pytest.fail("launched"))
    with pytest.raises(SystemExit):
        cli.main(["--nproc", "0"])
    assert "--nproc: expected a number of processes >= 1, got 0" in capsys.readouterr().err
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "locate_data", lambda args, parser: None)  # nothing found: a rank must not download
    monkeypatch.setattr(resnet_native._core.runtime, "require_gpu", lambda: None)
    with pytest.raises(SystemExit):
        cli.main([])
    assert "rank 1 of 2: no CIFAR-10 found, and the ranks of a job do not download" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--nproc", "2"])
    assert "this process already is rank 1 of 2" in capsys.readouterr().err
    monkeypatch.setenv("MASTER_PORT", "0")
    with pytest.raises(SystemExit):
        cli.main([])
    assert "the launcher's environment: MASTER_PORT=0" in capsys.readouterr().err
