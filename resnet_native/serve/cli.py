"""python -m resnet_native.serve --release cifar10_models/version_A [--port 8000] ...: a release over HTTP.

Loads the release as CIFAR10Classifier does: on a GPU its InferenceEngine feeds the Batcher; without one the
host path (the NumPy reference ops, much slower; it says so). Listens on 127.0.0.1 unless --host says otherwise:
the server has no authentication, so reaching it from other machines is a decision to make, not a default. Once
listening it prints one JSON line on stdout, {"event": "listening", "host": ..., "port": ..., "url": ...}, which
gives the port --port 0 picked. SIGTERM or SIGINT: stop accepting connections, let in-flight requests finish,
close the batcher (its queue drains first), print {"event": "stopped", ...} and exit 0.

--workers N (N > 1): N front processes on the one port (and gRPC port) in front of this process's engine
(serve/workers.py: what /metrics, /health and the v2 statistics report is per front; a front's death stops the
server with exit code 1).
--fake-engine-ms A,B serves a FakeEngine instead of a release, for tests and load tests without a model.
--grpc-port P (P > 0) also serves the Open Inference Protocol over gRPC (serve/kserve_grpc.py: Triton's clients)
on --host:P, over the same Batcher, and prints a second line {"event": "listening_grpc", "host", "port", "url"}
(after the HTTP one). SIGTERM stops both gracefully before the batcher closes. It needs grpcio and
tritonclient[grpc] (the serve extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import pathlib
import signal
import sys
import warnings

from ..data.cifar10 import CLASSES
from ..release.classifier import CIFAR10Classifier
from .app import DEFAULT_MAX_UPLOAD_BYTES, DEFAULT_MODEL_NAME, make_app
from .batcher import Batcher
from .fake_engine import FakeEngine
from .images import DEFAULT_MAX_PIXELS
from .kserve_http import MODEL as KSERVE_MODEL
from .loop_thread import run as run_loop
from .server import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    start_server,
)
from .workers import grpc_url, serve_workers


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected 0 (any free port) to 65535, got {value}")
    return value


def _positive(kind, *, zero: bool = False):
    def parse(text: str):
        value = kind(text)
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected a {'non-negative' if zero else 'positive'} number, got {text}")
        return value

    return parse


def _model_name_arg(text: str) -> str:
    if not text or "/" in text:  # it is a URL path segment of the /v2 routes
        raise argparse.ArgumentTypeError(f"expected a name without '/', got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m resnet_native.serve",
                                description="Serve a CIFAR-10 model release over HTTP (POST /predict, GET /health, "
                                            "GET /metrics), with dynamic batching.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--release", help="a release folder (cifar10_models/version_A) or a version name")
    src.add_argument("--fake-engine-ms", metavar="A,B",
                     help="for tests and load tests: serve a FakeEngine (A ms per call + B ms per image, logits from "
                          "each image's first bytes) instead of a model")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: a free one, printed)")
    p.add_argument("--max-batch", type=_positive(int), default=None,
                   help="most images per engine call (default: the engine's largest batch size; 32 on the host)")
    p.add_argument("--max-delay-ms", type=_positive(float, zero=True), default=0.0,
                   help="extra wait for a batch to fill, from its oldest request (default 0: run what is queued "
                        "as soon as the engine is free)")
    p.add_argument("--max-queue", type=_positive(int), default=1024,
                   help="most requests waiting; beyond it the server answers 503 (default 1024)")
    p.add_argument("--max-upload-bytes", type=_positive(int), default=DEFAULT_MAX_UPLOAD_BYTES,
                   help=f"most bytes in one request (default {DEFAULT_MAX_UPLOAD_BYTES})")
    p.add_argument("--resize", action="store_true",
                   help="accept images of other sizes and resize them to 32x32 (bilinear); without it they get 400")
    p.add_argument("--max-pixels", type=_positive(int), default=DEFAULT_MAX_PIXELS,
                   help=f"largest image (declared width x height) decoded with --resize (default {DEFAULT_MAX_PIXELS})")
    p.add_argument("--shutdown-timeout", type=_positive(float), default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                   help="on SIGTERM, how long in-flight requests may take to finish (default %(default)s s)")
    p.add_argument("--read-timeout-s", type=_positive(float), default=DEFAULT_READ_TIMEOUT_S,
                   help="close a connection whose client sends nothing for this long while the server waits on it "
                        "(headers, body, or an idle kept-alive connection), and one whose request headers take "
                        "longer (default %(default)s s)")
    p.add_argument("--body-timeout-s", type=_positive(float), default=DEFAULT_BODY_TIMEOUT_S,
                   help="close a connection whose request body is not all in this long after its headers "
                        "(default %(default)s s)")
    p.add_argument("--max-connections", type=_positive(int), default=DEFAULT_MAX_CONNECTIONS,
                   help="most open HTTP connections; one more is answered 503 and closed (default %(default)s)")
    p.add_argument("--model-name", type=_model_name_arg, default=None,
                   help="the model's name on the Open Inference Protocol (/v2) routes (default: the release's version "
                        f"folder name, e.g. version_A; {DEFAULT_MODEL_NAME} with --fake-engine-ms)")
    p.add_argument("--grpc-port", type=_port, default=0,
                   help="also serve the Open Inference Protocol over gRPC (KServe v2 / Triton's "
                        "inference.GRPCInferenceService) on this port of --host (default 0: no gRPC server); "
                        "messages up to --max-upload-bytes")
    p.add_argument("--workers", type=_positive(int), default=1,
                   help="front processes on the same ports (SO_REUSEPORT, Linux), each parsing, decoding and "
                        "answering HTTP and gRPC requests for the one engine process through shared memory "
                        "(default 1: a single process); see serve/workers.py")
    return p


def load_fake_engine(spec: str):
    """(FakeEngine, CIFAR-10 class names, what /health says) of --fake-engine-ms A,B."""
    engine = FakeEngine.from_spec(spec, classes=len(CLASSES))
    return engine, CLASSES, {"fake_engine": repr(engine), "device": "none"}


def load_model(release):
    """(engine for the Batcher, what /health says about the model) of a release."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the host path's warning: said below, in one line
        clf = CIFAR10Classifier(release)
    model = {"release": str(clf.version_dir), "name": clf.config["model"]["name"], "precision": clf.precision,
             "device": "gpu" if clf.engine is not None else "host", "backend": clf.backend}
    if clf.engine is not None:
        return clf.engine, clf.classes, model
    how = "onnxruntime on the CPU" if clf.backend == "onnxruntime" else "the NumPy reference ops (seconds per batch)"
    print(f"serve: no CUDA GPU: the model runs on the host through {how}, much slower than on a GPU", file=sys.stderr,
          flush=True)
    return clf.logits, clf.classes, model


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _GrpcUnbound(OSError):
    """The gRPC server could not listen (its message names the address)."""


def _print_grpc_listening(host: str, port: int) -> None:
    print(json.dumps({"event": "listening_grpc", "host": host, "port": port, "url": grpc_url(host, port)}),
          flush=True)


async def serve(app, batcher, host: str, port: int, shutdown_timeout: float, *, grpc=None,
                limits=None) -> dict:
    """Serve until SIGTERM or SIGINT, then shut down gracefully; returns the batcher's final counters. grpc: None,
    or (KServeModel, port, max_message_bytes) to serve the model over gRPC too, on the same host and loop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: (received.append(s.name), stop.set()))
    runner, host, port = await start_server(app, host, port, shutdown_timeout=shutdown_timeout, **(limits or {}))
    print(json.dumps({"event": "listening", "host": host, "port": port, "url": _url(host, port)}), flush=True)
    grpc_server = None
    try:
        if grpc is not None:
            from .kserve_grpc import start_grpc_server  # lazy: grpcio is needed only with --grpc-port

            model, grpc_port, max_message_bytes = grpc
            try:
                grpc_server, grpc_host, grpc_port = await start_grpc_server(model, host, grpc_port,
                                                                            max_message_bytes=max_message_bytes)
            except OSError as e:
                raise _GrpcUnbound(str(e)) from None
            _print_grpc_listening(grpc_host, grpc_port)
        await stop.wait()
    finally:
        print(json.dumps({"event": "stopping", "signal": received[0] if received else None}), file=sys.stderr,
              flush=True)
        # Both servers stop taking calls and answer their in-flight ones (up to shutdown_timeout) together.
        stopping = [runner.cleanup()]
        if grpc_server is not None:
            from .kserve_grpc import stop_grpc_server  # lazy: as start_grpc_server above

            stopping.append(stop_grpc_server(grpc_server, shutdown_timeout))
        await asyncio.gather(*stopping)
        # The queue is empty unless a handler timed out; close() finishes whatever is left, off the loop.
        await loop.run_in_executor(None, batcher.close)
    return batcher.counters()


def _model_name(args, model: dict) -> str:
    if args.model_name is not None:
        return args.model_name
    return pathlib.Path(model["release"]).name if "release" in model else DEFAULT_MODEL_NAME


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    if args.fake_engine_ms is not None:
        try:
            engine, classes, model = load_fake_engine(args.fake_engine_ms)
        except ValueError as e:
            build_parser().error(f"--fake-engine-ms: {e}")
    else:
        engine, classes, model = load_model(args.release)
    batcher = Batcher(engine, max_batch=args.max_batch, max_delay_ms=args.max_delay_ms, max_queue=args.max_queue)
    app_kwargs = {"classes": tuple(classes), "max_upload_bytes": args.max_upload_bytes, "resize": args.resize,
                  "model": model, "max_pixels": args.max_pixels, "model_name": _model_name(args, model)}
    limits = {"read_timeout": args.read_timeout_s, "body_timeout": args.body_timeout_s,
              "max_connections": args.max_connections}
    if args.workers > 1:
        front = {"host": args.host, "port": args.port, "grpc_port": args.grpc_port, "app": app_kwargs,
                 "server": {"shutdown_timeout": args.shutdown_timeout, **limits},
                 "max_message_bytes": args.max_upload_bytes}
        try:
            return serve_workers(batcher, front, args.workers, _url)
        finally:
            batcher.close()
    try:
        app = make_app(batcher, **app_kwargs)
        # The HTTP app's v2 model: gRPC answers for the same model with the same statistics.
        grpc = (app[KSERVE_MODEL], args.grpc_port, args.max_upload_bytes) if args.grpc_port else None
        counters = run_loop(serve(app, batcher, args.host, args.port, args.shutdown_timeout, grpc=grpc,
                                     limits=limits))
    except _GrpcUnbound as e:
        print(f"serve: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the address is taken or not this machine's
        print(f"serve: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    finally:
        batcher.close()
    print(json.dumps({"event": "stopped", "batcher": counters}), flush=True)
    return 0
