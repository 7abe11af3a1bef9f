// The kernel layer of our own convolutions: a plain C++ interface to convolution kernels compiled into the
// extension (today CUTLASS's sm90 implicit GEMM, csrc/ownconv/sm90/), so that no CUTLASS type reaches the rest of
// csrc. Each compiled kernel is one ConvKernel (one translation unit each, registered at load time: registry.h);
// select.h picks one for a problem, run.h launches it.
//
// A kernel is a mainloop (the implicit GEMM: M = N*P*Q output pixels, N = K output channels, reduction C*R*S) and
// an epilogue (what is done to the accumulator before it is stored). The epilogue is the layer's extension point:
// today the 8-bit requantisation, later training fusions (batch-norm statistics beside the store).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "../core/dtype.h"

namespace rn::ownconv {

// One forward convolution: NHWC activations x (N, H, W, C), KRSC filters w (K, R, S, C), y (N, P, Q, K); no
// dilation, one group. The bindings build it from validated arrays, so every extent is positive and fits int.
struct ConvProblem {
  int n = 0, h = 0, w = 0, c = 0;
  int k = 0, r = 0, s = 0;
  int pad_h = 0, pad_w = 0;
  int stride_h = 1, stride_w = 1;

  int p() const { return (h + 2 * pad_h - r) / stride_h + 1; }
  int q() const { return (w + 2 * pad_w - s) / stride_w + 1; }
  // "x (2, 32, 32, 64), w (64, 3, 3, 64), pad (1, 1), stride (1, 1)"
  std::string describe() const;
};

// What a kernel's epilogue computes from the accumulator acc (int32 for 8-bit inputs), in fp32 fused multiply-adds,
// per output channel k; rne = round to nearest, ties to even; y saturates to the 8-bit range:
//   Requantize:          y = rne(min(max(alpha[k] * acc + bias[k], lower), 127))
//   RequantizeResidual:  y = rne(min(max(beta * r + (alpha[k] * acc + bias[k]), lower), 127))
// lower is 0 for a ReLU, else -127: the package's symmetric int8 range (quantization/int8.py), which CUTLASS's
// saturating conversion alone ([-128, 127]) would not give.
enum class Epilogue : uint8_t { Requantize = 0, RequantizeResidual = 1 };

const char* epilogue_name(Epilogue e);  // "requantize", "requantize_residual"
bool has_residual(Epilogue e);

// A compiled kernel's fixed properties (all known without a GPU).
struct KernelInfo {
  std::string name;
  DType in = DType::I8;   // x and w
  DType out = DType::I8;  // y, and the residual
  Epilogue epilogue = Epilogue::Requantize;
  int tile_m = 0, tile_n = 0, tile_k = 0;  // output pixels x output channels x input channels per CTA step
  int cluster_m = 1, cluster_n = 1;
  int stages = 0;           // mainloop pipeline stages
  bool persistent = false;  // a fixed grid walking the tiles (1x1 GEMMs, s8_p_*, s8_pp_*), else one CTA a tile
  bool gemm_1x1 = false;    // a plain GEMM: 1x1 filters at stride 1 without padding only (no im2col)
  bool preferred = false;   // select() takes it first wherever it runs: it beat the general kernels on every batch
                            // measured (the 64-channel halo-window kernels)
  int smem_bytes = 0;
  int threads = 0;
  int channel_multiple = 1;   // C and K must be multiples of it: TMA needs 16-byte strides
  int address_alignment = 1;  // bytes: every operand's address (TMA)
  int sm = 0;                 // the compute capability its code runs on, e.g. 90 (sm_90a SASS only, no PTX)
};

struct ConvOperands {
  const void* x = nullptr;
  const void* w = nullptr;
  void* y = nullptr;
};

// The epilogue's inputs; each Epilogue reads the fields it names above.
struct EpilogueArgs {
  const float* alpha = nullptr;    // (K,)
  const float* bias = nullptr;     // (K,)
  const void* residual = nullptr;  // (N, P, Q, K), y's dtype
  float beta = 0.f;
  float lower = 0.f;
};

class ConvKernel {
 public:
  virtual ~ConvKernel() = default;
  virtual const KernelInfo& info() const = 0;
  // "" when this kernel can run `problem`, else why not. Host only: no device access.
  virtual std::string unsupported(const ConvProblem& problem) const = 0;
  // Device scratch the launch needs (0 for today's kernels).
  virtual size_t workspace_bytes(const ConvProblem& problem) const = 0;
  // Enqueues the convolution on `stream` on the current device: no allocation, no synchronisation, so it can be
  // captured in a CUDA graph. Throws CudaError (a launch failure) or ValueError (a problem it cannot run).
  virtual void launch(const ConvProblem& problem, const ConvOperands& operands, const EpilogueArgs& epilogue,
                      void* workspace, cudaStream_t stream) const = 0;
};

}  // namespace rn::ownconv
