"""The Open Inference Protocol over gRPC (serve/kserve_grpc.py) on loopback with a FakeEngine, through Triton's own
clients (tritonclient.grpc and tritonclient.grpc.aio) and hand-built messages for what they never send (typed
contents, bad shapes): health, metadata, config, statistics, UINT8 / FP32 / BYTES inputs with the answers the
engine gives, each refusal's status code and the field its message names, a full queue, a non-finite logit, a
graceful stop with a call in flight, and the command's --grpc-port beside the HTTP server, sharing its statistics."""

import asyncio
import json
import queue
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
from serve_helpers import BAD, WAIT_S, GatedEngine, encode, free_port, images, request

grpc = pytest.importorskip("grpc")
tc = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.grpc.aio import InferenceServerClient as AioClient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from resnet_native.data.augment import MEAN, STD  # noqa: E402
from resnet_native.serve import Batcher, FakeEngine  # noqa: E402
from resnet_native.serve.kserve import KServeModel  # noqa: E402
from resnet_native.serve.kserve_grpc import GrpcServerThread  # noqa: E402

NAME = "cifar"
MAX_BATCH = 4


@pytest.fixture(scope="module")
def served():
    engine = FakeEngine()
    with Batcher(engine, max_batch=MAX_BATCH, max_delay_ms=1.0) as batcher:
        model = KServeModel(batcher, name=NAME)
        model.attach()
        with GrpcServerThread(model) as server:
            yield server, engine
        assert engine.max_concurrent_calls == 1


@pytest.fixture
def client(served):
    c = tc.InferenceServerClient(served[0].url)
    yield c
    c.close()


@pytest.fixture
def stub(served):
    with grpc.insecure_channel(served[0].url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def expected(x):
    return FakeEngine()(x)  # the engine itself, called directly


def normalized(x):
    return ((x / 255.0 - np.asarray(MEAN)) / np.asarray(STD)).astype(np.float32)


def infer_input(name, array, datatype):
    i = tc.InferInput(name, list(array.shape), datatype)
    i.set_data_from_numpy(array)
    return i


def test_health_metadata_config(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(NAME) and client.is_model_ready(NAME, "1")
    assert not client.is_model_ready("other") and not client.is_model_ready(NAME, "2")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "resnet_native" and "statistics" in meta["extensions"]
    model = client.get_model_metadata(NAME, as_json=True)
    assert model["versions"] == ["1"] and [i["name"] for i in model["inputs"]] == ["images", "normalized", "encoded"]
    assert [(o["name"], o["datatype"], o["shape"]) for o in model["outputs"]] == [
        ("logits", "FP32", ["-1", "10"]), ("class", "INT64", ["-1"])]
    config = client.get_model_config(NAME).config
    assert config.name == NAME and config.max_batch_size == MAX_BATCH
    assert [(i.name, i.data_type) for i in config.input][0] == ("images", 2)  # TYPE_UINT8
    assert list(config.input[0].dims) == [32, 32, 3] and config.output[0].dims == [10]


def test_infer_uint8_fp32_bytes_and_class(client, rng):
    x = images(rng, 3)
    want = expected(x)
    outputs = [tc.InferRequestedOutput("logits"), tc.InferRequestedOutput("class")]
    for inp in (infer_input("images", x, "UINT8"), infer_input("normalized", normalized(x), "FP32"),
                infer_input("normalized", normalized(x).astype(np.float16), "FP16"),
                infer_input("encoded", np.array([encode(im) for im in x], dtype=object), "BYTES")):
        r = client.infer(NAME, [inp], outputs=outputs, request_id="r1", client_timeout=WAIT_S)
        np.testing.assert_array_equal(r.as_numpy("logits"), want, err_msg=inp.name())
        np.testing.assert_array_equal(r.as_numpy("class"), np.argmax(want, axis=1))
        assert r.as_numpy("class").dtype == np.int64 and r.get_response().id == "r1"
    only = client.infer(NAME, [infer_input("images", x[:1], "UINT8")], client_timeout=WAIT_S)  # default: logits
    assert only.as_numpy("class") is None and only.as_numpy("logits").shape == (1, 10)


def _request(name="images", datatype="UINT8", shape=(1, 32, 32, 3), raw=None, model=NAME, version="", **contents):
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    tensor = req.inputs.add(name=name, datatype=datatype, shape=list(shape))
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    if raw is not None:
        req.raw_input_contents.append(raw)
    return req


def test_typed_contents(stub, rng):
    x = images(rng, 2)
    want = expected(x)
    for req in (_request(shape=x.shape, uint_contents=x.ravel().tolist()),
                _request("normalized", "FP32", x.shape, fp32_contents=normalized(x).ravel().tolist()),
                _request("encoded", "BYTES", [2], bytes_contents=[encode(im) for im in x])):
        answer = stub.ModelInfer(req, timeout=WAIT_S)
        logits = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(2, 10)
        np.testing.assert_array_equal(logits, want)


def _raw(n=1):
    return bytes(n * 32 * 32 * 3)


@pytest.mark.parametrize("req, code, names", [
    (_request(shape=(1, 32, 32)), "INVALID_ARGUMENT", "inputs[images].shape"),
    (_request(datatype="INT32", raw=_raw(4)), "INVALID_ARGUMENT", "inputs[images].datatype"),
    (_request(name="pixels", raw=_raw()), "INVALID_ARGUMENT", "inputs[pixels]"),
    (_request(raw=_raw()[:-1]), "INVALID_ARGUMENT", "raw_input_contents[0]"),
    (_request(shape=(MAX_BATCH + 1, 32, 32, 3), raw=_raw(MAX_BATCH + 1)), "INVALID_ARGUMENT", "max_batch_size"),
    (_request("encoded", "BYTES", [1], bytes_contents=[b"\x89PNG\r\n\x1a\nnot really"]), "INVALID_ARGUMENT",
     "inputs[encoded].contents.bytes_contents[0]"),
    (_request("normalized", "FP16", fp32_contents=[0.0] * 3072), "INVALID_ARGUMENT", "inputs[normalized].contents"),
    (_request(shape=(1, 32, 32, 3), int_contents=[0] * 3072), "INVALID_ARGUMENT", "uint_contents"),
    (_request(shape=(1, 32, 32, 3), uint_contents=[256] * 3072), "INVALID_ARGUMENT", "inputs[images]"),
    (_request(model="other", raw=_raw()), "NOT_FOUND", "model_name"),
    (_request(version="7", raw=_raw()), "NOT_FOUND", "model_version"),
], ids=["shape", "datatype", "unknown-input", "raw-length", "over-max-batch", "undecodable", "fp16-typed",
        "wrong-contents", "uint8-range", "unknown-model", "unknown-version"])
def test_refusals_name_the_field(stub, req, code, names):
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=WAIT_S)
    assert e.value.code() == getattr(grpc.StatusCode, code) and names in e.value.details(), e.value.details()


def test_refusals_through_tritonclient(client, rng):
    x = images(rng, 1)
    with pytest.raises(InferenceServerException, match=r"outputs\[probs\]") as e:
        client.infer(NAME, [infer_input("images", x, "UINT8")], outputs=[tc.InferRequestedOutput("probs")])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="model_name") as e:
        client.get_model_config("other")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        client.get_model_repository_index()
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"


def test_statistics_count_requests(client, rng):
    before = client.get_inference_statistics(NAME).model_stats[0]
    x = images(rng, 2)
    client.infer(NAME, [infer_input("images", x, "UINT8")], client_timeout=WAIT_S)
    with pytest.raises(InferenceServerException):
        client.infer(NAME, [infer_input("normalized", np.full((1, 32, 32, 3), np.nan, np.float32), "FP32")])
    after = client.get_inference_statistics("").model_stats[0]
    assert after.name == NAME and after.version == "1"
    assert after.inference_count == before.inference_count + 2
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_stats.fail.count >= before.inference_stats.fail.count  # refused before the model
    assert sum(b.batch_size * b.compute_infer.count for b in after.batch_stats) == after.inference_count


def test_aio_client(served, rng):
    x = images(rng, 2)

    async def run():
        client = AioClient(served[0].url)
        try:
            assert await client.is_server_ready() and await client.is_model_ready(NAME)
            meta = await client.get_model_metadata(NAME, as_json=True)
            assert meta["name"] == NAME
            rs = await asyncio.gather(*(client.infer(NAME, [infer_input("images", x[i:i + 1], "UINT8")],
                                                     client_timeout=WAIT_S) for i in range(2)))
            with pytest.raises(InferenceServerException, match="model_version"):
                await client.infer(NAME, [infer_input("images", x, "UINT8")], model_version="3")
            return np.concatenate([r.as_numpy("logits") for r in rs])
        finally:
            await client.close()

    np.testing.assert_array_equal(asyncio.run(asyncio.wait_for(run(), WAIT_S)), expected(x))


class NanGatedEngine(GatedEngine):
    """Waits for its gate; an image whose first byte is BAD gets NaN logits."""

    def __call__(self, x):
        out = super().__call__(x)
        out[np.asarray(x)[:, 0, 0, 0] == BAD] = np.nan
        return out


def test_full_queue_non_finite_logit_and_graceful_stop(rng):
    engine = NanGatedEngine()
    x = images(rng, 2, bad=[1])
    with Batcher(engine, max_batch=1, max_delay_ms=0.0, max_queue=1) as batcher:
        model = KServeModel(batcher, name=NAME)
        server = GrpcServerThread(model)
        try:
            with grpc.insecure_channel(server.url) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                running = stub.ModelInfer.future(_request(raw=x[0].tobytes()), timeout=WAIT_S)
                assert engine.started.wait(WAIT_S)
                queued = stub.ModelInfer.future(_request(raw=x[1].tobytes()), timeout=WAIT_S)
                while batcher.queue_depth < 1:
                    assert not queued.done(), queued.exception()
                    threading.Event().wait(0.01)
                with pytest.raises(grpc.RpcError) as e:
                    stub.ModelInfer(_request(raw=x[0].tobytes()), timeout=WAIT_S)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "busy" in e.value.details()
                # Stop with two calls in flight: they are answered, new ones are not taken.
                stopping = threading.Thread(target=server.stop, kwargs={"grace": WAIT_S})
                stopping.start()
                engine.gate.set()
                answer = running.result(WAIT_S)
                np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], "<f4"),
                                              expected(x[:1])[0])
                with pytest.raises(grpc.RpcError) as e:
                    queued.result(WAIT_S)
                assert e.value.code() == grpc.StatusCode.INTERNAL and "outputs[logits]" in e.value.details()
                stopping.join(WAIT_S)
                assert not stopping.is_alive() and not server._thread.is_alive()
        finally:
            engine.gate.set()
            server.stop()


def test_cli_grpc_port_beside_http(tmp_path, rng):
    from conftest import child_env

    grpc_port = free_port()
    cmd = [sys.executable, "-m", "resnet_native.serve", "--fake-engine-ms", "0,0", "--port", "0", "--grpc-port",
           str(grpc_port), "--model-name", NAME]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=child_env())
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        http = json.loads(lines.get(timeout=120))
        listening = json.loads(lines.get(timeout=WAIT_S))
        assert http["event"] == "listening" and listening == {
            "event": "listening_grpc", "host": "127.0.0.1", "port": grpc_port, "url": f"127.0.0.1:{grpc_port}"}
        x = images(rng, 2)
        client = tc.InferenceServerClient(listening["url"])
        r = client.infer(NAME, [infer_input("images", x, "UINT8")], client_timeout=WAIT_S)
        client.close()
        np.testing.assert_array_equal(r.as_numpy("logits"), expected(x))
        status, _, stats = request(http["port"], "GET", f"/v2/models/{NAME}/stats")  # the one model's statistics
        assert status == 200 and stats["model_stats"][0]["inference_stats"]["success"]["count"] == 1, stats
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert '"signal": "SIGTERM"' in proc.stderr.read()


def test_cli_taken_grpc_port_exits_1(tmp_path):
    from conftest import child_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "resnet_native.serve", "--fake-engine-ms", "0,0", "--port", "0",
                              "--grpc-port", str(port)], capture_output=True, text=True, cwd=tmp_path,
                             env=child_env(), timeout=120)
    assert out.returncode == 1 and f"127.0.0.1:{port}" in out.stderr and "gRPC" in out.stderr, out.stderr
