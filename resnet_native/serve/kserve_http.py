"""The Open Inference Protocol (KServe v2) over REST, as routes of the serve app (make_app adds them).

    GET  /v2/health/live, /v2/health/ready, /v2 (server metadata)
    GET  /v2/models/{m}[/versions/{v}], .../ready, .../config, .../stats; GET /v2/models/stats
    POST /v2/models/{m}[/versions/{v}]/infer

kserve.py does the protocol's work (inputs, outputs, metadata, statistics); this module only reads and writes
HTTP: the JSON body, and Triton's binary tensor data extension, where the header Inference-Header-Content-Length
says how many leading bytes are JSON and the rest are the inputs' bytes in order, each input's
parameters.binary_data_size long. Outputs asked for with parameters.binary_data (or the request's
binary_data_output) come back the same way. A refusal raises kserve.ProtocolError; the app's middleware answers it
as {"error": message} with its status.
"""

from __future__ import annotations

import asyncio
import json

try:
    from aiohttp import web
except ImportError as e:  # the HTTP server is the serve extra; app.py, which imports this module, says so first
    raise ImportError(f'resnet_native.serve: the HTTP server needs aiohttp ({e.name} is not installed): '
                      f'pip install "resnet_native[serve]"') from e

from .kserve import ENCODED, KServeModel, ProtocolError, server_metadata, to_json, to_raw

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE, BINARY_TYPE = "application/json", "application/octet-stream"
MODEL = web.AppKey("resnet_native_kserve_model", KServeModel)


def add_routes(app: web.Application, model: KServeModel) -> None:
    """Serve `model` over the v2 REST protocol from `app` (whose middleware answers ProtocolError)."""
    app[MODEL] = model
    r = app.router
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_get("/v2", metadata)
    r.add_get("/v2/models/stats", stats)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        r.add_get(base, model_metadata)
        r.add_get(base + "/ready", model_ready)
        r.add_get(base + "/config", model_config)
        r.add_get(base + "/stats", stats)
        r.add_post(base + "/infer", infer)


def _model(request: web.Request) -> KServeModel:
    """The app's model, after checking the path's model name and version (404 otherwise)."""
    model = request.app[MODEL]
    if "model" in request.match_info:
        model.check(request.match_info["model"], request.match_info.get("version"))
    return model


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = request.app[MODEL].ready
    return web.json_response({"ready": ok}, status=200 if ok else 503)


async def metadata(request: web.Request) -> web.Response:
    return web.json_response(server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    return web.json_response(_model(request).metadata())


async def model_ready(request: web.Request) -> web.Response:
    ok = _model(request).ready
    return web.json_response({"name": request.match_info["model"], "ready": ok}, status=200 if ok else 503)


async def model_config(request: web.Request) -> web.Response:
    return web.json_response(_model(request).config())


async def stats(request: web.Request) -> web.Response:
    """Triton's statistics: one model's (the path's) or every model's (this server's one)."""
    model = request.app[MODEL]
    if "model" in request.match_info:
        model = _model(request)
    else:  # /v2/models/stats may filter by ?name= (and version), as Triton's does
        name = request.query.get("name")
        if name is not None:
            model.check(name, request.query.get("version"))
    return web.json_response({"model_stats": [model.stats.snapshot()]})


# -- POST .../infer ------------------------------------------------------------------------------------------


def _split_body(body: bytes, header) -> tuple:
    """(JSON request, binary tail) of a body, by the Inference-Header-Content-Length header when present."""
    if header is None:
        head, tail = body, b""
    else:
        try:
            length = int(header)
        except ValueError:
            raise ProtocolError(400, f"{HEADER_LENGTH}: expected a number of bytes, got {header!r}") from None
        if not 0 <= length <= len(body):
            raise ProtocolError(400, f"{HEADER_LENGTH}: {length} bytes of JSON, but the body has {len(body)}")
        head, tail = body[:length], body[length:]
    try:
        request = json.loads(head)
    except (ValueError, UnicodeDecodeError) as e:
        where = "the request's JSON" if header is None else f"the first {HEADER_LENGTH} bytes"
        raise ProtocolError(400, f"{where}: not JSON ({e})") from None
    if not isinstance(request, dict):
        raise ProtocolError(400, f"request: expected a JSON object, got {type(request).__name__}")
    return request, tail


def _parameters(obj: dict, field: str) -> dict:
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise ProtocolError(400, f"{field}.parameters: expected an object, got {type(params).__name__}")
    return params


def _read_input(request: dict, tail: bytes) -> tuple:
    """(name, datatype, shape, raw, data) of the request's one input, its binary part cut from `tail`."""
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ProtocolError(400, "inputs: expected a list with one input (images, normalized or encoded)")
    if len(inputs) != 1:
        names = [i.get("name") if isinstance(i, dict) else i for i in inputs]
        raise ProtocolError(400, f"inputs: expected exactly one input, got {len(inputs)} ({names})")
    tensor = inputs[0]
    if not isinstance(tensor, dict):
        raise ProtocolError(400, f"inputs[0]: expected an object, got {type(tensor).__name__}")
    name = tensor.get("name")
    if not isinstance(name, str):
        raise ProtocolError(400, "inputs[0].name: expected a string")
    for key in ("datatype", "shape"):
        if key not in tensor:
            raise ProtocolError(400, f"inputs[{name}].{key}: missing")
    size = _parameters(tensor, f"inputs[{name}]").get("binary_data_size")
    raw = None
    if size is not None:
        field = f"inputs[{name}].parameters.binary_data_size"
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProtocolError(400, f"{field}: expected a number of bytes, got {size!r}")
        if size > len(tail):
            raise ProtocolError(400, f"{field}: {size} bytes, but only {len(tail)} binary bytes follow the JSON")
        raw, tail = tail[:size], tail[size:]
    if tail:
        raise ProtocolError(400, f"{HEADER_LENGTH}: {len(tail)} bytes after the JSON that no input's "
                                 "parameters.binary_data_size claims")
    return name, tensor["datatype"], tensor["shape"], raw, tensor.get("data")


def _requested_outputs(request: dict, model: KServeModel) -> list:
    """[(name, binary)] of the requested outputs; without a list, the default ones."""
    binary_all = _parameters(request, "request").get("binary_data_output", False)
    if not isinstance(binary_all, bool):
        raise ProtocolError(400, f"parameters.binary_data_output: expected true or false, got {binary_all!r}")
    outputs = request.get("outputs")
    if outputs is None:
        return [(n, binary_all) for n in model.check_outputs(None)]
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                for o in outputs):
        raise ProtocolError(400, "outputs: expected a list of objects with a name")
    wanted = []
    for o in outputs:
        params = _parameters(o, f"outputs[{o['name']}]")
        if params.get("classification"):
            raise ProtocolError(400, f"outputs[{o['name']}].parameters.classification: not supported; ask for the "
                                     "class output")
        binary = params.get("binary_data", binary_all)
        if not isinstance(binary, bool):
            raise ProtocolError(400, f"outputs[{o['name']}].parameters.binary_data: expected true or false")
        wanted.append((o["name"], binary))
    model.check_outputs([n for n, _ in wanted])
    return wanted


async def answer_infer(model: KServeModel, name: str, version, body: bytes, header) -> tuple:
    """POST .../infer without its transport: the path's model `name` and `version` (None: none given), the whole
    body and the Inference-Header-Content-Length header (None: absent) -> (answer bytes, content type, headers).
    Refusals raise ProtocolError. The aiohttp route below and http_front.py's own route both answer through here."""
    model.check(name, version)
    req, tail = _split_body(body, header)
    name, datatype, shape, raw, data = _read_input(req, tail)
    wanted = _requested_outputs(req, model)
    if name == ENCODED and model.resize:  # megapixel uploads: decode and resize off the loop
        images = await asyncio.get_running_loop().run_in_executor(
            None, lambda: model.decode_input(name, datatype, shape, raw=raw, data=data))
    else:
        images = model.decode_input(name, datatype, shape, raw=raw, data=data)
    logits = await model.infer(images)
    binary = dict(wanted)
    answer = {"model_name": model.name, "model_version": model.version, "outputs": []}
    if "id" in req:
        answer["id"] = req["id"]
    chunks = []
    for out_name, out_type, out_shape, array in model.outputs(logits, [n for n, _ in wanted]):
        tensor = {"name": out_name, "datatype": out_type, "shape": out_shape}
        if binary[out_name]:
            chunks.append(to_raw(array, out_type))
            tensor["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            tensor["data"] = to_json(array)
        answer["outputs"].append(tensor)
    head = json.dumps(answer).encode()
    if not chunks:
        return head, JSON_TYPE, {}
    return b"".join([head, *chunks]), BINARY_TYPE, {HEADER_LENGTH: str(len(head))}


async def infer(request: web.Request) -> web.Response:
    body = await request.read()  # client_max_size: 413 past the app's upload limit
    payload, content_type, headers = await answer_infer(request.app[MODEL], request.match_info["model"],
                                                        request.match_info.get("version"), body,
                                                        request.headers.get(HEADER_LENGTH))
    return web.Response(body=payload, content_type=content_type, headers=headers)
