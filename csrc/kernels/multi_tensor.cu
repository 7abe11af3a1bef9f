#include "multi_tensor.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "../core/error.h"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

// dtype codes are rn::DType: 0 fp32, 1 fp16, 2 bf16.
__device__ __forceinline__ float load_element(uint64_t ptr, int32_t dtype, int64_t i) {
  switch (dtype) {
    case 1:
      return __half2float(reinterpret_cast<const __half*>(ptr)[i]);
    case 2:
      return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(ptr)[i]);
    default:
      return reinterpret_cast<const float*>(ptr)[i];
  }
}

__device__ __forceinline__ void store_element(uint64_t ptr, int32_t dtype, int64_t i, float v) {
  switch (dtype) {
    case 1:
      reinterpret_cast<__half*>(ptr)[i] = __float2half_rn(v);
      break;
    case 2:
      reinterpret_cast<__nv_bfloat16*>(ptr)[i] = __float2bfloat16_rn(v);
      break;
    default:
      reinterpret_cast<float*>(ptr)[i] = v;
      break;
  }
}

// Four consecutive elements as floats, read or written in one access (16 bytes of fp32, 8 of fp16 or bf16) where
// aligned4 allows it (the stores in PTX, which the compiler keeps whole). The conversions are the scalar
// ones, element by element, so both paths give the same bits.
struct Four {
  float v[4];
};

__device__ __forceinline__ bool aligned4(uint64_t ptr, int32_t dtype, int64_t i) {
  const uint64_t bytes = dtype == 0 ? 4 : 2;
  return ptr == 0 || (ptr + static_cast<uint64_t>(i) * bytes) % (4 * bytes) == 0;  // 0: an absent entry
}

// One 16- or 8-byte store, the instruction nvcc's __stwb emits (clang's CUDA headers lack its vector overloads).
__device__ __forceinline__ void store_whole(float* ptr, float4 v) {
  asm("st.global.wb.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ void store_whole(uint2* ptr, uint2 v) {
  asm("st.global.wb.v2.u32 [%0], {%1, %2};" ::"l"(ptr), "r"(v.x), "r"(v.y) : "memory");
}

__device__ __forceinline__ float2 to_float2(__half2 v) {
  return __half22float2(v);
}
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) {
  return __bfloat1622float2(v);
}
template <typename Pair>
__device__ __forceinline__ Pair from_float2(float a, float b);
template <>
__device__ __forceinline__ __half2 from_float2<__half2>(float a, float b) {
  return __floats2half2_rn(a, b);
}
template <>
__device__ __forceinline__ __nv_bfloat162 from_float2<__nv_bfloat162>(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}

// Four 16-bit elements (Pair: __half2 or __nv_bfloat162) in one 8-byte access.
template <typename Pair>
__device__ __forceinline__ Four load4_16bit(uint64_t ptr, int64_t i) {
  const uint2 raw = *reinterpret_cast<const uint2*>(ptr + static_cast<uint64_t>(i) * 2);
  const float2 a = to_float2(*reinterpret_cast<const Pair*>(&raw.x));
  const float2 b = to_float2(*reinterpret_cast<const Pair*>(&raw.y));
  return {{a.x, a.y, b.x, b.y}};
}

template <typename Pair>
__device__ __forceinline__ void store4_16bit(uint64_t ptr, int64_t i, const Four& f) {
  const Pair a = from_float2<Pair>(f.v[0], f.v[1]), b = from_float2<Pair>(f.v[2], f.v[3]);
  uint2 raw;
  raw.x = *reinterpret_cast<const uint32_t*>(&a);
  raw.y = *reinterpret_cast<const uint32_t*>(&b);
  store_whole(reinterpret_cast<uint2*>(ptr + static_cast<uint64_t>(i) * 2), raw);
}

__device__ __forceinline__ Four load4(uint64_t ptr, int32_t dtype, int64_t i) {
  switch (dtype) {
    case 1:
      return load4_16bit<__half2>(ptr, i);
    case 2:
      return load4_16bit<__nv_bfloat162>(ptr, i);
    default: {
      const float4 f = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(ptr) + i);
      return {{f.x, f.y, f.z, f.w}};
    }
  }
}

__device__ __forceinline__ void store4(uint64_t ptr, int32_t dtype, int64_t i, const Four& f) {
  switch (dtype) {
    case 1:
      store4_16bit<__half2>(ptr, i, f);
      break;
    case 2:
      store4_16bit<__nv_bfloat162>(ptr, i, f);
      break;
    default:
      store_whole(reinterpret_cast<float*>(ptr) + i, make_float4(f.v[0], f.v[1], f.v[2], f.v[3]));
      break;
  }
}

// A Body with apply4(i) (elements i..i+3) and aligned4(i) (whether its arrays allow that access at element i).
template <typename Body, typename = void>
struct Vectorized : std::false_type {};
template <typename Body>
struct Vectorized<Body, std::void_t<decltype(std::declval<Body&>().apply4(int64_t{}))>> : std::true_type {};

// Every block walks chunks; each thread of a block handles elements of the chunk with stride blockDim.x, kUnroll
// of them per pass, so a body that only reads (the finite check) has that many loads in flight per thread. A
// vectorized body takes an aligned chunk four elements at a time (the chunk's last few one at a time), a chunk of
// a misaligned tensor one at a time.
// A Body (copied per thread) provides begin() once per thread, bind(t) once per chunk, apply(i) per element
// and end() once per thread (all threads of a block reach it, so it may synchronise the block).
constexpr int kUnroll = 4;

template <typename Body>
__global__ void multi_tensor_kernel(DeviceChunks chunks, Body body, const int32_t* skip_if_set) {
  if (skip_if_set != nullptr && *skip_if_set != 0) return;  // uniform over the grid: the update is skipped
  body.begin();
  const int64_t stride = blockDim.x;
  for (int64_t c = blockIdx.x; c < chunks.count; c += gridDim.x) {
    const int32_t t = chunks.tensor[c];
    const int64_t start = chunks.start[c];
    const int64_t end = min(start + chunks.size, chunks.numel[t]);
    body.bind(t);
    int64_t first = start;  // where the element-at-a-time walk begins
    if constexpr (Vectorized<Body>::value) {
      if (body.aligned4(start)) {
        first = start + (end - start) / 4 * 4;
        for (int64_t i = start + 4 * threadIdx.x; i < first; i += 4 * stride * kUnroll) {
#pragma unroll
          for (int k = 0; k < kUnroll; ++k) {
            if (i + 4 * k * stride < first) body.apply4(i + 4 * k * stride);
          }
        }
      }
    }
    for (int64_t i = first + threadIdx.x; i < end; i += stride * kUnroll) {
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (i + k * stride < end) body.apply(i + k * stride);
      }
    }
  }
  body.end();
}

template <typename Body>
void launch(const DeviceChunks& chunks, const Body& body, const int32_t* skip_if_set, cudaStream_t stream) {
  if (chunks.count == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(chunks.count, static_cast<int64_t>(sm_count()) * 16));
  multi_tensor_kernel<Body><<<blocks, kThreadsPerBlock, 0, stream>>>(chunks, body, skip_if_set);
  RN_CUDA_CHECK_LAUNCH();
}

// What both optimizer updates share: fp32 master parameters, gradients in any storage dtype, optional model copies
// rewritten with each updated value, and the learning rate and gradient scale (device or host scalars).
struct UpdateBody {
  DeviceTensorList params, grads, copies;
  bool has_copies;
  ScalarArg lr_arg, inv_scale_arg;
  // Per-thread state.
  float lr, inv_scale;
  float* p;
  uint64_t g;
  int32_t g_dtype;
  uint64_t copy;
  int32_t copy_dtype;

  __device__ void begin_update() {
    lr = read_scalar(lr_arg);
    inv_scale = read_scalar(inv_scale_arg);
  }
  __device__ void bind_update(int32_t t) {
    p = reinterpret_cast<float*>(params.ptrs[t]);
    g = grads.ptrs[t];
    g_dtype = grads.dtypes[t];
    copy = has_copies ? copies.ptrs[t] : 0;
    copy_dtype = has_copies ? copies.dtypes[t] : 0;
  }
  // Element i of the gradient, unscaled.
  __device__ float scaled_grad(int64_t i) const { return load_element(g, g_dtype, i) * inv_scale; }
  // The updated parameter value of element i, written to the master and the model copy.
  __device__ void store(int64_t i, float w) {
    p[i] = w;
    if (copy != 0) store_element(copy, copy_dtype, i, w);
  }
  __device__ bool aligned4_update(int64_t i) const {
    return aligned4(reinterpret_cast<uint64_t>(p), 0, i) && aligned4(g, g_dtype, i) && aligned4(copy, copy_dtype, i);
  }
  __device__ void store4_update(int64_t i, const Four& w) {
    store4(reinterpret_cast<uint64_t>(p), 0, i, w);
    if (copy != 0) store4(copy, copy_dtype, i, w);
  }
  __device__ void end() {}
};

void set_update_args(UpdateBody& body, const TensorTable& params, const TensorTable& grads, const TensorTable* copies,
                     ScalarArg lr, ScalarArg inv_scale) {
  body.params = params.list();
  body.grads = grads.list();
  body.has_copies = copies != nullptr;
  if (copies) body.copies = copies->list();
  body.lr_arg = lr;
  body.inv_scale_arg = inv_scale;
}

struct SgdBody : UpdateBody {
  DeviceTensorList bufs;
  bool has_bufs;
  ScalarArg momentum_arg;
  SgdOptions o;
  // Per-thread state.
  float momentum;
  float* buf;

  __device__ void begin() {
    begin_update();
    momentum = read_scalar(momentum_arg);
  }
  __device__ void bind(int32_t t) {
    bind_update(t);
    buf = has_bufs ? reinterpret_cast<float*>(bufs.ptrs[t]) : nullptr;
  }
  // One element's update from its unscaled gradient d and parameter w; b is its momentum (with buffers).
  __device__ float update(float d, float w, float& b) const {
    if (o.weight_decay != 0.0f) d += o.weight_decay * w;
    if (buf != nullptr) {
      b = o.first_step ? d : momentum * b + (1.0f - o.dampening) * d;
      d = o.nesterov ? d + momentum * b : b;
    }
    return w - lr * d;
  }
  __device__ void apply(int64_t i) {
    float b = buf != nullptr ? buf[i] : 0.0f;
    const float w = update(scaled_grad(i), p[i], b);
    if (buf != nullptr) buf[i] = b;
    store(i, w);
  }
  __device__ bool aligned4(int64_t i) const {
    return aligned4_update(i) && ::rn::kernels::aligned4(reinterpret_cast<uint64_t>(buf), 0, i);
  }
  __device__ void apply4(int64_t i) {
    const Four d = load4(g, g_dtype, i);
    const Four w = load4(reinterpret_cast<uint64_t>(p), 0, i);
    Four b = buf != nullptr ? load4(reinterpret_cast<uint64_t>(buf), 0, i) : Four{};
    Four out;
#pragma unroll
    for (int k = 0; k < 4; ++k) out.v[k] = update(d.v[k] * inv_scale, w.v[k], b.v[k]);
    if (buf != nullptr) store4(reinterpret_cast<uint64_t>(buf), 0, i, b);
    store4_update(i, out);
  }
};

struct AdamWBody : UpdateBody {
  DeviceTensorList exp_avgs, exp_avg_sqs;
  ScalarArg step_arg, beta1_arg;
  AdamWOptions o;
  // Per-thread state.
  float beta1, decay, step_size, bias_correction2_sqrt;
  float *m, *v;

  __device__ void begin() {
    begin_update();
    beta1 = read_scalar(beta1_arg);
    const double step = read_scalar(step_arg);
    // Bias corrections in double, as PyTorch computes them on the host.
    const double bias_correction1 = 1.0 - pow(static_cast<double>(beta1), step);
    const double bias_correction2 = 1.0 - pow(static_cast<double>(o.beta2), step);
    step_size = static_cast<float>(lr / bias_correction1);
    bias_correction2_sqrt = static_cast<float>(sqrt(bias_correction2));
    decay = 1.0f - lr * o.weight_decay;
  }
  __device__ void bind(int32_t t) {
    bind_update(t);
    m = reinterpret_cast<float*>(exp_avgs.ptrs[t]);
    v = reinterpret_cast<float*>(exp_avg_sqs.ptrs[t]);
  }
  __device__ void apply(int64_t i) {
    const float d = scaled_grad(i);
    const float w = p[i] * decay;
    const float mi = m[i] + (1.0f - beta1) * (d - m[i]);
    const float vi = o.beta2 * v[i] + (1.0f - o.beta2) * d * d;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bias_correction2_sqrt + o.eps;
    store(i, w - step_size * mi / denom);
  }
};

struct FiniteBody {
  DeviceTensorList tensors;
  int32_t* found_inf;
  bool bad;
  uint64_t ptr;
  int32_t dtype;

  __device__ void begin() { bad = false; }
  __device__ void bind(int32_t t) {
    ptr = tensors.ptrs[t];
    dtype = tensors.dtypes[t];
  }
  __device__ void apply(int64_t i) {
    if (!isfinite(load_element(ptr, dtype, i))) bad = true;
  }
  __device__ bool aligned4(int64_t i) const { return ::rn::kernels::aligned4(ptr, dtype, i); }
  __device__ void apply4(int64_t i) {
    const Four f = load4(ptr, dtype, i);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (!isfinite(f.v[k])) bad = true;
    }
  }
  __device__ void end() {
    // One store per block that saw a non-finite value; 1 is the only value ever written, so races are benign.
    if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1;
  }
};

struct ZeroBody {
  DeviceTensorList tensors;
  uint64_t ptr;
  int32_t dtype;
  __device__ void begin() {}
  __device__ void bind(int32_t t) {
    ptr = tensors.ptrs[t];
    dtype = tensors.dtypes[t];
  }
  __device__ void apply(int64_t i) { store_element(ptr, dtype, i, 0.0f); }
  __device__ void end() {}
};

struct ScaleBody {
  DeviceTensorList tensors;
  ScalarArg factor_arg;
  float factor;
  uint64_t ptr;
  int32_t dtype;
  __device__ void begin() { factor = read_scalar(factor_arg); }
  __device__ void bind(int32_t t) {
    ptr = tensors.ptrs[t];
    dtype = tensors.dtypes[t];
  }
  __device__ void apply(int64_t i) { store_element(ptr, dtype, i, load_element(ptr, dtype, i) * factor); }
  __device__ void end() {}
};

}  // namespace

void sgd_step(const TensorTable& params, const TensorTable& grads, const TensorTable* bufs, const TensorTable* copies,
              ScalarArg lr, ScalarArg inv_scale, ScalarArg momentum, const int32_t* found_inf,
              const SgdOptions& options, cudaStream_t stream) {
  SgdBody body{};
  set_update_args(body, params, grads, copies, lr, inv_scale);
  // A device momentum may change between replays of a captured graph: then the buffers are always used.
  body.has_bufs = bufs != nullptr && (momentum.ptr != nullptr || momentum.value != 0.0f);
  if (body.has_bufs) body.bufs = bufs->list();
  body.momentum_arg = momentum;
  body.o = options;
  launch(params.chunks(), body, found_inf, stream);
}

void adamw_step(const TensorTable& params, const TensorTable& grads, const TensorTable& exp_avgs,
                const TensorTable& exp_avg_sqs, const TensorTable* copies, ScalarArg lr, ScalarArg inv_scale,
                ScalarArg step, ScalarArg beta1, const int32_t* found_inf, const AdamWOptions& options,
                cudaStream_t stream) {
  AdamWBody body{};
  set_update_args(body, params, grads, copies, lr, inv_scale);
  body.exp_avgs = exp_avgs.list();
  body.exp_avg_sqs = exp_avg_sqs.list();
  body.step_arg = step;
  body.beta1_arg = beta1;
  body.o = options;
  launch(params.chunks(), body, found_inf, stream);
}

void check_finite(const TensorTable& tensors, int32_t* found_inf, cudaStream_t stream) {
  FiniteBody body{};
  body.tensors = tensors.list();
  body.found_inf = found_inf;
  launch(tensors.chunks(), body, nullptr, stream);
}

void zero(const TensorTable& tensors, cudaStream_t stream) {
  ZeroBody body{};
  body.tensors = tensors.list();
  launch(tensors.chunks(), body, nullptr, stream);
}

void scale(const TensorTable& tensors, ScalarArg factor, cudaStream_t stream) {
  ScaleBody body{};
  body.tensors = tensors.list();
  body.factor_arg = factor;
  launch(tensors.chunks(), body, nullptr, stream);
}

}  // namespace rn::kernels
