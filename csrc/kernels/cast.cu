#include "cast.h"

#include "../core/error.h"
#include "../core/float_convert.cuh"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

template <typename Tin, typename Tout>
constexpr int cast_pack() {
  return 16 / (sizeof(Tin) > sizeof(Tout) ? sizeof(Tin) : sizeof(Tout));
}

// `in` converted, or with kAccumulate added to `prior` (the sum in fp32). Without it nothing is added, so that
// -0.0 stays -0.0.
template <bool kAccumulate, typename Tin, typename Tout>
__device__ __forceinline__ Tout converted(Tin in, Tout prior) {
  if constexpr (kAccumulate) {
    return from_float<Tout>(to_float(prior) + to_float(in));
  } else {
    return from_float<Tout>(to_float(in));
  }
}

// Packs as wide as the wider type allows (16-byte loads or stores), scalar tail / misaligned fallback.
// kAccumulate: out = out + in, both through fp32 and rounded once.
template <typename Tin, typename Tout, bool kAccumulate>
__global__ void cast_kernel(const Tin* in, Tout* out, int64_t n, bool vectorized) {
  constexpr int kVec = cast_pack<Tin, Tout>();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t scalar_begin = 0;
  if (vectorized) {
    const int64_t packs = n / kVec;
    for (int64_t p = first; p < packs; p += stride) {
      const Pack<Tin, kVec> a = reinterpret_cast<const Pack<Tin, kVec>*>(in)[p];
      Pack<Tout, kVec> b{};
      if constexpr (kAccumulate) b = reinterpret_cast<const Pack<Tout, kVec>*>(out)[p];
#pragma unroll
      for (int j = 0; j < kVec; ++j) b.v[j] = converted<kAccumulate>(a.v[j], b.v[j]);
      reinterpret_cast<Pack<Tout, kVec>*>(out)[p] = b;
    }
    scalar_begin = packs * kVec;
  }
  for (int64_t i = scalar_begin + first; i < n; i += stride)
    out[i] = converted<kAccumulate>(in[i], kAccumulate ? out[i] : Tout{});
}

}  // namespace

void cast(const TensorView& in, const TensorView& out, bool accumulate, cudaStream_t stream) {
  dispatch_dtype(in.dtype, [&](auto in_tag) {
    dispatch_dtype(out.dtype, [&](auto out_tag) {
      using Tin = typename decltype(in_tag)::type;
      using Tout = typename decltype(out_tag)::type;
      constexpr int kVec = cast_pack<Tin, Tout>();
      const bool vectorized = pack_aligned<Tin, kVec>(in.data) && pack_aligned<Tout, kVec>(out.data);
      const int64_t n = out.numel();
      const int64_t work = vectorized ? (n + kVec - 1) / kVec : n;
      const auto* src = static_cast<const Tin*>(in.data);
      auto* dst = static_cast<Tout*>(out.data);
      if (accumulate) {
        cast_kernel<Tin, Tout, true><<<grid_size(work), kThreadsPerBlock, 0, stream>>>(src, dst, n, vectorized);
      } else {
        cast_kernel<Tin, Tout, false><<<grid_size(work), kThreadsPerBlock, 0, stream>>>(src, dst, n, vectorized);
      }
      RN_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace rn::kernels
