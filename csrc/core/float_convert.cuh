// Device-side element types: how each storage dtype converts to and from the fp32 the kernels compute in, the
// 16-byte packs used for vectorised loads/stores, and the host-side switch from rn::DType to a C++ type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "dtype.h"
#include "error.h"

namespace rn {

template <typename T>
struct FloatConvert;

template <>
struct FloatConvert<float> {
  __device__ __forceinline__ static float to_float(float v) { return v; }
  __device__ __forceinline__ static float from_float(float v) { return v; }
};

template <>
struct FloatConvert<__half> {
  __device__ __forceinline__ static float to_float(__half v) { return __half2float(v); }
  // Round to nearest even, overflow to +-inf: the IEEE conversion (what numpy's astype does).
  __device__ __forceinline__ static __half from_float(float v) { return __float2half_rn(v); }
};

template <>
struct FloatConvert<__nv_bfloat16> {
  __device__ __forceinline__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return FloatConvert<T>::to_float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return FloatConvert<T>::from_float(v);
}

// N elements moved by one aligned load/store instruction (16 bytes for the widest packs).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// True when `ptr` may be accessed as Pack<T, N>.
template <typename T, int N>
inline bool pack_aligned(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % (sizeof(T) * N) == 0;
}

// ReLU that lets NaN through (as PyTorch does), so a non-finite activation still reaches check_finite.
__device__ __forceinline__ float relu_f(float v) {
  return v < 0.0f ? 0.0f : v;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the C++ type stored for `dtype`, one of the storage dtypes (the bindings never
// pass an int32 or uint8 array to a float kernel: found_inf is typed int32_t*, images const uint8_t*).
template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32:
      f(TypeTag<float>{});
      return;
    case DType::F16:
      f(TypeTag<__half>{});
      return;
    case DType::BF16:
      f(TypeTag<__nv_bfloat16>{});
      return;
    case DType::I32:
    case DType::U8:
    case DType::F64:
      throw TypeError(std::string(dtype_name(dtype)) + " arrays have no float kernel");
  }
}

}  // namespace rn
