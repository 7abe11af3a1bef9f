// Softmax cross-entropy with label smoothing over fp32 logits (N, C) and int32 labels (N,): the loss, the count of
// correct predictions and the gradient, each one kernel launch on the caller's stream (compiled with the
// extension, so a fresh process compiles nothing at run time, and capturable in a CUDA graph).
//
//   target = (1 - s) * onehot(label) + s / C
//   loss_i = logsumexp(z_i) - sum_j target_ij z_ij
//   dz     = (softmax(z) - target) * scale / N
//
// Per-row math is fp32; the sums over rows are float64, in a fixed order (one block), so results are
// deterministic. A label outside [0, C) makes its row's loss and gradient NaN (never a silent wrong answer; the
// data pipeline checks labels once on the host). The views are validated by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../core/tensor.h"
#include "scalar_arg.h"

namespace rn::kernels {

// What the forward writes; each pointer may be null (not wanted).
struct CrossEntropyOutputs {
  float* mean_loss = nullptr;     // = mean_i loss_i
  int32_t* correct = nullptr;     // = #{i : argmax_j z_ij == label_i} (the first maximum, as NumPy's argmax)
  double* loss_sum = nullptr;     // += sum_i loss_i (running totals over batches)
  double* correct_sum = nullptr;  // += the count of correct predictions
};

void cross_entropy_forward(const TensorView& logits, const TensorView& labels, float label_smoothing,
                           const CrossEntropyOutputs& out, cudaStream_t stream);
// grad = (softmax(logits) - target) * scale / N; grad may be logits itself (in place).
void cross_entropy_backward(const TensorView& logits, const TensorView& labels, float label_smoothing, ScalarArg scale,
                            const TensorView& grad, cudaStream_t stream);

}  // namespace rn::kernels
