"""Load test of the Open Inference Protocol (KServe v2) server on loopback: REST with binary tensors and gRPC,
single- and 64-image requests, uint8 tensors and JPEG bodies, 1 to 256 concurrent clients.

    python benchmarks/bench_serve_v2.py --release cifar10_models/version_A --workers 8 [--seconds 3] [--out v2.json]
    python benchmarks/bench_serve_v2.py --fake-engine-ms 0.2,0.001 --workers 2          # no GPU

The server is `python -m resnet_native.serve` in a child process (its engine process and --workers fronts),
pinned with sched_setaffinity to the cores the clients do not use. The clients are --client-processes processes,
each pinned to one core of its own, each keeping its share of the connections busy back to back: REST over raw
keep-alive HTTP/1.1 connections with pre-built request bytes (the binary tensor extension), gRPC over grpc.aio
channels (one per 16 clients) with pre-built ModelInferRequest messages, so the client's own cost per request is
as small as Python allows. Every answer's status is checked and the first answer of each row is compared with the
expected logits of the fake engine (or just shaped, for a release).

Each row runs --seconds after a short warm-up and stops earlier after --max-requests; requests/s and images/s
are successful answers over the row's wall time, latency is per request (send to whole answer; p50, p99 by
nearest rank), server_cores and client_cores are the CPU time the server's and the clients' processes used per
second of the row (client_cores near --client-processes: the clients were the limit).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, format_table, markdown_table, package_env, percentile, write_json  # noqa: E402

COLUMNS = [("protocol", "protocol"), ("input", "input"), ("images", "images/request"), ("clients", "clients"),
           ("ok", "answers"), ("failed", "failed"), ("requests_per_s", "requests/s"), ("images_per_s", "images/s"),
           ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("server_cores", "server cores"),
           ("client_cores", "client cores")]
MODEL = "bench"


def make_inputs(n: int, seed: int = 0) -> tuple:
    """(uint8 (n, 32, 32, 3) images, their JPEG encodings at quality 90)."""
    from PIL import Image

    images = np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    jpegs = []
    for im in images:
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, format="JPEG", quality=90)
        jpegs.append(buf.getvalue())
    return images, jpegs


def _decoded(jpeg: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))


def _bytes_tensor(elements: list) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def rest_request(images: np.ndarray, jpegs: list, kind: str) -> bytes:
    """A whole HTTP/1.1 request of the binary tensor extension: JSON header, then the raw input."""
    n = len(images)
    if kind == "tensor":
        raw, inp = images.tobytes(), {"name": "images", "datatype": "UINT8", "shape": [n, 32, 32, 3]}
    else:
        raw, inp = _bytes_tensor(jpegs), {"name": "encoded", "datatype": "BYTES", "shape": [n]}
    inp["parameters"] = {"binary_data_size": len(raw)}
    header = json.dumps({"inputs": [inp], "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]})
    body = header.encode() + raw
    return (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: bench\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def grpc_request(images: np.ndarray, jpegs: list, kind: str):
    from tritonclient.grpc import service_pb2

    n = len(images)
    if kind == "tensor":
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name="images", datatype="UINT8", shape=[n, 32, 32, 3])
        raw = images.tobytes()
    else:
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name="encoded", datatype="BYTES", shape=[n])
        raw = _bytes_tensor(jpegs)
    return service_pb2.ModelInferRequest(
        model_name=MODEL, inputs=[tensor], raw_input_contents=[raw],
        outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="logits")])


# -- one client process -------------------------------------------------------------------------------------


async def _rest_client(port, payload, stop_at, max_requests, out):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.monotonic() < stop_at and out["sent"] < max_requests:
            out["sent"] += 1
            t = time.perf_counter()
            writer.write(payload)
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(head[0].split(" ", 2)[1])
            headers = dict(line.lower().split(": ", 1) for line in head[1:] if line)
            body = await reader.readexactly(int(headers["content-length"]))
            if status == 200:
                out["latencies"].append(time.perf_counter() - t)
                if out["first"] is None:
                    hlen = int(headers["inference-header-content-length"])
                    out["first"] = np.frombuffer(body[hlen:], np.float32).tolist()
            else:
                out["failed"] += 1
                out["error"] = out["error"] or body[:300].decode(errors="replace")
    finally:
        writer.close()


async def _grpc_clients(url, message, clients, stop_at, max_requests, out):
    from grpc import aio
    from tritonclient.grpc import service_pb2_grpc

    channels = [aio.insecure_channel(url) for _ in range(max(1, math.ceil(clients / 16)))]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]

    async def client(stub):
        while time.monotonic() < stop_at and out["sent"] < max_requests:
            out["sent"] += 1
            t = time.perf_counter()
            try:
                answer = await stub.ModelInfer(message)
            except Exception as e:  # grpc.aio.AioRpcError: a refused or failed call
                out["failed"] += 1
                out["error"] = out["error"] or str(e)[:300]
                continue
            out["latencies"].append(time.perf_counter() - t)
            if out["first"] is None:
                out["first"] = np.frombuffer(answer.raw_output_contents[0], np.float32).tolist()

    try:
        await asyncio.gather(*(client(stubs[i % len(stubs)]) for i in range(clients)))
    finally:
        for c in channels:
            await c.close()


def client_process(core, target, protocol, payload, clients, seconds, max_requests, ready, go, results):
    """Started, it says so on `ready` and waits for `go`; then it runs `seconds` (the row's window is the same for
    every client process, however long each took to start)."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    out = {"sent": 0, "failed": 0, "latencies": [], "first": None, "error": None}

    async def run():
        ready.put(os.getpid())
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        stop_at = time.monotonic() + seconds
        if protocol == "rest":
            await asyncio.gather(*(_rest_client(target, payload, stop_at, max_requests, out) for _ in range(clients)))
        else:
            await _grpc_clients(target, grpc_request(*payload), clients, stop_at, max_requests, out)

    cpu = time.process_time()
    try:
        asyncio.run(run())
    except Exception as e:  # reported in the row, not a hung benchmark
        out["error"] = f"client process: {type(e).__name__}: {e}"
    out["cpu_s"] = time.process_time() - cpu  # its busy time: near the row's seconds, the client is the limit
    results.put({k: out[k] for k in ("sent", "failed", "first", "error", "cpu_s")} | {"latencies": out["latencies"]})


# -- the server ---------------------------------------------------------------------------------------------


def _cpu_seconds(pids) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


class Server:
    def __init__(self, args, server_cores):
        source = ["--fake-engine-ms", args.fake_engine_ms] if args.fake_engine_ms else ["--release", args.release]
        cmd = [sys.executable, "-m", "resnet_native.serve", *source, "--workers", str(args.workers), "--port", "0",
               "--grpc-port", str(_free_port()), "--model-name", MODEL, "--max-queue", str(args.max_queue),
               "--max-connections", "4096", "--max-upload-bytes", str(1 << 22)]
        self._cwd = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=self._cwd.name, env=package_env(),
                                     preexec_fn=lambda: os.sched_setaffinity(0, server_cores))
        lines = [json.loads(self.proc.stdout.readline() or "{}") for _ in range(2)]
        if [x.get("event") for x in lines] != ["listening", "listening_grpc"]:
            self.close()
            raise RuntimeError(f"bench_serve_v2: the server did not start: {lines}")
        self.port, self.grpc_url = lines[0]["port"], lines[1]["url"]
        self.pids = [self.proc.pid, *lines[0].get("workers", [])]

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.pids)

    def close(self) -> dict:
        stopped = {}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            for line in self.proc.stdout:
                if line.startswith("{") and json.loads(line).get("event") == "stopped":
                    stopped = json.loads(line)["batcher"]
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._cwd.cleanup()
        return stopped


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_row(server, args, protocol, kind, n, clients, inputs, client_cores) -> dict:
    images, jpegs = inputs[0][:n], inputs[1][:n]
    payload = rest_request(images, jpegs, kind) if protocol == "rest" else (images, jpegs, kind)
    target = server.port if protocol == "rest" else server.grpc_url
    procs = min(len(client_cores), clients)
    ctx = multiprocessing.get_context("spawn")
    results, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    workers = []
    for i in range(procs):
        share = clients // procs + (i < clients % procs)
        p = ctx.Process(target=client_process, args=(client_cores[i], target, protocol, payload, share,
                                                     args.seconds, args.max_requests // procs, ready, go, results))
        p.start()
        workers.append(p)
    for _ in workers:
        ready.get(timeout=120)
    cpu0, t0 = server.cpu_seconds(), time.monotonic()
    go.set()
    parts = [results.get(timeout=args.seconds + 120) for _ in workers]
    wall = time.monotonic() - t0
    cpu = server.cpu_seconds() - cpu0
    for p in workers:
        p.join()
    latencies = [t * 1e3 for part in parts for t in part["latencies"]]
    first = next((part["first"] for part in parts if part["first"] is not None), None)
    ok = len(latencies)
    row = {"protocol": protocol, "input": kind, "images": n, "clients": clients, "ok": ok,
           "failed": sum(part["failed"] for part in parts), "wall_s": wall,
           "requests_per_s": ok / wall, "images_per_s": ok * n / wall, "p50_ms": percentile(latencies, 50),
           "p99_ms": percentile(latencies, 99), "server_cores": cpu / wall, "client_processes": procs,
           "client_cores": sum(part["cpu_s"] for part in parts) / wall,
           "error": next((part["error"] for part in parts if part["error"]), None)}
    if first is not None and args.fake_engine_ms:
        from resnet_native.serve import FakeEngine

        pixels = images if kind == "tensor" else np.stack([_decoded(j) for j in jpegs])
        want = FakeEngine(classes=10).expected_logits(pixels)
        row["answers_match"] = bool(np.allclose(np.asarray(first).reshape(want.shape), want, rtol=1e-6))
    elif first is not None:
        row["answers_match"] = bool(len(first) == 10 * n and np.isfinite(first).all())
    return row


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Load test of the KServe v2 server (REST and gRPC) on loopback.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--release", help="a release folder: its InferenceEngine on a GPU")
    src.add_argument("--fake-engine-ms", metavar="A,B", help="a fake engine: A ms per call + B ms per image")
    p.add_argument("--workers", type=int, default=8, help="the server's front processes (default 8)")
    p.add_argument("--client-processes", type=int, default=4, help="client processes, one core each (default 4)")
    p.add_argument("--clients", default="1,16,64,256", help="concurrent clients per row (default 1,16,64,256)")
    p.add_argument("--batch-clients", default="1,16,64", help="clients of the 64-image rows (default 1,16,64)")
    p.add_argument("--protocols", default="rest,grpc")
    p.add_argument("--inputs", default="tensor,jpeg")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per row (default 3)")
    p.add_argument("--max-requests", type=int, default=2_000_000, help="requests per row at most")
    p.add_argument("--max-queue", type=int, default=32768, help="the server's --max-queue (images)")
    p.add_argument("--out", default="bench_serve_v2.json")
    return p


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    client_cores = cores[:args.client_processes] if len(cores) > args.client_processes + 1 else [None]
    server_cores = set(cores[args.client_processes:]) if client_cores != [None] else set(cores)
    inputs = make_inputs(64)
    clients = [int(c) for c in args.clients.split(",") if c]
    batch_clients = [int(c) for c in args.batch_clients.split(",") if c]
    plan = [(proto, kind, 1, c) for proto in args.protocols.split(",") for kind in args.inputs.split(",")
            for c in clients]
    plan += [(proto, kind, 64, c) for proto in args.protocols.split(",") for kind in args.inputs.split(",")
             for c in (batch_clients if kind == "tensor" else batch_clients[1:2])]
    server = Server(args, server_cores)
    rows = []
    try:
        for proto, kind, n, c in plan:
            rows.append(run_row(server, args, proto, kind, n, c, inputs, client_cores))
            print(format_table(rows[-1:], COLUMNS), flush=True)
    finally:
        stopped = server.close()
    payload = {"environment": environment(), "args": vars(args), "client_cores": client_cores,
               "server_cores": sorted(server_cores), "rows": rows, "server_counters": stopped}
    write_json(args.out, payload)
    print()
    print(markdown_table(rows, COLUMNS, digits=2), end="")
    return payload


if __name__ == "__main__":
    main()
