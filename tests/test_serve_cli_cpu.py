"""python -m resnet_native.serve as a child process, on the host path (no GPU here; on a GPU it would take the
release's InferenceEngine): the release of a real ResNet-18 (tests/test_release_cpu.make_fake_run), the printed
listening line with the port --port 0 picked, a prediction that agrees with CIFAR10Classifier, and SIGTERM with a
request in flight: that request is answered and the process exits 0."""

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from serve_helpers import encode, request
from test_release_cpu import make_fake_run

import resnet_native as rn
from resnet_native.release import build as release
from resnet_native.release.classifier import CIFAR10Classifier

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

START_S = 180.0  # importing, building the host ResNet-18 and loading its weights: seconds, more on a busy CI host
REQUEST_S = 120.0  # one host-path prediction takes well under a second when the machine is idle


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_models")
    make_fake_run(root / "run")
    return release.release(root / "run", "A", root / "cifar10_models", benchmark=False)


def _lines(stream, into: queue.Queue):
    for line in stream:
        into.put(line)
    into.put(None)


def _next_event(lines: queue.Queue, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        if line is None:
            raise AssertionError("the server's stdout closed")
        try:
            return json.loads(line)
        except ValueError:
            continue


def test_serve_a_release_then_sigterm_with_a_request_in_flight(release_dir, tmp_path, rng):
    from conftest import child_env

    if rn.cuda_available():
        pytest.skip("a GPU is present: the server would build an InferenceEngine (covered by the GPU tests)")
    cmd = [sys.executable, "-m", "resnet_native.serve", "--release", str(release_dir), "--port", "0",
           "--max-delay-ms", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=child_env(OPENBLAS_NUM_THREADS="1"))
    lines = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        listening = _next_event(lines, START_S)
        assert listening["event"] == "listening" and listening["host"] == "127.0.0.1" and listening["port"] > 0
        port = listening["port"]
        assert listening["url"] == f"http://127.0.0.1:{port}"

        image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
        status, _, answer = request(port, "POST", "/predict", encode(image), {"Content-Type": "image/png"},
                                    timeout=REQUEST_S)
        assert status == 200, answer
        with pytest.warns(RuntimeWarning, match="no CUDA GPU"):
            clf = CIFAR10Classifier(release_dir)
        assert answer["class"] == clf.predict(image) and answer["name"] == clf.classes[answer["class"]]
        np.testing.assert_allclose(answer["probabilities"], clf.predict_proba(image), rtol=1e-5, atol=1e-7)
        _, _, health = request(port, "GET", "/health")
        assert health["model"]["device"] == "host" and health["model"]["name"] == "resnet18"

        # A request in flight when SIGTERM comes is still answered.
        answers = []
        client = threading.Thread(target=lambda: answers.append(request(
            port, "POST", "/predict", encode(image), {"Content-Type": "image/png"}, timeout=REQUEST_S)))
        client.start()
        deadline = time.monotonic() + REQUEST_S
        while request(port, "GET", "/health")[2]["batcher"]["requests"] < 2:
            assert time.monotonic() < deadline, "the second request never reached the batcher"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        client.join(REQUEST_S)
        assert answers and answers[0][0] == 200 and answers[0][2]["class"] == answer["class"]
        assert proc.wait(REQUEST_S) == 0
        stopped = _next_event(lines, 10.0)
        assert stopped["event"] == "stopped" and stopped["batcher"]["completed"] == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read()
    assert "runs on the host" in stderr and '"signal": "SIGTERM"' in stderr, stderr


def test_bad_arguments_exit_2(tmp_path):
    from conftest import child_env

    for args, message in ((["--port", "70000"], "65535"), (["--max-delay-ms", "-1"], "non-negative"),
                          (["--max-delay-ms", "inf"], "non-negative"), (["--max-batch", "0"], "positive")):
        out = subprocess.run([sys.executable, "-m", "resnet_native.serve", "--release", "x", *args],
                             capture_output=True, text=True, cwd=tmp_path, env=child_env(), timeout=120)
        assert out.returncode == 2 and args[0] in out.stderr and message in out.stderr, out.stderr


def test_a_taken_port_exits_1(release_dir, tmp_path):
    from conftest import child_env

    if rn.cuda_available():
        pytest.skip("a GPU is present: the server would build an InferenceEngine first")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "resnet_native.serve", "--release", str(release_dir), "--port",
                              str(port)], capture_output=True, text=True, cwd=tmp_path,
                             env=child_env(OPENBLAS_NUM_THREADS="1"), timeout=START_S)
    assert out.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in out.stderr, out.stderr
