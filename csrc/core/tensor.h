// A non-owning view of a device array that crossed the Python boundary (see bindings/tensor_arg.h).
// Views are always C-contiguous in their own shape: an NHWC activation is an array of shape (N, H, W, C).
// tensor_arg() only builds views whose element count and byte size fit in int64 and whose address range does
// not wrap, so numel() and nbytes() cannot overflow. nchw_dims() narrows to int: it is for views parsed with
// TensorArgOptions::int32_dims (every dimension checked to fit), as cuDNN's 4-D descriptors take int.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "dtype.h"

namespace rn {

struct TensorView {
  static constexpr int kMaxDims = 8;

  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  int device = -1;
  bool read_only = false;  // the producer said so (__cuda_array_interface__ data[1], DLPack's READ_ONLY flag)

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool defined() const { return ndim > 0; }

  std::string shape_str() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (ndim == 1 ? ",)" : ")");
  }
  // "float16(8, 32, 32, 64)"
  std::string describe() const { return defined() ? dtype_name(dtype) + shape_str() : "None"; }
};

// Logical (N, C, H, W) of a 4-D activation stored in the given layout.
inline std::array<int, 4> nchw_dims(const TensorView& t, Layout layout) {
  const auto& s = t.shape;
  if (layout == Layout::NCHW) return {int(s[0]), int(s[1]), int(s[2]), int(s[3])};
  return {int(s[0]), int(s[3]), int(s[1]), int(s[2])};
}

}  // namespace rn
