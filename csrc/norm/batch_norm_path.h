// Which path a batch-norm call takes (batch_norm.cpp runs it): the cuDNN mode (the policy, persistent or spatial),
// whether a *Ex call runs (cuDNN's persistent NHWC kernels) and with which ops (the add and ReLU fused into it, or
// left to the elementwise kernels), the shapes cuDNN refused before, and what the training forward did with each
// reserve buffer (the backward follows it).
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
  bool ex = false;     // a *Ex call runs bn(x) in cuDNN's persistent NHWC kernels; else the plain call
  bool fused = false;  // that call also does the add and the ReLU (ops below): the whole op in one call
  cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
  std::string why_not;  // why no *Ex call, or (with ex) why the add / ReLU are left to the elementwise kernels
};

// The path of this problem in `mode`: a *Ex call where the mode and layout allow it and cuDNN has not refused the
// shape; its ops the fused ones where cuDNN has them (half precision, C % 4 == 0, an op with a ReLU), else BN.
Fusion decide_fusion(bool forward, Layout layout, DType dtype, const std::array<int, 4>& d, bool relu, bool has_z,
                     cudnnBatchNormMode_t mode);

// cuDNN refused a *Ex call with `ops` for this problem: later calls narrow to BN ops, then to the plain call
// (until clear_batch_norm_refusals).
void remember_refusal(bool forward, DType dtype, const std::array<int, 4>& d, bool has_z, cudnnBatchNormOps_t ops,
                      cudnnStatus_t status);

// What a training forward of `problem` did with `reserve`: a *Ex call with `ops`, or the plain call (ex false).
struct ForwardRecord {
  bool ex = false;
  cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
};
// Nothing for an undefined reserve.
void record_forward(const TensorView& reserve, const ProblemKey& problem, ForwardRecord record);
// What the last training forward of `problem` into `reserve` ran; {ex false} when none did (or another problem).
ForwardRecord forward_record(const TensorView& reserve, const ProblemKey& problem);

}  // namespace rn::bn_path
