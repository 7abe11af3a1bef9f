#include "op_args.h"

#include <cuda_runtime_api.h>

#include <string>

#include "../bindings/tensor_arg.h"
#include "../core/device.h"
#include "../core/error.h"

namespace rn {

const TensorView& OpArgs::array(pybind11::handle obj, const char* name, DType dtype, int ndim) {
  views_.emplace_back(tensor_arg(obj, name, dtype, {ndim, /*check_device=*/false}), name);
  return views_.back().first;
}

const TensorView& OpArgs::optional(pybind11::handle obj, const char* name, DType dtype, int ndim) {
  views_.emplace_back(optional_tensor_arg(obj, name, dtype, {ndim, /*check_device=*/false}), name);
  return views_.back().first;
}

void OpArgs::check_on_device() const {
  const int device = current_device();
  for (const auto& [view, name] : views_) {
    if (!view.defined()) continue;
    cudaPointerAttributes attributes{};
    const cudaError_t err = cudaPointerGetAttributes(&attributes, view.data);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw TypeError(std::string(name) + ": pointer is not CUDA memory (" + cudaGetErrorName(err) + ")");
    }
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      throw TypeError(std::string(name) + ": expected device memory, got host memory");
    }
    if (attributes.device != device) {
      throw ValueError(std::string(name) + ": array is on CUDA device " + std::to_string(attributes.device) +
                       " but the current device is " + std::to_string(device));
    }
  }
}

std::string OpArgs::describe(const void* self) {
  const auto* args = static_cast<const OpArgs*>(self);
  std::string text = std::string(args->op_) + "(";
  bool first = true;
  for (const auto& [view, name] : args->views_) {
    if (!view.defined()) continue;
    text += (first ? "" : ", ") + std::string(name) + "=" + view.describe();
    first = false;
  }
  if (!args->note_.empty()) text += (first ? "" : ", ") + args->note_;
  return text + ")";
}

bool overlaps(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined()) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void check_in_place_or_disjoint(const TensorView& out, const char* out_name, const TensorView& in,
                                const char* in_name) {
  const bool same = out.data == in.data && out.nbytes() == in.nbytes() && out.dtype == in.dtype;
  if (overlaps(out, in) && !same) {
    throw ValueError(std::string(out_name) + " partially overlaps " + in_name +
                     ": it must be the same array (in place) or not share memory with it");
  }
}

void check_disjoint(const TensorView& out, const char* out_name, const TensorView& in, const char* in_name) {
  if (overlaps(out, in)) {
    throw ValueError(std::string(out_name) + " must not share memory with " + in_name);
  }
}

}  // namespace rn
