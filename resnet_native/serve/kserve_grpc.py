"""The Open Inference Protocol over gRPC (`inference.GRPCInferenceService`, KServe v2 / Triton), so that Triton's
clients (tritonclient.grpc, its aio twin, perf_analyzer) talk to the server.

    model = KServeModel(batcher, name="version_A"); model.attach()         # shared with the HTTP app
    server, host, port = await start_grpc_server(model, "127.0.0.1", 8001)  # port 0: a free one
    ...
    await stop_grpc_server(server)          # no new calls; in-flight ones answered (up to grace seconds)

    with GrpcServerThread(model) as server:                                 # its own loop in a thread (tests)
        tritonclient.grpc.InferenceServerClient(server.url)

The protocol comes from the generated stubs tritonclient ships (service_pb2, model_config_pb2), the one kept in
step with Triton's .proto, rather than a vendored copy. Everything protocol-neutral (names, metadata, config,
decoding inputs, outputs, statistics, the batcher) is kserve.KServeModel's: this module only moves messages and
maps a ProtocolError's HTTP status to a gRPC code (400 INVALID_ARGUMENT, 404 NOT_FOUND, 503 UNAVAILABLE, 500
INTERNAL). Inputs come in raw_input_contents (what tritonclient sends) or in the typed `contents` (uint_contents
for UINT8, fp32_contents for FP32, bytes_contents for BYTES; FP16 only raw, as in Triton). Outputs always go in
raw_output_contents. ModelStreamInfer, the repository, shared-memory, trace and log RPCs answer UNIMPLEMENTED.
Only this module imports grpc: the package and the Batcher work without the extra.
"""

from __future__ import annotations

import asyncio
import logging
import re

try:
    import grpc
    from grpc import aio
    from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
except ImportError as e:  # the gRPC server is part of the optional serve extra
    raise ImportError(f"resnet_native.serve: the gRPC server needs grpcio and tritonclient[grpc] ({e.name} is not "
                      f'installed): pip install "resnet_native[serve]"') from e

from .kserve import KServeModel, ProtocolError, server_metadata, to_raw
from .loop_thread import LoopThread

# The largest request or answer message, as the HTTP server's default body limit (the CLI passes its
# --max-upload-bytes): a batch of 256 FP32 images (3 MiB) fits with room to spare, where grpc's own default
# (4 MiB) would refuse PNG batches an HTTP client may send.
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
DEFAULT_GRACE_S = 30.0  # as the HTTP server's shutdown_timeout

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE}
# The typed `contents` field each input datatype may use (Triton has none for FP16: raw only).
_CONTENTS = {"UINT8": "uint_contents", "FP32": "fp32_contents", "BYTES": "bytes_contents"}
_ALL_CONTENTS = tuple(f.name for f in service_pb2.InferTensorContents.DESCRIPTOR.fields)
_log = logging.getLogger(__name__)


def _data_field(name: str) -> re.Pattern:
    """kserve's name for an input's values, `inputs[name].data` (JSON's field; not `.datatype`)."""
    return re.compile(rf"inputs\[{re.escape(name)}\]\.data(?![a-z])")


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService for one KServeModel. The model's infer() awaits the batcher's futures, so
    the event loop never runs the engine; decoding with resize (megapixel PNGs) goes to a thread."""

    def __init__(self, model: KServeModel):
        self.model = model
        self.stopping = False  # set by stop_grpc_server: ServerReady then says no while in-flight calls finish

    async def _fail(self, context, e: Exception):
        if isinstance(e, ProtocolError):
            await context.abort(_CODES.get(e.status, grpc.StatusCode.UNKNOWN), e.message)
        _log.exception("resnet_native.serve: a gRPC call failed")  # a bug: answer INTERNAL and keep serving
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}")

    # -- health and metadata ---------------------------------------------------------------------------------
    # kserve's dicts are the protocol's JSON forms; the messages' constructors take them as they are (nested dicts,
    # enum names), so nothing here repeats a field list.
    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=self.model.ready and not self.stopping)

    async def ModelReady(self, request, context):
        # An unknown model or version is "not ready" (tritonclient's is_model_ready returns a bool), not an error.
        try:
            self.model.check(request.name, request.version)
        except ProtocolError:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=self.model.ready and not self.stopping)

    async def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(**server_metadata())

    async def ModelMetadata(self, request, context):
        try:
            self.model.check(request.name, request.version)
            return service_pb2.ModelMetadataResponse(**self.model.metadata())
        except Exception as e:
            await self._fail(context, e)

    async def ModelConfig(self, request, context):
        try:
            self.model.check(request.name, request.version)
            config = model_config_pb2.ModelConfig(**self.model.config())
            return service_pb2.ModelConfigResponse(config=config)
        except Exception as e:
            await self._fail(context, e)

    async def ModelStatistics(self, request, context):
        # An empty name asks for every model (Triton's rule): here the one.
        try:
            if request.name or request.version:
                self.model.check(request.name, request.version)
            stats = service_pb2.ModelStatistics(**self.model.stats.snapshot())
            return service_pb2.ModelStatisticsResponse(model_stats=[stats])
        except Exception as e:
            await self._fail(context, e)

    # -- inference -------------------------------------------------------------------------------------------
    async def ModelInfer(self, request, context):
        try:
            self.model.check(request.model_name, request.model_version)
            outputs = self._requested_outputs(request)
            images = await self._images(request)
            logits = await self.model.infer(images)
            answer = service_pb2.ModelInferResponse(model_name=self.model.name, model_version=self.model.version,
                                                    id=request.id)
            for name, datatype, shape, array in self.model.outputs(logits, outputs):
                answer.outputs.add(name=name, datatype=datatype, shape=shape)
                answer.raw_output_contents.append(to_raw(array, datatype))
            return answer
        except Exception as e:
            await self._fail(context, e)

    def _requested_outputs(self, request) -> list:
        names = []
        for out in request.outputs:
            if "classification" in out.parameters:  # Triton's top-k class strings: not offered
                raise ProtocolError(400, f"outputs[{out.name}].parameters.classification: not supported; ask for "
                                         "the `class` output (INT64 [N]) instead")
            names.append(out.name)
        return self.model.check_outputs(names)

    async def _images(self, request):
        """The request's one input -> uint8 (N, 32, 32, 3), from raw_input_contents or its typed contents."""
        if len(request.inputs) != 1:
            raise ProtocolError(400, f"inputs: expected exactly one input (images, normalized or encoded), got "
                                     f"{len(request.inputs)}")
        tensor = request.inputs[0]
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        used = [f for f in _ALL_CONTENTS if len(getattr(tensor.contents, f))]
        if request.raw_input_contents:
            if len(request.raw_input_contents) != 1:
                raise ProtocolError(400, f"raw_input_contents: {len(request.raw_input_contents)} entries for 1 "
                                         "input (one per input, in order)")
            if used:
                raise ProtocolError(400, f"inputs[{name}].contents: given together with raw_input_contents; "
                                         "expected one of them")
            field, kwargs = f"inputs[{name}] raw_input_contents[0]", {"raw": request.raw_input_contents[0]}
        else:
            expected = _CONTENTS.get(datatype)
            if (datatype == "FP16" and used) or (expected is not None and used != [expected]):
                self._check_header(name, datatype, shape)  # a bad name, datatype or shape is the first thing to fix
                where = f"{expected} or raw_input_contents" if expected else "raw_input_contents (no typed field)"
                raise ProtocolError(400, f"inputs[{name}].contents: {datatype} values go in {where}, got "
                                         f"{', '.join(used) if used else 'no values'}")
            field = f"inputs[{name}].contents" + (f".{expected}" if expected else "")
            kwargs = {"data": list(getattr(tensor.contents, expected)) if expected else []}
        decode = lambda: self.model.decode_input(name, datatype, shape, **kwargs)  # noqa: E731
        try:
            if self.model.resize:  # megapixel images: decode and resize off the loop
                return await asyncio.get_running_loop().run_in_executor(None, decode)
            return decode()
        except ProtocolError as e:  # kserve names JSON's `data`; say which gRPC field held the values
            raise ProtocolError(e.status, _data_field(name).sub(field, e.message)) from None

    def _check_header(self, name: str, datatype: str, shape: list) -> None:
        """The model's checks of an input's name, datatype and shape alone. kserve has no separate call for them:
        it checks them before the values, so given no values, a complaint about its data means they passed."""
        try:
            self.model.decode_input(name, datatype, shape, data=[])
        except ProtocolError as e:
            if not _data_field(name).match(e.message):
                raise


async def _unimplemented(self, request, context):
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not implemented by this server (resnet_native serves one "
                                                       "model from memory: no streaming, repository, shared memory, "
                                                       "trace or log settings)")


for _name in ("ModelStreamInfer", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
              "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
              "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting",
              "LogSettings"):
    setattr(InferenceServicer, _name, _unimplemented)


# -- the server ----------------------------------------------------------------------------------------------


async def start_grpc_server(model: KServeModel, host: str = "127.0.0.1", port: int = 0, *,
                            max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, reuse_port: bool = False):
    """Serve `model` on host:port (on this event loop); returns (server, host, port) with the port bound. The
    model (and its batcher) stay the caller's: stop the server with stop_grpc_server before closing the batcher.
    max_message_bytes bounds every message in either direction. reuse_port: SO_REUSEPORT, for the --workers
    fronts that share the port (off otherwise: grpc's default would share a port silently with another server).
    An address that cannot be bound: OSError."""
    options = [("grpc.max_receive_message_length", int(max_message_bytes)),
               ("grpc.max_send_message_length", int(max_message_bytes)),
               ("grpc.so_reuseport", int(bool(reuse_port)))]
    server = aio.server(options=options)
    servicer = InferenceServicer(model)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    address = f"{_grpc_host(host)}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:  # grpc raises RuntimeError("Failed to bind ...")
        raise OSError(f"cannot listen on {address} for gRPC: {e}") from None
    if not bound:
        raise OSError(f"cannot listen on {address} for gRPC")
    await server.start()
    server._resnet_native_servicer = servicer  # read by stop_grpc_server
    return server, host, int(bound)


async def stop_grpc_server(server, grace: float = DEFAULT_GRACE_S) -> None:
    """Graceful stop: refuse new calls, let in-flight ones finish (up to `grace` seconds), then close."""
    servicer = getattr(server, "_resnet_native_servicer", None)
    if servicer is not None:
        servicer.stopping = True
    await server.stop(grace)


class GrpcServerThread(LoopThread):
    """A gRPC server on a daemon thread with its own event loop, until stop() (graceful): for tests, and beside
    the --workers HTTP processes, whose engine process has no event loop of its own."""

    def __init__(self, model: KServeModel, host: str = "127.0.0.1", port: int = 0, *,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, start_timeout: float = 30.0):
        self._start(start_grpc_server(model, host, port, max_message_bytes=max_message_bytes),
                    "resnet_native-serve-grpc", start_timeout)

    @property
    def url(self) -> str:
        return f"{_grpc_host(self.host)}:{self.port}"

    def stop(self, grace: float = DEFAULT_GRACE_S, timeout: float | None = 60.0) -> None:
        """Stop gracefully, stop the loop and join the thread. Idempotent."""
        self._stop(lambda server: stop_grpc_server(server, grace), timeout)
