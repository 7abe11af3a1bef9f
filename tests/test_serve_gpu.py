"""Serving on the GPU: a Batcher in front of a real InferenceEngine (requests from many threads, each answered with
its own row, equal to the engine's answer for that image alone), and the HTTP server on a released model answering
as CIFAR10Classifier does."""

import concurrent.futures
import pathlib

import numpy as np
import pytest
from serve_helpers import encode, free_port, images, request
from test_inference_plan_cpu import randomized_state
from test_release_cpu import make_fake_run

import resnet_native as rn
from resnet_native.inference import InferenceEngine
from resnet_native.release.classifier import softmax
from resnet_native.serve import Batcher

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

# Engine logits for one image inside a padded batch of 8 or 32 against the same image in the batch-1 graph: the
# graphs may run different convolution algorithms, which round fp16 accumulations differently.
FP16_TOLERANCE = 2e-2


@pytest.fixture
def engine(rng):
    # Per test: the descriptor-leak fixture drops cached plans after each test, which a live engine still uses.
    model = rn.ResNet(18, 10, stem="cifar", layout="NHWC", precision="fp16", seed=0)
    model.load_state_dict(randomized_state(model, rng))
    with InferenceEngine(model.cuda().eval(), batch_sizes=(1, 8, 32), precision="fp16") as e:
        yield e


def test_batched_rows_match_single_image_calls(engine, rng):
    pixels = images(rng, 96)
    alone = np.stack([engine(pixels[i:i + 1]).get()[0] for i in range(len(pixels))])
    sizes = []
    with Batcher(engine, max_delay_ms=5.0, on_batch=lambda n, s: sizes.append(n)) as batcher:
        assert batcher.max_batch == 32  # the engine's largest captured batch size
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = list(pool.map(batcher.submit, pixels))
        rows = np.stack([f.result(timeout=60) for f in futures])
    assert rows.shape == alone.shape and rows.dtype == np.float32 and np.all(np.isfinite(rows))
    scale = float(np.abs(alone).max())
    assert scale > 0 and float(np.abs(rows - alone).max()) <= FP16_TOLERANCE * scale
    # Rows belong to their own images: every row is closer to its image's lone answer than to any other's.
    distance = np.abs(rows[:, None, :] - alone[None, :, :]).max(axis=2)
    assert np.array_equal(distance.argmin(axis=1), np.arange(len(pixels)))
    assert sum(sizes) == len(pixels) and max(sizes) <= 32 and len(sizes) < len(pixels)


def test_server_answers_as_the_classifier(tmp_path, rng):
    pytest.importorskip("aiohttp", reason="the serve extra: pip install '.[serve]'")
    pytest.importorskip("httptools", reason="the serve extra: pip install '.[serve]'")
    from resnet_native.release.build import release
    from resnet_native.release.classifier import CIFAR10Classifier
    from resnet_native.serve import make_app
    from resnet_native.serve.server import ServerThread

    make_fake_run(tmp_path / "run")
    version = release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    clf = CIFAR10Classifier(version, engine_batch_sizes=(1, 8))
    assert clf.backend == "engine"
    image = images(rng, 1)[0]
    expected = softmax(clf.logits(image))
    try:
        with Batcher(clf.engine, max_delay_ms=1.0) as batcher, ServerThread(make_app(batcher, clf.classes)) as server:
            status, _, answer = request(server.port, "POST", "/predict", encode(image), {"Content-Type": "image/png"})
    finally:
        clf.engine.close()
    assert status == 200, answer
    assert answer["class"] == int(np.argmax(expected)) and answer["name"] == clf.classes[answer["class"]]
    np.testing.assert_allclose(answer["probabilities"], expected, rtol=1e-5, atol=1e-7)
    assert pathlib.Path(version, "model.onnx").is_file()


def test_tritonclient_against_the_served_release_answers_as_the_classifier(tmp_path, rng):
    """python -m resnet_native.serve --release R --workers 2 --grpc-port P on the GPU: tritonclient's HTTP and gRPC
    clients (sync and asyncio) get the classifier's logits for uint8 tensors, through the shared-memory fronts."""
    import asyncio
    import json
    import subprocess
    import sys

    grpcclient = pytest.importorskip("tritonclient.grpc")
    grpcaio = pytest.importorskip("tritonclient.grpc.aio")
    httpclient = pytest.importorskip("tritonclient.http")
    from conftest import child_env

    from resnet_native.release.build import release
    from resnet_native.release.classifier import CIFAR10Classifier

    make_fake_run(tmp_path / "run")
    version = release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    x = images(rng, 24)
    clf = CIFAR10Classifier(version, engine_batch_sizes=(1, 8, 32))
    try:
        expected = np.asarray(clf.logits(x), np.float32)
    finally:
        clf.engine.close()
    grpc_port = free_port()
    cmd = [sys.executable, "-m", "resnet_native.serve", "--release", str(version), "--port", "0", "--workers", "2",
           "--grpc-port", str(grpc_port), "--model-name", "m"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=child_env())
    try:
        http_line, grpc_line = (json.loads(proc.stdout.readline()) for _ in range(2))
        assert (http_line["event"], grpc_line["event"]) == ("listening", "listening_grpc"), (http_line, grpc_line)
        got = []
        for i, part in enumerate(np.split(x, 6)):  # fresh clients: connections spread over both fronts
            module = (httpclient, grpcclient)[i % 2]
            client = module.InferenceServerClient(f"127.0.0.1:{http_line['port']}" if i % 2 == 0 else grpc_line["url"])
            inp = module.InferInput("images", list(part.shape), "UINT8")
            inp.set_data_from_numpy(part, **({"binary_data": i % 4 == 0} if i % 2 == 0 else {}))
            got.append(client.infer("m", [inp]).as_numpy("logits"))
            client.close()

        async def aio_infer():
            async with grpcaio.InferenceServerClient(grpc_line["url"]) as client:
                inp = grpcaio.InferInput("images", list(x.shape), "UINT8")
                inp.set_data_from_numpy(x)
                return (await client.infer("m", [inp])).as_numpy("logits")

        got_aio = asyncio.run(aio_infer())
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    scale = float(np.abs(expected).max())
    for answer in (np.concatenate(got), got_aio):
        assert answer.shape == expected.shape and answer.dtype == np.float32
        assert float(np.abs(answer - expected).max()) <= FP16_TOLERANCE * scale
