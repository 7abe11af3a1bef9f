"""The Open Inference Protocol (KServe v2) over REST without a GPU: Triton's own clients (tritonclient.http, sync
and asyncio) against the server on 127.0.0.1 with a FakeEngine, JSON and binary tensors, UINT8 / FP32 / FP16 /
BYTES inputs, the class output, metadata, config, statistics and health, and every refusal answered with its
status and a message naming the field."""

import asyncio
import base64
import concurrent.futures
import json
import time

import numpy as np
import pytest
from serve_helpers import WAIT_S, GatedEngine, PickyEngine, encode, images, request

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
httpclient = pytest.importorskip("tritonclient.http")

from tritonclient.utils import InferenceServerException  # noqa: E402

from resnet_native.data.augment import normalize_on_host  # noqa: E402
from resnet_native.release.classifier import softmax  # noqa: E402
from resnet_native.serve import Batcher, FakeEngine, make_app  # noqa: E402
from resnet_native.serve.kserve import (  # noqa: E402
    KServeModel,
    ProtocolError,
    join_bytes,
    pixels_from_normalized,
    split_bytes,
)
from resnet_native.serve.server import ServerThread  # noqa: E402

CLASSES = tuple(f"class{i}" for i in range(10))
NAME = "version_T"
HEADER = "Inference-Header-Content-Length"


@pytest.fixture
def start():
    """start(engine=None, **Batcher kwargs) -> (ServerThread, Batcher); both closed afterwards."""
    running = []

    def start_(engine=None, *, resize=False, **batcher_kwargs):
        batcher_kwargs.setdefault("max_delay_ms", 1.0)
        batcher = Batcher(engine or FakeEngine(), **batcher_kwargs)
        server = ServerThread(make_app(batcher, CLASSES, model_name=NAME, resize=resize,
                                       max_upload_bytes=16 * 1024 * 1024))
        running.append((server, batcher))
        return server, batcher

    yield start_
    for server, batcher in running:
        server.stop()
        batcher.close()


def client(server):
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")


def triton_input(name, array, datatype, binary):
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def outputs(binary, *names):
    return [httpclient.InferRequestedOutput(n, binary_data=binary) for n in names]


def expected(x):
    return FakeEngine().expected_logits(x)


def post(server, body, headers=None, path=f"/v2/models/{NAME}/infer"):
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    return request(server.port, "POST", path, body, headers or {})


def uint8_request(x, **extra):
    return {"inputs": [{"name": "images", "datatype": "UINT8", "shape": list(x.shape),
                        "data": x.ravel().tolist(), **extra}]}


# -- the protocol through Triton's clients ------------------------------------------------------------------


def test_health_metadata_and_config(start):
    server, batcher = start(max_batch=16)
    c = client(server)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready(NAME) and c.is_model_ready(NAME, "1") and not c.is_model_ready("other")
    meta = c.get_server_metadata()
    assert meta["name"] == "resnet_native"
    assert {"binary_tensor_data", "model_configuration", "statistics"} <= set(meta["extensions"])
    for version in ("", "1"):
        m = c.get_model_metadata(NAME, version)
        assert m["name"] == NAME and m["versions"] == ["1"] and m["platform"] == "resnet_native"
        assert {(i["name"], i["datatype"], tuple(i["shape"])) for i in m["inputs"]} == {
            ("images", "UINT8", (-1, 32, 32, 3)), ("normalized", "FP32", (-1, 32, 32, 3)), ("encoded", "BYTES", (-1,))}
        assert [(o["name"], o["datatype"], o["shape"]) for o in m["outputs"]] == [
            ("logits", "FP32", [-1, 10]), ("class", "INT64", [-1])]
    config = c.get_model_config(NAME)
    assert config["name"] == NAME and config["max_batch_size"] == 16
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]][0] == ("images", "TYPE_UINT8", [32, 32, 3])
    assert [(o["name"], o["data_type"]) for o in config["output"]] == [("logits", "TYPE_FP32"), ("class", "TYPE_INT64")]
    c.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_uint8_images(start, rng, binary):
    server, batcher = start()
    c = client(server)
    x = images(rng, 5)
    result = c.infer(NAME, [triton_input("images", x, "UINT8", binary)], outputs=outputs(binary, "logits", "class"),
                     request_id="req-7")
    logits = result.as_numpy("logits")
    assert logits.dtype == np.float32 and logits.shape == (5, 10)
    np.testing.assert_array_equal(logits, expected(x))
    np.testing.assert_array_equal(result.as_numpy("class"), np.argmax(expected(x), axis=1))
    assert result.as_numpy("class").dtype == np.int64
    answer = result.get_response()
    assert answer["model_name"] == NAME and answer["model_version"] == "1" and answer["id"] == "req-7"
    # Without outputs named: logits alone. The /predict path agrees on the same image.
    default = c.infer(NAME, [triton_input("images", x[:1], "UINT8", binary)], model_version="1")
    assert [o["name"] for o in default.get_response()["outputs"]] == ["logits"]
    status, _, predicted = request(server.port, "POST", "/predict", encode(x[0]), {"Content-Type": "image/png"})
    assert status == 200 and predicted["class"] == int(np.argmax(default.as_numpy("logits")[0]))
    np.testing.assert_allclose(predicted["probabilities"], softmax(default.as_numpy("logits")[0]), rtol=1e-6)
    c.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_normalized_images(start, rng, dtype, binary):
    server, _ = start()
    c = client(server)
    x = images(rng, 3)
    normalized = normalize_on_host(x).astype(dtype)
    datatype = "FP32" if dtype == np.float32 else "FP16"
    result = c.infer(NAME, [triton_input("normalized", normalized, datatype, binary)],
                     outputs=outputs(binary, "logits"))
    np.testing.assert_array_equal(result.as_numpy("logits"), expected(x))  # back to the pixels it was made from
    c.close()


def test_encoded_images(start, rng):
    server, _ = start()
    c = client(server)
    x = images(rng, 3)
    png = np.array([encode(im) for im in x], dtype=np.object_)
    result = c.infer(NAME, [triton_input("encoded", png, "BYTES", True)], outputs=outputs(False, "logits", "class"))
    np.testing.assert_array_equal(result.as_numpy("logits"), expected(x))
    # JPEG is lossy: the answer is the engine's on what the server decoded; [N, 1] is the same batch.
    jpeg = encode(x[0], "JPEG", quality=95)
    result = c.infer(NAME, [triton_input("encoded", np.array([[jpeg]], dtype=np.object_), "BYTES", True)])
    assert result.as_numpy("logits").shape == (1, 10)
    # In JSON a BYTES element is a string: the image's base64.
    b64 = np.array([base64.b64encode(encode(im)).decode() for im in x], dtype=np.object_)
    result = c.infer(NAME, [triton_input("encoded", b64, "BYTES", False)], outputs=outputs(True, "class"))
    np.testing.assert_array_equal(result.as_numpy("class"), np.argmax(expected(x), axis=1))
    c.close()


def test_resize_decodes_larger_images(start, rng):
    server, _ = start(resize=True)
    big = rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)
    with client(server) as c:
        result = c.infer(NAME, [triton_input("encoded", np.array([encode(big)], np.object_), "BYTES", True)])
    assert result.as_numpy("logits").shape == (1, 10)


def test_asyncio_client_and_statistics(start, rng):
    import tritonclient.http.aio as aioclient

    server, batcher = start()
    x = images(rng, 8)

    async def main():
        c = aioclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        try:
            assert await c.is_server_live() and await c.is_model_ready(NAME)
            assert (await c.get_model_metadata(NAME))["name"] == NAME
            assert (await c.get_model_config(NAME))["max_batch_size"] == batcher.max_batch

            async def one(i):
                inp = aioclient.InferInput("images", [2, 32, 32, 3], "UINT8")
                inp.set_data_from_numpy(x[2 * i:2 * i + 2], binary_data=True)
                out = [aioclient.InferRequestedOutput("logits", binary_data=True)]
                return (await c.infer(NAME, [inp], outputs=out)).as_numpy("logits")

            rows = await asyncio.gather(*(one(i) for i in range(4)))
            return rows, await c.get_inference_statistics(NAME)
        finally:
            await c.close()

    rows, stats = asyncio.run(main())
    np.testing.assert_array_equal(np.concatenate(rows), expected(x))
    (s,) = stats["model_stats"]
    assert s["name"] == NAME and s["version"] == "1" and s["inference_count"] == 8
    assert s["execution_count"] == batcher.counters()["batches"] >= 1
    st = s["inference_stats"]
    assert st["success"]["count"] == 4 and st["fail"]["count"] == 0 and st["queue"]["count"] == 4
    assert st["compute_infer"]["count"] == s["execution_count"] and st["compute_infer"]["ns"] > 0
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in s["batch_stats"]) == 8


def test_statistics_through_the_sync_client(start, rng):
    server, _ = start(PickyEngine())
    with client(server) as c:
        c.infer(NAME, [triton_input("images", images(rng, 2), "UINT8", True)])
        with pytest.raises(InferenceServerException) as e:
            c.infer(NAME, [triton_input("images", images(rng, 1, bad=[0]), "UINT8", True)])
        assert e.value.status() == "500" and "inference failed" in e.value.message()
        everything = c.get_inference_statistics()
        mine = c.get_inference_statistics(NAME, "1")
    assert everything["model_stats"][0]["name"] == NAME
    st = mine["model_stats"][0]["inference_stats"]
    assert st["success"]["count"] == 1 and st["fail"]["count"] == 1


def test_v2_requests_in_metrics(start, rng):
    server, _ = start()
    with client(server) as c:
        c.infer(NAME, [triton_input("images", images(rng, 1), "UINT8", True)])
    assert post(server, {"inputs": []})[0] == 400
    _, _, text = request(server.port, "GET", "/metrics")
    assert 'resnet_native_http_requests_total{code="200",handler="/v2/models/{model}/infer"} 1.0' in text
    assert 'resnet_native_http_requests_total{code="400",handler="/v2/models/{model}/infer"} 1.0' in text
    assert 'resnet_native_errors_total{reason="v2_bad_request"} 1.0' in text


# -- refusals: status and the field named -------------------------------------------------------------------


def assert_refused(answer, status, *words):
    got, _, body = answer
    assert got == status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    for w in words:
        assert w in body["error"], (w, body["error"])


def test_refusals_of_the_request(start, rng):
    server, _ = start(max_batch=4)
    x = images(rng, 2)
    good = uint8_request(x)

    def with_input(**changes):
        return {"inputs": [{**good["inputs"][0], **changes}]}

    assert_refused(post(server, with_input(shape=[2, 32, 32, 4])), 400, "inputs[images].shape", "[2, 32, 32, 4]")
    assert_refused(post(server, with_input(shape=[2, 3072])), 400, "inputs[images].shape")
    assert_refused(post(server, with_input(datatype="FP32")), 400, "inputs[images].datatype", "UINT8")
    assert_refused(post(server, with_input(datatype="UINT9")), 400, "inputs[images].datatype", "UINT9")
    assert_refused(post(server, with_input(name="pixels")), 400, "inputs[pixels]", "unknown input name")
    assert_refused(post(server, with_input(shape=[0, 32, 32, 3], data=[])), 400, "inputs[images].shape", "empty")
    five = images(rng, 5)
    assert_refused(post(server, uint8_request(five)), 400, "inputs[images].shape", "max_batch_size=4")
    assert_refused(post(server, with_input(data=x.ravel().tolist()[:-1])), 400, "inputs[images].data", "6143")
    assert_refused(post(server, with_input(data=[300] * x.size)), 400, "inputs[images].data", "0 to 255")
    assert_refused(post(server, with_input(data=["a"] * x.size)), 400, "inputs[images].data")
    del good["inputs"][0]["data"]
    assert_refused(post(server, good), 400, "inputs[images]", "neither")
    assert_refused(post(server, {"inputs": []}), 400, "inputs")
    assert_refused(post(server, {"inputs": [uint8_request(x)["inputs"][0]] * 2}), 400, "inputs", "exactly one")
    assert_refused(post(server, {**uint8_request(x), "outputs": [{"name": "probs"}]}), 400, "outputs[probs]")
    assert_refused(post(server, {**uint8_request(x), "outputs": [{"name": "class",
                                                                  "parameters": {"classification": 3}}]}),
                   400, "outputs[class].parameters.classification")
    assert_refused(post(server, b"{not json"), 400, "not JSON")
    assert_refused(post(server, b"[1, 2]"), 400, "request", "JSON object")


def test_refusals_of_binary_data(start, rng):
    server, _ = start()
    x = images(rng, 2)
    head = json.dumps({"inputs": [{"name": "images", "datatype": "UINT8", "shape": [2, 32, 32, 3],
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()

    def binary(body, length):
        return post(server, body, {HEADER: str(length), "Content-Type": "application/octet-stream"})

    assert binary(head + x.tobytes(), len(head))[0] == 200
    assert_refused(binary(head + x.tobytes()[:-10], len(head)), 400, "inputs[images].parameters.binary_data_size",
                   f"{x.nbytes - 10} binary bytes")
    assert_refused(binary(head + x.tobytes() + b"extra", len(head)), 400, HEADER, "5 bytes")
    assert_refused(binary(head + x.tobytes(), len(head) + x.nbytes + 1), 400, HEADER, "the body has")
    assert_refused(binary(head + x.tobytes(), "lots"), 400, HEADER, "'lots'")
    assert_refused(binary(b"\xff\xfenot json" + x.tobytes(), 10), 400, HEADER, "not JSON")
    short = head.replace(str(x.nbytes).encode(), str(x.nbytes - 1).encode())
    assert_refused(binary(short + x.tobytes()[:-1], len(short)), 400, "inputs[images].data", f"{x.nbytes - 1} bytes")
    # BYTES: a bad image names its element; a broken length prefix names the data.
    good = encode(x[0])
    for elements, words in (([good, b"\x89PNG\r\n\x1a\nbroken"], ("inputs[encoded].data[1]", "PNG")),
                            ([good, b"GIF89a"], ("inputs[encoded].data[1]", "not a PNG or JPEG")),
                            ([encode(images(rng, 1)[0][:16])], ("inputs[encoded].data[0]", "32x16"))):
        raw = join_bytes(elements)
        h = json.dumps({"inputs": [{"name": "encoded", "datatype": "BYTES", "shape": [len(elements)],
                                    "parameters": {"binary_data_size": len(raw)}}]}).encode()
        assert_refused(binary(h + raw, len(h)), 400, *words)
    raw = join_bytes([good])[:-3]
    h = json.dumps({"inputs": [{"name": "encoded", "datatype": "BYTES", "shape": [1],
                                "parameters": {"binary_data_size": len(raw)}}]}).encode()
    assert_refused(binary(h + raw, len(h)), 400, "inputs[encoded].data", "past the data's end")
    assert_refused(post(server, {"inputs": [{"name": "encoded", "datatype": "BYTES", "shape": [1],
                                             "data": ["not base64!"]}]}), 400, "inputs[encoded].data[0]", "base64")


def test_refusals_of_names_and_versions(start, rng):
    server, _ = start()
    body = uint8_request(images(rng, 1))
    assert_refused(post(server, body, path="/v2/models/other/infer"), 404, "model_name", "'other'")
    assert_refused(post(server, body, path=f"/v2/models/{NAME}/versions/2/infer"), 404, "model_version", "'2'")
    assert post(server, body, path=f"/v2/models/{NAME}/versions/1/infer")[0] == 200
    for path in ("/v2/models/other", f"/v2/models/{NAME}/versions/2", "/v2/models/other/config",
                 "/v2/models/other/stats", "/v2/models/other/ready", "/v2/models/stats?name=other"):
        assert_refused(request(server.port, "GET", path), 404, "model_")
    with client(server) as c:
        with pytest.raises(InferenceServerException) as e:
            c.get_model_metadata("other")
        assert e.value.status() == "404" and "model_name" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            c.infer(NAME, [triton_input("images", images(rng, 1), "UINT8", True)], model_version="3")
        assert e.value.status() == "404" and "model_version" in e.value.message()


def test_engine_failures_and_a_full_queue(start, rng):
    class NaNEngine(FakeEngine):
        def __call__(self, x):
            out = super().__call__(x)
            out[:, 3] = np.nan
            return out

    server, _ = start(NaNEngine())
    assert_refused(post(server, uint8_request(images(rng, 2))), 500, "outputs[logits]", "non-finite")
    server, _ = start(PickyEngine())
    assert_refused(post(server, uint8_request(images(rng, 1, bad=[0]))), 500, "inference failed")
    engine = GatedEngine()
    server, batcher = start(engine, max_queue=2, max_batch=2)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        try:
            first = pool.submit(post, server, uint8_request(images(rng, 1)))  # held in the engine by the gate
            assert engine.started.wait(WAIT_S)
            second = pool.submit(post, server, uint8_request(images(rng, 2)))  # fills the queue
            deadline = time.monotonic() + WAIT_S
            while batcher.queue_depth < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            status, headers, body = post(server, uint8_request(images(rng, 1)))
            assert status == 503 and headers["Retry-After"] == "1" and "busy" in body["error"], body
        finally:
            engine.gate.set()
        assert first.result()[0] == second.result()[0] == 200
    assert request(server.port, "GET", "/v2/health/ready")[0] == 200


def test_not_ready_once_closing(start):
    server, batcher = start()
    batcher.close()
    assert request(server.port, "GET", "/v2/health/ready")[0] == 503
    assert request(server.port, "GET", f"/v2/models/{NAME}/ready")[0] == 503
    assert request(server.port, "GET", "/v2/health/live")[0] == 200
    assert_refused(post(server, uint8_request(np.zeros((1, 32, 32, 3), np.uint8))), 503, "shutting down")


# -- the shared pieces alone ----------------------------------------------------------------------------------


def test_bytes_framing_and_normalised_pixels(rng):
    elements = [b"", b"a", bytes(range(256)) * 3]
    assert split_bytes(join_bytes(elements), "f") == elements
    with pytest.raises(ProtocolError, match="f: BYTES data ends inside"):
        split_bytes(b"\x01\x00", "f")
    x = images(rng, 4)
    for dtype in ("fp32", "fp16"):
        np.testing.assert_array_equal(pixels_from_normalized(normalize_on_host(x, dtype=dtype), "f"), x)
    with pytest.raises(ProtocolError, match="finite") as e:
        pixels_from_normalized(np.full((1, 32, 32, 3), np.inf), "inputs[normalized].data")
    assert e.value.status == 400
    with pytest.raises(ProtocolError, match="outside the normalised range"):
        pixels_from_normalized(np.full((1, 32, 32, 3), 5.0), "f")


def test_model_names_and_limits():
    with Batcher(FakeEngine(), max_batch=8, max_queue=4) as batcher:
        model = KServeModel(batcher, name="m")
        assert model.max_batch_size == 4  # never more than the queue holds
        with pytest.raises(ProtocolError) as e:
            model.check("m", "2")
        assert e.value.status == 404
        model.check("m", "1")
        model.check("m", "")
        with pytest.raises(ValueError, match="name"):
            KServeModel(batcher, name="a/b")


def test_cli_model_name(capsys):
    from resnet_native.serve.cli import _model_name, build_parser

    args = build_parser().parse_args(["--fake-engine-ms", "0,0"])
    assert _model_name(args, {"fake_engine": "..."}) == "resnet_native"
    assert _model_name(args, {"release": "/models/version_B"}) == "version_B"
    args = build_parser().parse_args(["--fake-engine-ms", "0,0", "--model-name", "cifar"])
    assert _model_name(args, {"release": "/models/version_B"}) == "cifar"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--fake-engine-ms", "0,0", "--model-name", "a/b"])
    assert "--model-name" in capsys.readouterr().err
