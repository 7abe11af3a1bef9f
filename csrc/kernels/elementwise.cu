#include "elementwise.h"

#include "../core/error.h"
#include "../core/float_convert.cuh"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AddScaledOp {
  float alpha;
  __device__ float operator()(float a, float b) const { return fmaf(alpha, b, a); }
};
struct ScaleOp {
  float alpha;
  __device__ float operator()(float x) const { return alpha * x; }
};
struct AddReluOp {
  __device__ float operator()(float a, float b) const { return relu_f(a + b); }
};
struct ReluOp {
  __device__ float operator()(float x) const { return relu_f(x); }
};
struct ReluMaskOp {
  __device__ float operator()(float dy, float y) const { return y <= 0.0f ? 0.0f : dy; }
};

template <typename T, int kInputs>
struct ElementwiseArgs {
  const T* in[kInputs];
  T* out;
};

template <int kInputs, typename Op>
__device__ __forceinline__ float apply(const Op& op, const float (&v)[kInputs]) {
  if constexpr (kInputs == 1) {
    return op(v[0]);
  } else {
    return op(v[0], v[1]);
  }
}

// Packs of 16 bytes while `vectorized` (all pointers aligned), then the remaining n % kVec elements one by
// one; with `vectorized` false every element goes the scalar way.
template <typename T, int kInputs, typename Op>
__global__ void elementwise_kernel(ElementwiseArgs<T, kInputs> args, int64_t n, bool vectorized, Op op) {
  constexpr int kVec = 16 / sizeof(T);
  using P = Pack<T, kVec>;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t scalar_begin = 0;
  if (vectorized) {
    const int64_t packs = n / kVec;
    for (int64_t p = first; p < packs; p += stride) {
      P in[kInputs];
#pragma unroll
      for (int k = 0; k < kInputs; ++k) in[k] = reinterpret_cast<const P*>(args.in[k])[p];
      P out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float v[kInputs];
#pragma unroll
        for (int k = 0; k < kInputs; ++k) v[k] = to_float(in[k].v[j]);
        out.v[j] = from_float<T>(apply<kInputs>(op, v));
      }
      reinterpret_cast<P*>(args.out)[p] = out;
    }
    scalar_begin = packs * kVec;
  }
  for (int64_t i = scalar_begin + first; i < n; i += stride) {
    float v[kInputs];
#pragma unroll
    for (int k = 0; k < kInputs; ++k) v[k] = to_float(args.in[k][i]);
    args.out[i] = from_float<T>(apply<kInputs>(op, v));
  }
}

template <int kInputs, typename Op>
void launch(const TensorView* const (&inputs)[kInputs], const TensorView& out, Op op, cudaStream_t stream) {
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = 16 / sizeof(T);
    ElementwiseArgs<T, kInputs> args;
    bool vectorized = pack_aligned<T, kVec>(out.data);
    for (int k = 0; k < kInputs; ++k) {
      args.in[k] = static_cast<const T*>(inputs[k]->data);
      vectorized = vectorized && pack_aligned<T, kVec>(inputs[k]->data);
    }
    args.out = static_cast<T*>(out.data);
    const int64_t n = out.numel();
    const int64_t work = vectorized ? (n + kVec - 1) / kVec : n;
    elementwise_kernel<T, kInputs, Op><<<grid_size(work), kThreadsPerBlock, 0, stream>>>(args, n, vectorized, op);
    RN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void add(const TensorView& a, const TensorView& b, const TensorView& out, bool relu, cudaStream_t stream) {
  const TensorView* inputs[2] = {&a, &b};
  if (relu) {
    launch<2>(inputs, out, AddReluOp{}, stream);
  } else {
    launch<2>(inputs, out, AddOp{}, stream);
  }
}

void add_scaled(const TensorView& a, const TensorView& b, float alpha, const TensorView& out, cudaStream_t stream) {
  const TensorView* inputs[2] = {&a, &b};
  launch<2>(inputs, out, AddScaledOp{alpha}, stream);
}

void scale(const TensorView& x, float alpha, const TensorView& out, cudaStream_t stream) {
  const TensorView* inputs[1] = {&x};
  launch<1>(inputs, out, ScaleOp{alpha}, stream);
}

void relu(const TensorView& x, const TensorView& out, cudaStream_t stream) {
  const TensorView* inputs[1] = {&x};
  launch<1>(inputs, out, ReluOp{}, stream);
}

void relu_backward(const TensorView& dy, const TensorView& y, const TensorView& out, cudaStream_t stream) {
  const TensorView* inputs[2] = {&dy, &y};
  launch<2>(inputs, out, ReluMaskOp{}, stream);
}

}  // namespace rn::kernels
