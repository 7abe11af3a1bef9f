#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <memory>
#include <string>

#include "../core/captured_graph.h"
#include "../core/cuda_event.h"
#include "../core/descriptor.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/host_gate.h"
#include "../core/live_counts.h"
#include "../core/workspace.h"
#include "bindings.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace rn {
namespace {

// The median device time of fn(), which queues work on `stream`: `warmup` untimed calls, then `runs` calls back to
// back behind a host gate (cuda_event.h), so neither the host's time nor its gaps count.
float device_time_ms(const py::function& fn, uintptr_t stream_ptr, int runs, int warmup) {
  if (runs < 1 || warmup < 0) {
    throw ValueError("runs: expected runs >= 1 and warmup >= 0, got runs=" + std::to_string(runs) +
                     ", warmup=" + std::to_string(warmup));
  }
  const cudaStream_t stream = stream_arg(stream_ptr);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  RN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) throw ValueError("stream: cannot time work during a capture");
  for (int i = 0; i < warmup; ++i) fn();
  TimedRuns timed(stream, static_cast<size_t>(runs));
  for (int i = 0; i < runs; ++i) {
    fn();
    timed.end_run();
  }
  return median_ms(timed.times_ms());
}

// A HostGate for Python: `with _C.HostGate(stream): queue work` (the gate opens on leaving, or on release()).
class PyHostGate {
 public:
  explicit PyHostGate(uintptr_t stream) : gate_(std::make_unique<HostGate>(stream_arg(stream))) {}
  void release() { gate_.reset(); }

 private:
  std::unique_ptr<HostGate> gate_;
};

void bind_timing(py::module_& m) {
  m.def("device_time_ms", &device_time_ms, py::arg("fn"), py::arg("stream"), py::arg("runs") = 5, py::arg("warmup") = 1,
        "Median device milliseconds of one fn() call: fn queues its work on `stream` (an int, cupy's Stream.ptr) "
        "and must not synchronise; `warmup` untimed calls first, then `runs` calls held behind a host gate until "
        "all are queued, one CUDA event between consecutive calls. Synchronises once; refused during a capture.");
  py::class_<PyHostGate>(m, "HostGate",
                         "Holds `stream` (an int) until released, so work queued behind it runs back to back; opens "
                         "on its own after HostGate.MAX_HOLD_NS. A context manager: released on leaving.")
      .def(py::init<uintptr_t>(), py::arg("stream"))
      .def("release", &PyHostGate::release, "Let the stream run (idempotent).")
      .def("__enter__", [](PyHostGate& g) -> PyHostGate& { return g; })
      .def("__exit__", [](PyHostGate& g, const py::args&) { g.release(); })
      .def_property_readonly_static("MAX_HOLD_NS", [](py::handle) { return HostGate::kMaxHoldNs; });
}

py::dict stats_dict(const WorkspaceStats& s) {
  py::dict d;
  d["size"] = s.size;
  d["peak_request"] = s.peak_request;
  d["peak_use"] = s.peak_use;
  d["peak_size"] = s.peak_size;
  d["limit"] = s.limit == SIZE_MAX ? py::object(py::none()) : py::object(py::int_(s.limit));
  d["grows"] = s.grows;
  d["requests"] = s.requests;
  d["graph_holds"] = s.graph_holds;
  d["retired"] = s.retired;
  d["stream_waits"] = s.stream_waits;
  return d;
}

// What the build settled (resnet_native_build/build_ext.py defines these; a build by other means says unknown).
#ifndef RN_BUILD_CUDA_MAJOR
#define RN_BUILD_CUDA_MAJOR 0
#endif
#ifndef RN_BUILD_CUDA_COMPILER
#define RN_BUILD_CUDA_COMPILER "unknown"
#endif
#ifndef RN_BUILD_CUDA_ARCHS
#define RN_BUILD_CUDA_ARCHS ""
#endif
#ifndef RN_BUILD_CUDA_SOURCE
#define RN_BUILD_CUDA_SOURCE "unknown"
#endif
#ifndef RN_BUILD_CUDNN_SOURCE
#define RN_BUILD_CUDNN_SOURCE "unknown"
#endif
#ifndef RN_BUILD_DEBUG_INFO
#define RN_BUILD_DEBUG_INFO 0
#endif

py::dict build_info() {
  py::dict d;
  d["cuda_flavour"] = RN_BUILD_CUDA_MAJOR;
  d["cuda_compiler"] = RN_BUILD_CUDA_COMPILER;
  d["cuda_source"] = RN_BUILD_CUDA_SOURCE;
  d["cudart_version"] = CUDART_VERSION;  // linked statically: the headers' version is the one that runs
  d["cuda_archs"] = RN_BUILD_CUDA_ARCHS;
  d["cudnn_headers_version"] = CUDNN_VERSION;
  d["cudnn_source"] = RN_BUILD_CUDNN_SOURCE;
  d["host_compiler"] = __VERSION__;
  d["debug_info"] = RN_BUILD_DEBUG_INFO != 0;
  int driver = 0;  // stays 0 where no driver is installed
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  d["driver_cuda_version"] = driver;
  d["own_conv_kernels"] = own_conv_build_status();
  return d;
}

py::object g_cudnn_error, g_cuda_error, g_no_gpu_error;

void raise_with_status(const py::object& type, const std::string& message, const std::string& status, int code) {
  py::object exc = type(message);
  exc.attr("status") = status;
  exc.attr("code") = code;
  PyErr_SetObject(type.ptr(), exc.ptr());
}

}  // namespace

void bind_core(py::module_& m) {
  bind_timing(m);
  g_cudnn_error =
      py::reinterpret_borrow<py::object>(py::exception<CudnnError>(m, "CudnnError", PyExc_RuntimeError).ptr());
  g_cuda_error = py::reinterpret_borrow<py::object>(py::exception<CudaError>(m, "CudaError", PyExc_RuntimeError).ptr());
  g_no_gpu_error =
      py::reinterpret_borrow<py::object>(py::exception<NoDeviceError>(m, "NoGPUError", PyExc_RuntimeError).ptr());
  m.attr("CudnnError").attr("__doc__") =
      "A cuDNN call failed. str() names the status, the call, file:line, the op's shapes and cuDNN's own "
      "message; "
      ".status is the status name and .code its number.";
  m.attr("CudaError").attr("__doc__") = "A CUDA runtime call failed (.status, .code).";
  m.attr("NoGPUError").attr("__doc__") = "A GPU operation was called on a machine without a usable CUDA device.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CudnnError& e) {
      raise_with_status(g_cudnn_error, e.what(), cudnn_status_name(e.status), static_cast<int>(e.status));
    } catch (const CudaError& e) {
      raise_with_status(g_cuda_error, e.what(), cudaGetErrorName(e.code), static_cast<int>(e.code));
    } catch (const NoDeviceError& e) {
      PyErr_SetString(g_no_gpu_error.ptr(), e.what());
    } catch (const TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.attr("CUDNN_VERSION_COMPILED") = CUDNN_VERSION;
  m.attr("CUDNN_MAJOR_COMPILED") = CUDNN_MAJOR;
  m.attr("CUDART_VERSION_COMPILED") = CUDART_VERSION;
  m.def("cudnn_version", [] { return cudnnGetVersion(); }, "Version of the cuDNN library loaded (e.g. 91900).");
  m.def("build_info", &build_info,
        "How this extension was built: CUDA flavour, device compiler, CUDA runtime and cuDNN header versions, "
        "architectures; and the CUDA version the installed driver supports (0: none).");
  m.def("device_count", &device_count, "Number of usable CUDA devices (0 without a GPU).");
  m.def("device_unavailable_reason", &device_unavailable_reason);
  m.def("live_descriptors", &live_descriptor_counts,
        "{kind: live count} of every cuDNN object kind created so far, from the C++ counters.");
  m.def("_release_handles", &release_handles,
        "Destroy the per-device cuDNN handles. Use resnet_native.release_handles(), which drops cached plans first.");

  m.def(
      "_clear_cuda_error",
      [] {
        const cudaError_t err = cudaGetLastError();
        return err == cudaSuccess ? py::object(py::none()) : py::object(py::str(cudaGetErrorName(err)));
      },
      "Clear the CUDA runtime's last (non-sticky) error, e.g. after an abandoned stream capture; returns its name.");
  // Streams as cupy gives them (an object with .ptr) or as raw pointers, as cupy's own Graph takes them.
  const auto stream_of = [](py::handle s) {
    return stream_arg(py::hasattr(s, "ptr") ? s.attr("ptr").cast<uintptr_t>() : s.cast<uintptr_t>());
  };
  py::class_<CapturedGraph>(m, "CapturedGraph", "An ended stream capture, instantiated (resnet_native._core.capture).")
      .def(
          "upload", [stream_of](CapturedGraph& g, py::handle stream) { g.upload(stream_of(stream)); },
          py::arg("stream"))
      .def(
          "launch", [stream_of](CapturedGraph& g, py::handle stream) { g.launch(stream_of(stream)); },
          py::arg("stream"))
      .def_property_readonly("memset_kernels", &CapturedGraph::memset_kernels,
                             "Memset nodes replaced by kernel nodes before instantiation.");
  m.def(
      "_end_capture",
      [](uintptr_t stream, bool memsets_as_kernels) {
        return std::make_unique<CapturedGraph>(stream_arg(stream), memsets_as_kernels);
      },
      py::arg("stream"), py::arg("memsets_as_kernels"),
      "End the capture in progress on `stream` and instantiate it (memset nodes first made kernel nodes).");
  m.def(
      "set_workspace_limit",
      [](py::object bytes) { set_workspace_limit(bytes.is_none() ? SIZE_MAX : bytes.cast<size_t>()); },
      py::arg("bytes"), "Cap every workspace request (and algorithm search) at `bytes`; None removes the cap.");
  m.def("workspace_limit", [] {
    const size_t limit = workspace_limit();
    return limit == SIZE_MAX ? py::object(py::none()) : py::object(py::int_(limit));
  });
  m.def(
      "workspace_stats", [] { return stats_dict(WorkspacePool::current().stats()); },
      "The current device's workspace pool: size, peak_request, peak_use, peak_size, limit, grows, requests, "
      "graph_holds, retired, stream_waits.");
  m.def(
      "_workspace_order",
      [](uintptr_t stream, bool before) {
        WorkspacePool& pool = WorkspacePool::current();
        const OrderedStream s(stream_arg(stream));
        if (before) {
          pool.wait_for_last_user(s);
        } else {
          pool.mark_used(s);
        }
      },
      py::arg("stream"), py::arg("before"),
      "Around a captured graph's replay on `stream`: before=True orders it after the workspace's last user on "
      "another stream, before=False marks its end for the next user.");
  m.def(
      "_workspace_graph_hold",
      [](bool hold) {
        WorkspacePool& pool = WorkspacePool::current();
        if (hold) {
          pool.add_graph_hold();
        } else {
          pool.drop_graph_hold();
        }
        return pool.graph_holds();
      },
      py::arg("hold"), "A captured CUDA graph takes (True) or drops (False) its hold on the workspace buffer.");
  m.def(
      "reserve_workspace",
      [](size_t bytes, uintptr_t stream) { WorkspacePool::current().reserve(bytes, stream_arg(stream)); },
      py::arg("bytes"), py::arg("stream") = 0, "Grow the current device's pool to `bytes` now (before capture).");
  m.def(
      "trim_workspace", [](uintptr_t stream) { return WorkspacePool::current().trim(stream_arg(stream)); },
      py::arg("stream") = 0,
      "Shrink the current device's pool to what ops and chosen algorithms used (searches excluded); returns the "
      "bytes freed (0 while captured graphs hold the pool).");
  m.def(
      "release_workspace", [] { WorkspacePool::current().release(); },
      "Free the current device's workspace buffer (it regrows on demand); refused while captured graphs hold it.");
  m.def(
      "_set_out_of_memory_hook",
      [](py::object hook) {
        if (hook.is_none()) {
          set_out_of_memory_hook(nullptr);
          return;
        }
        auto* held = new py::object(hook);  // Leaked on purpose: must outlive interpreter teardown order.
        set_out_of_memory_hook([held] {
          py::gil_scoped_acquire gil;
          (*held)();
        });
      },
      py::arg("hook"));
}

}  // namespace rn
