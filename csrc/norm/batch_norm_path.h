// Which path a batch-norm call takes (batch_norm.cpp runs it): the cuDNN mode (the policy, persistent or spatial),
// whether the fused *Ex call may run (cuDNN's documented conditions, the bf16 switch, and the shapes cuDNN refused
// before), and which reserve buffers a fused forward last filled (the fused backward's precondition).
#pragma once

#include <cudnn.h>

#include <array>
#include <string>
#include <tuple>

#include "../core/tensor.h"

namespace rn::bn_path {

// A batch-norm problem: (forward?, dtype, n, c, h, w, has_z).
using ProblemKey = std::tuple<bool, int, int, int, int, int, bool>;
ProblemKey problem_key(bool forward, DType dtype, const std::array<int, 4>& d, bool has_z);

// How cuDNN says no to a fused call or the persistent mode (its bad-parameter and not-supported statuses).
bool is_refusal(cudnnStatus_t status);

const char* mode_name(cudnnBatchNormMode_t mode);
const char* ops_name(cudnnBatchNormOps_t ops);

// The mode the policy (set_batch_norm_mode_policy) gives a call in `layout`.
cudnnBatchNormMode_t preferred_mode(Layout layout);

struct Fusion {
  bool fused = false;
  cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
  std::string why_not;  // when !fused
};

// Whether the fused *Ex call may run for this problem in `mode`, and with which ops.
Fusion decide_fusion(bool forward, Layout layout, DType dtype, const std::array<int, 4>& d, bool relu, bool has_z,
                     cudnnBatchNormMode_t mode);

// cuDNN refused the fused call for this problem: later calls of it take the unfused path (until
// clear_batch_norm_refusals).
void remember_refusal(bool forward, DType dtype, const std::array<int, 4>& d, bool has_z, cudnnStatus_t status);

// A training forward of `problem` filled `reserve` (fused or not); nothing for an undefined reserve.
void record_forward(const TensorView& reserve, const ProblemKey& problem, bool fused);
// Whether `reserve` was last filled by a fused forward of `problem`.
bool filled_by_fused_forward(const TensorView& reserve, const ProblemKey& problem);

}  // namespace rn::bn_path
