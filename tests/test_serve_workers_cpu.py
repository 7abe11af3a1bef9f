"""python -m resnet_native.serve --workers 2 as a child process, on the fake engine (--fake-engine-ms): two front
processes on one port (and one gRPC port) in front of one engine process, through shared memory. Each answer is its
own image's (the fake engine's logits are an image's first bytes), over /predict, v2 REST and gRPC (tritonclient);
malformed uploads get the single-process app's 4xx, a full queue gives 503 with Retry-After, SIGTERM answers what
is in flight and exits 0, a front's death stops the server with exit 1, and the engine process's death answers
the waiting requests 503 before the fronts exit."""

import concurrent.futures
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
from serve_helpers import encode, free_port, images, multipart, request

from resnet_native.release.build import CLASSES
from resnet_native.release.classifier import softmax
from resnet_native.serve import FakeEngine

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
if not hasattr(socket, "SO_REUSEPORT"):
    pytest.skip("--workers needs SO_REUSEPORT", allow_module_level=True)

START_S = 60.0
PNG = {"Content-Type": "image/png"}


class Server:
    def __init__(self, tmp_path, *args):
        from conftest import child_env

        cmd = [sys.executable, "-m", "resnet_native.serve", "--port", "0", "--workers", "2", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                     env=child_env(OPENBLAS_NUM_THREADS="1"))
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.listening = self.next_event(START_S)
        except BaseException:
            self.close()
            raise
        assert self.listening["event"] == "listening", self.listening
        self.port, self.workers = self.listening["port"], self.listening["workers"]

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_event(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"the server's stdout closed: {self.proc.stderr.read()}")
            try:
                return json.loads(line)
            except ValueError:
                continue

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _expected_class(image) -> int:
    return int(np.argmax(FakeEngine(classes=len(CLASSES)).expected_logits(image[None])[0]))


def test_two_workers_answer_each_request_its_own_and_refuse_bad_uploads(tmp_path, rng):
    x = images(rng, 48)
    with Server(tmp_path, "--fake-engine-ms", "20,0.1", "--max-upload-bytes", "100000") as server:
        port = server.port
        assert len(server.workers) == 2

        def predict(i):
            return request(port, "POST", "/predict", encode(x[i]), PNG)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(predict, range(len(x))))
        for i, (status, _, body) in enumerate(answers):
            assert status == 200, body
            assert body["class"] == _expected_class(x[i]) and body["name"] == CLASSES[body["class"]]
            logits = FakeEngine(classes=len(CLASSES)).expected_logits(x[i][None])[0]
            np.testing.assert_allclose(body["probabilities"], softmax(logits), rtol=1e-5, atol=1e-7)

        # A multipart request: one answer per part, in order.
        body, kind = multipart([("image/png", encode(x[i])) for i in range(3)])
        status, _, answer = request(port, "POST", "/predict", body, {"Content-Type": kind})
        assert status == 200 and [p["class"] for p in answer["predictions"]] == [_expected_class(x[i])
                                                                                 for i in range(3)]

        # The single-process app's refusals, from the workers.
        status, _, answer = request(port, "POST", "/predict", b"not a png", PNG)
        assert status == 400 and "PNG" in answer["error"]
        status, _, answer = request(port, "POST", "/predict", b"text", {"Content-Type": "text/plain"})
        assert status == 415, answer
        body, kind = multipart([("image/png", encode(x[0])), ("image/png", b"broken")])
        status, _, answer = request(port, "POST", "/predict", body, {"Content-Type": kind})
        assert status == 400 and answer["error"].startswith("part 2: "), answer
        status, _, answer = request(port, "POST", "/predict", b"\0" * 200_000, PNG)
        assert status == 413, answer

        # Connections reach both workers; each reports its own counters; no worker imported cupy (the server
        # refuses to start otherwise: it checks every worker's sys.modules).
        pids = {request(port, "GET", "/health")[2]["batcher"]["pid"] for _ in range(24)}
        assert pids == set(server.workers)
        status, _, metrics = request(port, "GET", "/metrics")
        assert status == 200 and "resnet_native_http_requests_total" in metrics

        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(20) == 0
        stopped = server.next_event(5)
        # The engine's counters: the multipart request is one request of three images.
        counts = stopped["batcher"]
        assert stopped["event"] == "stopped" and counts["completed"] == len(x) + 1, counts
        assert counts["images"] == len(x) + 3 and counts["errors"] == 0, counts


def test_a_full_queue_is_503_with_retry_after(tmp_path, rng):
    x = images(rng, 8)
    with Server(tmp_path, "--fake-engine-ms", "300,0", "--max-batch", "1", "--max-queue", "1") as server:
        with concurrent.futures.ThreadPoolExecutor(len(x)) as pool:
            answers = list(pool.map(lambda i: request(server.port, "POST", "/predict", encode(x[i]), PNG),
                                    range(len(x))))
        statuses = [a[0] for a in answers]
        assert 200 in statuses and 503 in statuses and set(statuses) <= {200, 503}, statuses
        for i, (status, headers, body) in enumerate(answers):
            if status == 503:
                assert headers["Retry-After"] == "1" and "queue is full" in body["error"], body
            else:
                assert body["class"] == _expected_class(x[i])
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(20) == 0


def test_sigterm_answers_requests_in_flight_then_exits_0(tmp_path, rng):
    x = images(rng, 8)
    with Server(tmp_path, "--fake-engine-ms", "400,0", "--max-delay-ms", "0") as server:
        with concurrent.futures.ThreadPoolExecutor(len(x)) as pool:
            futures = [pool.submit(request, server.port, "POST", "/predict", encode(x[i]), PNG)
                       for i in range(len(x))]
            time.sleep(0.2)  # every request sent and queued or running (a call takes 400 ms)
            server.proc.send_signal(signal.SIGTERM)
            answers = [f.result() for f in futures]
        assert [a[0] for a in answers] == [200] * len(x), answers
        assert [a[2]["class"] for a in answers] == [_expected_class(im) for im in x]
        assert server.proc.wait(20) == 0
        stopped = server.next_event(5)
        assert stopped["batcher"]["completed"] == len(x) and stopped["batcher"]["errors"] == 0
    assert '"signal": "SIGTERM"' in server.proc.stderr.read()


def test_a_dead_worker_stops_the_server_with_exit_1(tmp_path):
    with Server(tmp_path, "--fake-engine-ms", "1,0") as server:
        victim = server.workers[0]
        start = time.monotonic()
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        assert server.proc.wait(10) == 1
        assert time.monotonic() - start < 5.0
        stderr = server.proc.stderr.read()
        assert f"worker {victim} died" in stderr, stderr
        # The other worker was stopped too: nothing listens on the port any more.
        with pytest.raises(OSError):
            request(server.port, "GET", "/health", timeout=2)


def test_a_taken_port_exits_1_and_workers_must_be_positive(tmp_path):
    from conftest import child_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "resnet_native.serve", "--fake-engine-ms", "1,0", "--workers",
                              "2", "--port", str(port)], capture_output=True, text=True, cwd=tmp_path,
                             env=child_env(), timeout=START_S)
    assert out.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in out.stderr, out.stderr
    for args in (["--fake-engine-ms", "1,0", "--workers", "0"], ["--fake-engine-ms", "1"]):
        out = subprocess.run([sys.executable, "-m", "resnet_native.serve", *args], capture_output=True, text=True,
                             cwd=tmp_path, env=child_env(), timeout=60)
        assert out.returncode == 2 and args[-2] in out.stderr, out.stderr


def test_v2_rest_and_grpc_reach_every_front_with_their_own_answers(tmp_path, rng):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    httpclient = pytest.importorskip("tritonclient.http")
    x = images(rng, 24)
    with Server(tmp_path, "--fake-engine-ms", "1,0", "--grpc-port", str(free_port()), "--model-name", "m") as server:
        grpc_line = server.next_event(5)
        assert grpc_line["event"] == "listening_grpc" and grpc_line["workers"] == server.workers, grpc_line
        want = FakeEngine(classes=len(CLASSES)).expected_logits(x)
        for i in range(0, len(x), 3):  # fresh clients: new connections, spread over both fronts by the kernel
            part = x[i:i + 3]
            if i % 2:
                client = grpcclient.InferenceServerClient(grpc_line["url"])
                inp = grpcclient.InferInput("images", list(part.shape), "UINT8")
            else:
                client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
                inp = httpclient.InferInput("images", list(part.shape), "UINT8")
            inp.set_data_from_numpy(part)
            result = client.infer("m", [inp])
            np.testing.assert_allclose(result.as_numpy("logits"), want[i:i + 3], rtol=1e-6)
            client.close()
        stats = [request(server.port, "GET", "/v2/models/m/stats")[2] for _ in range(16)]
        assert {s["model_stats"][0]["name"] for s in stats} == {"m"}
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(20) == 0
        assert server.next_event(5)["batcher"]["images"] == len(x)


def test_the_engine_process_s_death_answers_waiting_requests_503_and_the_fronts_exit(tmp_path, rng):
    x = images(rng, 4)
    with Server(tmp_path, "--fake-engine-ms", "3000,0") as server:
        with concurrent.futures.ThreadPoolExecutor(len(x)) as pool:
            futures = [pool.submit(request, server.port, "POST", "/predict", encode(im), PNG) for im in x]
            time.sleep(0.5)  # every request waits on the engine (a call takes 3 s)
            server.proc.kill()
            answers = [f.result() for f in futures]
        for status, headers, body in answers:
            assert status == 503 and "engine process is gone" in body["error"], body
            assert headers["Retry-After"] == "1"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the fronts stop listening and exit on their own
            try:
                request(server.port, "GET", "/health", timeout=1)
            except OSError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("a front still listens after the engine process died")
