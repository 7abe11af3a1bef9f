// CUTLASS sm90 implicit-GEMM convolutions against cuDNN on ResNet-18 (CIFAR) layer shapes: correctness against a
// host reference and CUDA-event timing, one JSON object per line on stdout (or --out FILE).
//
//   probe [--batches 256,1024] [--iters 50] [--warmup 10] [--check-n 2] [--samples 4096] [--kernels SUBSTR,...]
//         [--shapes SUBSTR,...] [--no-cudnn] [--out FILE]
//
// Records ("kind"): "device" (once), "kernel" (one per compiled instantiation: tile, cluster, stages, smem),
// "check" (per kernel x shape at --check-n images: every output against the host reference), "time" (per kernel x
// shape x batch: median ms of --iters launches, each between its own CUDA events, after --warmup; TOPS = 2*MACs/t;
// plus --samples random outputs of that same large-batch run checked against the host), "cudnn" (per shape x batch x
// dtype: cuDNN's legacy API on the same data, see below), "error" (anything refused, with why), "done".
//
// Data are a hash of (tensor, index), so the host reference recomputes any input without copies: int8 activations
// and weights uniform in [-127, 127], fp16 ones uniform in [-1, 1] (weights x 1/sqrt(CRS)); alpha[k] so that outputs
// spread over about +-100 (int8) / +-2 (fp16) before ReLU, bias[k] in [-20, 20] / [-0.5, 0.5], beta 0.75 / 0.5.
//
// int8 reference: the exact integer sum, then the epilogue in fp32 with the same fused multiply-adds the kernel does
// (fmaf(alpha, float(acc), bias), then fmaf(beta, float(r), that)), ReLU, round to nearest even, saturate to
// [-128, 127]: expected bit-exact ("max_abs_diff" 0). Beside it, "max_abs_diff_f64" against the same epilogue in
// float64 (one rounding instead of several): 0 or 1 where a value lands next to a .5 tie.
// fp16 reference: float64 sums and epilogue; "max_abs_err" and "max_rel_err" (relative to max(|ref|, 1e-2)).
#include "probe_api.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using probe::ConvCall;
using probe::ConvKernel;
using probe::ConvShape;
using probe::DType;

FILE* g_out = stdout;

void emit(const std::string& json) {
  std::fprintf(g_out, "%s\n", json.c_str());
  std::fflush(g_out);
}

std::string esc(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (ch == '\n') { o += "\\n"; continue; }
    o += ch;
  }
  return o;
}

#define CUDA_OK(expr)                                                                                    \
  do {                                                                                                   \
    cudaError_t e_ = (expr);                                                                             \
    if (e_ != cudaSuccess) {                                                                             \
      emit(std::string("{\"kind\":\"error\",\"fatal\":true,\"where\":\"") + #expr + "\",\"error\":\"" + \
           cudaGetErrorString(e_) + "\"}");                                                              \
      std::exit(2);                                                                                      \
    }                                                                                                    \
  } while (0)

// ---------------------------------------------------------------------------------------------------------------
// Deterministic data: value(tensor, i) on host and device alike.

__host__ __device__ inline uint32_t mix(uint32_t a, uint32_t b) {
  uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u + (a << 6) + (a >> 2));
  h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
  return h;
}
// uniform in [-1, 1)
__host__ __device__ inline float unit(uint32_t tensor, uint64_t i) {
  uint32_t h = mix(mix(tensor, uint32_t(i)), uint32_t(i >> 32));
  return float(int32_t(h >> 8) - (1 << 23)) / float(1 << 23);
}
__host__ __device__ inline int8_t s8_value(uint32_t tensor, uint64_t i) {
  uint32_t h = mix(mix(tensor, uint32_t(i)), uint32_t(i >> 32));
  return int8_t(int(h % 255u) - 127);
}
__host__ __device__ inline __half f16_value(uint32_t tensor, uint64_t i, float scale) {
  return __float2half_rn(unit(tensor, i) * scale);
}

__global__ void fill_s8(int8_t* p, size_t n, uint32_t tensor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = s8_value(tensor, i);
}
__global__ void fill_f16(__half* p, size_t n, uint32_t tensor, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = f16_value(tensor, i, scale);
}

enum : uint32_t { kX = 1, kW = 2, kR = 3 };

// ---------------------------------------------------------------------------------------------------------------
// Shapes: ResNet-18's CIFAR convolutions after the stem (the stem's 3 input channels break the 16-byte TMA alignment;
// it stays on cuDNN). count = how many of that shape one forward pass runs.

struct Layer {
  const char* name;
  int h, c, k, r, stride, count;
};
const Layer kLayers[] = {
    {"l1_3x3_32px_64", 32, 64, 64, 3, 1, 4},
    {"l2_3x3s2_32px_64to128", 32, 64, 128, 3, 2, 1},
    {"l2_proj1x1s2_32px_64to128", 32, 64, 128, 1, 2, 1},
    {"l2_3x3_16px_128", 16, 128, 128, 3, 1, 3},
    {"l3_3x3s2_16px_128to256", 16, 128, 256, 3, 2, 1},
    {"l3_proj1x1s2_16px_128to256", 16, 128, 256, 1, 2, 1},
    {"l3_3x3_8px_256", 8, 256, 256, 3, 1, 3},
    {"l4_3x3s2_8px_256to512", 8, 256, 512, 3, 2, 1},
    {"l4_proj1x1s2_8px_256to512", 8, 256, 512, 1, 2, 1},
    {"l4_3x3_4px_512", 4, 512, 512, 3, 1, 3},
};

ConvShape make_shape(const Layer& l, int n) {
  ConvShape s{};
  s.n = n; s.h = l.h; s.w = l.h; s.c = l.c; s.k = l.k; s.r = l.r; s.s = l.r; s.pad = l.r / 2; s.stride = l.stride;
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Per-shape epilogue parameters (host copies) and device buffers.

struct Epilogue {
  std::vector<float> alpha, bias;
  float beta;
};

Epilogue make_epilogue(const ConvShape& s, DType dt) {
  Epilogue e;
  const double crs = double(s.c) * s.r * s.s;
  e.alpha.resize(s.k);
  e.bias.resize(s.k);
  for (int k = 0; k < s.k; ++k) {
    const float u = 0.5f * (unit(11, k) + 1.f);  // [0, 1)
    if (dt == DType::S8) {
      // int8 products: std 127^2/3 per term; the sum's std ~ 5376 * sqrt(CRS); aim for ~ +-100 at 2 std.
      e.alpha[k] = float((0.5 + u) * 50.0 / (5376.0 * std::sqrt(crs)));
      e.bias[k] = 20.f * unit(12, k);
    } else {
      e.alpha[k] = 0.5f + u;
      e.bias[k] = 0.5f * unit(12, k);
    }
  }
  e.beta = dt == DType::S8 ? 0.75f : 0.5f;
  return e;
}

float w_scale_f16(const ConvShape& s) { return float(1.0 / std::sqrt(double(s.c) * s.r * s.s)); }

// Exact accumulation at one output (n, p, q, k) from the hash data.
int64_t acc_s8(const ConvShape& s, int n, int p, int q, int k) {
  int64_t acc = 0;
  for (int r = 0; r < s.r; ++r) {
    const int h = p * s.stride - s.pad + r;
    if (h < 0 || h >= s.h) continue;
    for (int t = 0; t < s.s; ++t) {
      const int w = q * s.stride - s.pad + t;
      if (w < 0 || w >= s.w) continue;
      const uint64_t xb = ((uint64_t(n) * s.h + h) * s.w + w) * s.c;
      const uint64_t wb = ((uint64_t(k) * s.r + r) * s.s + t) * s.c;
      for (int c = 0; c < s.c; ++c) acc += int(s8_value(kX, xb + c)) * int(s8_value(kW, wb + c));
    }
  }
  return acc;
}

double acc_f16(const ConvShape& s, int n, int p, int q, int k) {
  const float ws = w_scale_f16(s);
  double acc = 0;
  for (int r = 0; r < s.r; ++r) {
    const int h = p * s.stride - s.pad + r;
    if (h < 0 || h >= s.h) continue;
    for (int t = 0; t < s.s; ++t) {
      const int w = q * s.stride - s.pad + t;
      if (w < 0 || w >= s.w) continue;
      const uint64_t xb = ((uint64_t(n) * s.h + h) * s.w + w) * s.c;
      const uint64_t wb = ((uint64_t(k) * s.r + r) * s.s + t) * s.c;
      for (int c = 0; c < s.c; ++c)
        acc += double(__half2float(f16_value(kX, xb + c, 1.f))) * double(__half2float(f16_value(kW, wb + c, ws)));
    }
  }
  return acc;
}

int round_s8(double v) {  // nearest, ties to even, saturating (cvt.rni then cvt.pack.sat)
  const double r = std::nearbyint(v);
  return int(std::min(127.0, std::max(-128.0, r)));
}

struct CheckStats {
  size_t n = 0, mismatches = 0, mismatches_f64 = 0;
  double max_abs = 0, max_abs_f64 = 0, max_rel = 0;
  long long nonzero = 0, saturated = 0;
};

// The host's accumulators at the given flat output indices (n,p,q,k order), exact for int8 (|sum| < 2^53), float64
// sums of the fp16 products otherwise; computed once per shape, dtype and index set, on every host core.
struct Reference {
  std::vector<size_t> idx;
  std::vector<double> acc;
};

Reference reference(const ConvShape& s, DType dt, std::vector<size_t> idx) {
  Reference ref;
  ref.idx = std::move(idx);
  ref.acc.resize(ref.idx.size());
  const int P = s.p(), Q = s.q();
  const unsigned threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t j = t; j < ref.idx.size(); j += threads) {
        const size_t i = ref.idx[j];
        const int k = int(i % s.k);
        size_t rest = i / s.k;
        const int q = int(rest % Q); rest /= Q;
        const int p = int(rest % P);
        const int n = int(rest / P);
        ref.acc[j] = dt == DType::S8 ? double(acc_s8(s, n, p, q, k)) : acc_f16(s, n, p, q, k);
      }
    });
  }
  for (auto& th : pool) th.join();
  return ref;
}

// Compares the outputs at the reference's indices with the host epilogue applied to its accumulators.
void check_outputs(const ConvShape& s, DType dt, bool residual, const Epilogue& e, const void* y_host,
                   const Reference& ref, CheckStats& st) {
  for (size_t j = 0; j < ref.idx.size(); ++j) {
    const size_t i = ref.idx[j];
    const int k = int(i % s.k);
    ++st.n;
    if (dt == DType::S8) {
      const int64_t acc = int64_t(ref.acc[j]);
      float t = std::fmaf(e.alpha[k], float(acc), e.bias[k]);
      double t64 = double(e.alpha[k]) * double(acc) + double(e.bias[k]);
      if (residual) {
        const int rv = s8_value(kR, i);
        t = std::fmaf(e.beta, float(rv), t);
        t64 += double(e.beta) * rv;
      }
      t = std::max(t, 0.f);
      t64 = std::max(t64, 0.0);
      const int ref = round_s8(t), ref64 = round_s8(t64);
      const int got = static_cast<const int8_t*>(y_host)[i];
      const double d = std::abs(got - ref), d64 = std::abs(got - ref64);
      st.max_abs = std::max(st.max_abs, d);
      st.max_abs_f64 = std::max(st.max_abs_f64, d64);
      st.mismatches += d != 0;
      st.mismatches_f64 += d64 != 0;
      st.nonzero += ref != 0;
      st.saturated += ref == 127;
    } else {
      double t = double(e.alpha[k]) * ref.acc[j] + double(e.bias[k]);
      if (residual) t += double(e.beta) * double(__half2float(f16_value(kR, i, 1.f)));
      t = std::max(t, 0.0);
      const double got = __half2float(static_cast<const __half*>(y_host)[i]);
      const double d = std::abs(got - t);
      st.max_abs = std::max(st.max_abs, d);
      st.max_rel = std::max(st.max_rel, d / std::max(std::abs(t), 1e-2));
      st.nonzero += t != 0;
    }
  }
}

std::string stats_json(const CheckStats& st, DType dt) {
  std::ostringstream o;
  o << "\"checked\":" << st.n << ",\"max_abs_diff\":" << st.max_abs;
  if (dt == DType::S8)
    o << ",\"mismatches\":" << st.mismatches << ",\"max_abs_diff_f64\":" << st.max_abs_f64
      << ",\"mismatches_f64\":" << st.mismatches_f64 << ",\"saturated\":" << st.saturated;
  else
    o << ",\"max_rel_err\":" << st.max_rel;
  o << ",\"nonzero\":" << st.nonzero;
  return o.str();
}

bool check_passed(const CheckStats& st, DType dt) {
  return dt == DType::S8 ? st.max_abs_f64 <= 1 : st.max_rel <= 2e-2;
}

// ---------------------------------------------------------------------------------------------------------------
// Device-side tensors for one shape, batch and dtype.

struct Buffers {
  void *x = nullptr, *w = nullptr, *r = nullptr, *y = nullptr;
  float *alpha = nullptr, *bias = nullptr;
  size_t x_n = 0, w_n = 0, y_n = 0;
  DType dt;
  Buffers(const ConvShape& s, DType dt_, const Epilogue& e) : dt(dt_) {
    x_n = size_t(s.n) * s.h * s.w * s.c;
    w_n = size_t(s.k) * s.r * s.s * s.c;
    y_n = size_t(s.n) * s.p() * s.q() * s.k;
    const size_t es = dt == DType::S8 ? 1 : 2;
    CUDA_OK(cudaMalloc(&x, x_n * es));
    CUDA_OK(cudaMalloc(&w, w_n * es));
    CUDA_OK(cudaMalloc(&r, y_n * es));
    CUDA_OK(cudaMalloc(&y, y_n * es));
    CUDA_OK(cudaMalloc(&alpha, s.k * sizeof(float)));
    CUDA_OK(cudaMalloc(&bias, s.k * sizeof(float)));
    if (dt == DType::S8) {
      fill_s8<<<1024, 256>>>(static_cast<int8_t*>(x), x_n, kX);
      fill_s8<<<1024, 256>>>(static_cast<int8_t*>(w), w_n, kW);
      fill_s8<<<1024, 256>>>(static_cast<int8_t*>(r), y_n, kR);
    } else {
      fill_f16<<<1024, 256>>>(static_cast<__half*>(x), x_n, kX, 1.f);
      fill_f16<<<1024, 256>>>(static_cast<__half*>(w), w_n, kW, w_scale_f16(s));
      fill_f16<<<1024, 256>>>(static_cast<__half*>(r), y_n, kR, 1.f);
    }
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(alpha, e.alpha.data(), s.k * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(bias, e.bias.data(), s.k * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
  }
  ~Buffers() {
    cudaFree(x); cudaFree(w); cudaFree(r); cudaFree(y); cudaFree(alpha); cudaFree(bias);
  }
  size_t elem() const { return dt == DType::S8 ? 1 : 2; }
  std::vector<char> y_host() const {
    std::vector<char> h(y_n * elem());
    CUDA_OK(cudaMemcpy(h.data(), y, h.size(), cudaMemcpyDeviceToHost));
    return h;
  }
};

struct Timing {
  double median_ms = 0, min_ms = 0, mean_loop_ms = 0;
};

template <class F>
Timing time_it(F&& launch, int warmup, int iters, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) launch();
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_OK(cudaEventRecord(a, stream));
    launch();
    CUDA_OK(cudaEventRecord(b, stream));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaEventElapsedTime(&ms[i], a, b));
  }
  // Back-to-back launches between one pair of events: launch gaps hidden, the per-kernel cost in a stream.
  CUDA_OK(cudaEventRecord(a, stream));
  for (int i = 0; i < iters; ++i) launch();
  CUDA_OK(cudaEventRecord(b, stream));
  CUDA_OK(cudaEventSynchronize(b));
  float total = 0;
  CUDA_OK(cudaEventElapsedTime(&total, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.median_ms = ms[iters / 2];
  t.min_ms = ms[0];
  t.mean_loop_ms = total / iters;
  return t;
}

std::vector<size_t> sample_indices(size_t total, size_t count, uint32_t seed) {
  std::vector<size_t> idx;
  if (count >= total) {
    idx.resize(total);
    for (size_t i = 0; i < total; ++i) idx[i] = i;
    return idx;
  }
  idx.reserve(count + 2);
  idx.push_back(0);
  idx.push_back(total - 1);
  for (size_t i = 0; i < count; ++i) idx.push_back(size_t(mix(seed, uint32_t(i)) | (uint64_t(mix(seed + 1, uint32_t(i))) << 32)) % total);
  return idx;
}

std::string shape_json(const Layer& l, const ConvShape& s) {
  std::ostringstream o;
  o << "\"layer\":\"" << l.name << "\",\"count\":" << l.count << ",\"n\":" << s.n << ",\"h\":" << s.h << ",\"c\":" << s.c
    << ",\"k\":" << s.k << ",\"r\":" << s.r << ",\"stride\":" << s.stride << ",\"p\":" << s.p();
  return o.str();
}

const char* dt_name(DType d) { return d == DType::S8 ? "int8" : "fp16"; }

// ---------------------------------------------------------------------------------------------------------------
// cuDNN's legacy API on the same data: fp16 NHWC (fp32 compute, tensor-op math, the best algorithm of
// cudnnFindConvolutionForwardAlgorithmEx) conv + bias + ReLU via cudnnConvolutionBiasActivationForward, and int8
// NHWC (INT8 in, INT32 compute, INT8 out; IMPLICIT_PRECOMP_GEMM, the only algorithm for it) with a scalar alpha (the
// legacy API has no per-channel scale) + float bias + ReLU. The engine's own 8-bit path is cuDNN's graph API, which
// this does not time: see docs/lab-notes/RESULTS.md and tools/probe_quantized.py for those numbers.

#define DNN(expr)                                                                                             \
  do {                                                                                                        \
    cudnnStatus_t s_ = (expr);                                                                                \
    if (s_ != CUDNN_STATUS_SUCCESS) return std::string(#expr).substr(0, 48) + ": " + cudnnGetErrorString(s_); \
  } while (0)

std::string cudnn_time(cudnnHandle_t handle, const ConvShape& s, DType dt, const Buffers& b, const Epilogue& e,
                       int warmup, int iters, cudaStream_t stream, Timing& t, std::string& algo_name) {
  cudnnTensorDescriptor_t xd, yd, bd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  cudnnActivationDescriptor_t ad;
  cudnnCreateTensorDescriptor(&xd); cudnnCreateTensorDescriptor(&yd); cudnnCreateTensorDescriptor(&bd);
  cudnnCreateFilterDescriptor(&wd); cudnnCreateConvolutionDescriptor(&cd); cudnnCreateActivationDescriptor(&ad);
  struct Cleanup {
    cudnnTensorDescriptor_t a, b, c; cudnnFilterDescriptor_t w; cudnnConvolutionDescriptor_t cd;
    cudnnActivationDescriptor_t ad;
    ~Cleanup() {
      cudnnDestroyTensorDescriptor(a); cudnnDestroyTensorDescriptor(b); cudnnDestroyTensorDescriptor(c);
      cudnnDestroyFilterDescriptor(w); cudnnDestroyConvolutionDescriptor(cd); cudnnDestroyActivationDescriptor(ad);
    }
  } cleanup{xd, yd, bd, wd, cd, ad};
  const cudnnDataType_t io = dt == DType::S8 ? CUDNN_DATA_INT8 : CUDNN_DATA_HALF;
  DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, io, s.n, s.c, s.h, s.w));
  DNN(cudnnSetFilter4dDescriptor(wd, io, CUDNN_TENSOR_NHWC, s.k, s.c, s.r, s.s));
  DNN(cudnnSetConvolution2dDescriptor(cd, s.pad, s.pad, s.stride, s.stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                      dt == DType::S8 ? CUDNN_DATA_INT32 : CUDNN_DATA_FLOAT));
  DNN(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
  DNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NHWC, io, s.n, s.k, s.p(), s.q()));
  // Bias: float for the int8 configuration, the output type otherwise.
  DNN(cudnnSetTensor4dDescriptor(bd, CUDNN_TENSOR_NHWC, dt == DType::S8 ? CUDNN_DATA_FLOAT : CUDNN_DATA_HALF, 1, s.k,
                                 1, 1));
  DNN(cudnnSetActivationDescriptor(ad, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  void* bias = nullptr;
  std::vector<__half> bias_h(s.k);
  for (int k = 0; k < s.k; ++k) bias_h[k] = __float2half_rn(e.bias[k]);
  if (dt == DType::S8) {
    bias = b.bias;
  } else {
    CUDA_OK(cudaMalloc(&bias, s.k * sizeof(__half)));
    CUDA_OK(cudaMemcpy(bias, bias_h.data(), s.k * sizeof(__half), cudaMemcpyHostToDevice));
  }
  struct FreeBias { void* p; bool own; ~FreeBias() { if (own) cudaFree(p); } } free_bias{bias, dt != DType::S8};

  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  if (dt == DType::F16) {
    const size_t find_ws = size_t(256) << 20;
    CUDA_OK(cudaMalloc(&ws, find_ws));
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int found = 0;
    const float one = 1.f, zero = 0.f;
    (void)one; (void)zero;
    cudnnStatus_t st = cudnnFindConvolutionForwardAlgorithmEx(handle, xd, b.x, wd, b.w, cd, yd, b.y,
                                                              CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf, ws,
                                                              find_ws);
    cudaFree(ws);
    ws = nullptr;
    if (st != CUDNN_STATUS_SUCCESS) return std::string("cudnnFindConvolutionForwardAlgorithmEx: ") + cudnnGetErrorString(st);
    int pick = -1;
    for (int i = 0; i < found; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS) { pick = i; break; }
    if (pick < 0) return "cudnnFindConvolutionForwardAlgorithmEx: no algorithm succeeded";
    algo = perf[pick].algo;
  }
  DNN(cudnnGetConvolutionForwardWorkspaceSize(handle, xd, wd, cd, yd, algo, &ws_bytes));
  if (ws_bytes) CUDA_OK(cudaMalloc(&ws, ws_bytes));
  struct FreeWs { void* p; ~FreeWs() { if (p) cudaFree(p); } } free_ws{ws};
  static const char* kAlgoNames[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT",
                                     "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  algo_name = int(algo) < 8 ? kAlgoNames[int(algo)] : std::to_string(int(algo));
  // int8: alpha1 is one scalar (the mean of the per-channel ones), as close as the legacy API gets.
  float mean_alpha = 0;
  for (float a : e.alpha) mean_alpha += a / float(e.alpha.size());
  const float alpha1 = dt == DType::S8 ? mean_alpha : 1.f, alpha2 = 0.f;
  cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
  auto launch = [&] {
    cudnnStatus_t st = cudnnConvolutionBiasActivationForward(handle, &alpha1, xd, b.x, wd, b.w, cd, algo, ws,
                                                             ws_bytes, &alpha2, yd, b.y, bd, bias, ad, yd, b.y);
    if (st != CUDNN_STATUS_SUCCESS) last = st;
  };
  launch();
  CUDA_OK(cudaStreamSynchronize(stream));
  if (last != CUDNN_STATUS_SUCCESS) return std::string("cudnnConvolutionBiasActivationForward: ") + cudnnGetErrorString(last);
  t = time_it(launch, warmup, iters, stream);
  if (last != CUDNN_STATUS_SUCCESS) return std::string("cudnnConvolutionBiasActivationForward: ") + cudnnGetErrorString(last);
  return "";
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) if (!item.empty()) out.push_back(item);
  return out;
}

bool matches(const std::vector<std::string>& filters, const std::string& name) {
  if (filters.empty()) return true;
  for (auto& f : filters) if (name.find(f) != std::string::npos) return true;
  return false;
}

}  // namespace

#ifdef PROBE_REFERENCE_BENCH
// Host-only: times the reference accumulators the full run computes (no GPU needed). Build with
//   nvcc -DPROBE_REFERENCE_BENCH ... probe.cu -o ref_bench
int main() {
  const auto t0 = std::chrono::steady_clock::now();
  double total_macs = 0;
  for (const Layer& layer : kLayers)
    for (DType dt : {DType::S8, DType::F16}) {
      ConvShape s = make_shape(layer, 2);
      size_t y_n = size_t(s.n) * s.p() * s.q() * s.k;
      Reference r = reference(s, dt, sample_indices(y_n, y_n, 0));
      total_macs += double(y_n) * s.c * s.r * s.s;
      for (int n : {256, 1024}) {
        s = make_shape(layer, n);
        y_n = size_t(s.n) * s.p() * s.q() * s.k;
        Reference q = reference(s, dt, sample_indices(y_n, 4096, 7 + n));
        total_macs += 4098.0 * s.c * s.r * s.s;
      }
    }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"reference_seconds\":%.2f,\"threads\":%u,\"macs\":%.3g}\n", secs,
              std::max(1u, std::min(32u, std::thread::hardware_concurrency())), total_macs);
  return 0;
}
#else
int main(int argc, char** argv) {
  std::vector<int> batches = {256, 1024};
  int iters = 50, warmup = 10, check_n = 2;
  size_t samples = 4096;
  bool use_cudnn = true;
  std::vector<std::string> kernel_filter, shape_filter;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(1); }
      return argv[++i];
    };
    if (a == "--batches") { batches.clear(); for (auto& b : split(next())) batches.push_back(std::atoi(b.c_str())); }
    else if (a == "--iters") iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--check-n") check_n = std::atoi(next().c_str());
    else if (a == "--samples") samples = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--kernels") kernel_filter = split(next());
    else if (a == "--shapes") shape_filter = split(next());
    else if (a == "--no-cudnn") use_cudnn = false;
    else if (a == "--out") {
      g_out = std::fopen(next().c_str(), "w");
      if (!g_out) { std::perror("--out"); return 1; }
    } else {
      std::fprintf(stderr, "unknown argument %s (see the comment at the top of probe.cu)\n", a.c_str());
      return 1;
    }
  }
  const auto t_start = std::chrono::steady_clock::now();

  int dev = 0;
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaGetDeviceProperties(&prop, dev));
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  {
    std::ostringstream o;
    o << "{\"kind\":\"device\",\"name\":\"" << esc(prop.name) << "\",\"cc\":\"" << prop.major << "." << prop.minor
      << "\",\"sms\":" << prop.multiProcessorCount << ",\"l2_mb\":" << prop.l2CacheSize / (1 << 20)
      << ",\"driver\":" << drv << ",\"runtime\":" << rt << ",\"cudnn\":" << (use_cudnn ? long(cudnnGetVersion()) : 0L)
      << ",\"cutlass\":\"" << CUTLASS_PROBE_VERSION << "\",\"iters\":" << iters << ",\"warmup\":" << warmup << "}";
    emit(o.str());
  }
  if (prop.major != 9) {
    emit("{\"kind\":\"error\",\"fatal\":true,\"error\":\"the kernels are sm_90a only; this device is not sm_90\"}");
    return 3;
  }

  std::vector<std::unique_ptr<ConvKernel>> kernels;
  for (auto make : probe::kernels()) {
    auto k = make();
    if (!matches(kernel_filter, k->name())) continue;
    emit("{\"kind\":\"kernel\",\"kernel\":\"" + k->name() + "\",\"dtype\":\"" + dt_name(k->dtype()) +
         "\",\"residual\":" + (k->has_residual() ? "true" : "false") + "," + k->describe() + "}");
    kernels.push_back(std::move(k));
  }

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudnnHandle_t handle = nullptr;
  if (use_cudnn) {
    cudnnStatus_t st = cudnnCreate(&handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      emit(std::string("{\"kind\":\"error\",\"where\":\"cudnnCreate\",\"error\":\"") + cudnnGetErrorString(st) + "\"}");
      use_cudnn = false;
    } else {
      cudnnSetStream(handle, stream);
    }
  }

  int failures = 0;
  for (const Layer& layer : kLayers) {
    if (!matches(shape_filter, layer.name)) continue;
    for (DType dt : {DType::S8, DType::F16}) {
      // Correctness at check_n images: every output.
      if (check_n > 0) {
        const ConvShape s = make_shape(layer, check_n);
        const Epilogue e = make_epilogue(s, dt);
        Buffers b(s, dt, e);
        const Reference all = reference(s, dt, sample_indices(b.y_n, b.y_n, 0));
        for (auto& k : kernels) {
          if (k->dtype() != dt) continue;
          ConvCall call;
          call.x = b.x; call.w = b.w; call.y = b.y; call.alpha = b.alpha; call.bias = b.bias; call.beta = e.beta;
          call.residual = k->has_residual() ? b.r : nullptr;
          CUDA_OK(cudaMemset(b.y, 0x55, b.y_n * b.elem()));
          std::string why = k->prepare(s, call, stream);
          if (why.empty() && k->launch(stream) != cudaSuccess) why = "launch failed";
          if (!why.empty()) {
            emit("{\"kind\":\"error\",\"what\":\"check\",\"kernel\":\"" + k->name() + "\"," + shape_json(layer, s) +
                 ",\"error\":\"" + esc(why) + "\"}");
            continue;
          }
          CUDA_OK(cudaStreamSynchronize(stream));
          const auto y = b.y_host();
          CheckStats st;
          check_outputs(s, dt, k->has_residual(), e, y.data(), all, st);
          const bool ok = check_passed(st, dt);
          failures += !ok;
          emit("{\"kind\":\"check\",\"kernel\":\"" + k->name() + "\",\"dtype\":\"" + dt_name(dt) + "\"," +
               shape_json(layer, s) + "," + stats_json(st, dt) + ",\"pass\":" + (ok ? "true" : "false") + "}");
        }
      }
      for (int n : batches) {
        const ConvShape s = make_shape(layer, n);
        const Epilogue e = make_epilogue(s, dt);
        Buffers b(s, dt, e);
        const double ops = 2.0 * s.macs();
        const Reference sampled = reference(s, dt, sample_indices(b.y_n, samples, 7 + n));
        for (auto& k : kernels) {
          if (k->dtype() != dt) continue;
          ConvCall call;
          call.x = b.x; call.w = b.w; call.y = b.y; call.alpha = b.alpha; call.bias = b.bias; call.beta = e.beta;
          call.residual = k->has_residual() ? b.r : nullptr;
          const auto t0 = std::chrono::steady_clock::now();
          std::string why = k->prepare(s, call, stream);
          const double prepare_us =
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
          if (!why.empty()) {
            emit("{\"kind\":\"error\",\"what\":\"time\",\"kernel\":\"" + k->name() + "\"," + shape_json(layer, s) +
                 ",\"error\":\"" + esc(why) + "\"}");
            continue;
          }
          cudaError_t le = cudaSuccess;
          Timing t = time_it([&] { cudaError_t r = k->launch(stream); if (r != cudaSuccess) le = r; }, warmup, iters,
                             stream);
          if (le != cudaSuccess) {
            emit("{\"kind\":\"error\",\"what\":\"time\",\"kernel\":\"" + k->name() + "\"," + shape_json(layer, s) +
                 ",\"error\":\"" + esc(cudaGetErrorString(le)) + "\"}");
            continue;
          }
          const auto y = b.y_host();
          CheckStats st;
          check_outputs(s, dt, k->has_residual(), e, y.data(), sampled, st);
          const bool ok = check_passed(st, dt);
          failures += !ok;
          std::ostringstream o;
          o << "{\"kind\":\"time\",\"impl\":\"cutlass\",\"kernel\":\"" << k->name() << "\",\"dtype\":\"" << dt_name(dt)
            << "\",\"residual\":" << (k->has_residual() ? "true" : "false") << "," << shape_json(layer, s)
            << ",\"ms\":" << t.median_ms << ",\"min_ms\":" << t.min_ms << ",\"loop_ms\":" << t.mean_loop_ms
            << ",\"tops\":" << ops / (t.median_ms * 1e-3) / 1e12 << ",\"prepare_us\":" << prepare_us << ","
            << stats_json(st, dt) << ",\"pass\":" << (ok ? "true" : "false") << "}";
          emit(o.str());
        }
        if (use_cudnn) {
          Timing t;
          std::string algo;
          std::string why = cudnn_time(handle, s, dt, b, e, warmup, iters, stream, t, algo);
          if (!why.empty()) {
            emit(std::string("{\"kind\":\"error\",\"what\":\"cudnn\",\"dtype\":\"") + dt_name(dt) + "\"," +
                 shape_json(layer, s) + ",\"error\":\"" + esc(why) + "\"}");
          } else {
            std::ostringstream o;
            o << "{\"kind\":\"time\",\"impl\":\"cudnn_legacy\",\"kernel\":\"cudnn_legacy_" << dt_name(dt) << "_" << algo
              << "\",\"dtype\":\"" << dt_name(dt) << "\",\"residual\":false," << shape_json(layer, s) << ",\"ms\":"
              << t.median_ms << ",\"min_ms\":" << t.min_ms << ",\"loop_ms\":" << t.mean_loop_ms
              << ",\"tops\":" << ops / (t.median_ms * 1e-3) / 1e12 << "}";
            emit(o.str());
          }
        }
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::ostringstream o;
  o << "{\"kind\":\"done\",\"failures\":" << failures << ",\"seconds\":" << secs << "}";
  emit(o.str());
  if (handle) cudnnDestroy(handle);
  if (g_out != stdout) std::fclose(g_out);
  return failures ? 1 : 0;
}
#endif  // PROBE_REFERENCE_BENCH
