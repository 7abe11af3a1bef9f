#include "batch_norm.h"

#include <algorithm>

#include "../core/descriptor.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/workspace.h"
#include "../core/cudnn_tensor_4d.h"
#include "../kernels/elementwise.h"
#include "batch_norm_path.h"

namespace rn {
namespace {

using bn_path::decide_fusion;
using bn_path::forward_record;
using bn_path::ForwardRecord;
using bn_path::Fusion;
using bn_path::is_refusal;
using bn_path::mode_name;
using bn_path::ops_name;
using bn_path::preferred_mode;
using bn_path::problem_key;
using bn_path::ProblemKey;
using bn_path::record_forward;
using bn_path::remember_refusal;

thread_local BatchNormPath t_last_path;

// The activation tensor descriptor (x, y, z, dy, dx, dz all share it) and the derived 1xCx1x1 fp32 one.
struct BnDescriptors {
  TensorDescriptor data;
  TensorDescriptor param;
};

BnDescriptors make_descriptors(Layout layout, DType dtype, const std::array<int, 4>& d, cudnnBatchNormMode_t mode) {
  BnDescriptors desc{make_tensor_4d(layout, dtype, d), TensorDescriptor()};
  RN_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(desc.param.get(), desc.data.get(), mode));
  return desc;
}

ActivationDescriptor make_relu() {
  ActivationDescriptor act;
  RN_CUDNN_CHECK(cudnnSetActivationDescriptor(act.get(), CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  return act;
}

// The fused kernels want a real workspace pointer even when they report needing none.
constexpr size_t kMinWorkspace = 256;

const float kOne = 1.0f, kZero = 0.0f;

// y += z and/or ReLU after a plain BN call; returns what ran.
std::string run_epilogue(const TensorView& y, const TensorView& z, bool relu, cudaStream_t stream) {
  if (z.defined()) {
    kernels::add(y, z, y, relu, stream);
    return relu ? " + add_relu kernel" : " + add kernel";
  }
  if (relu) {
    kernels::relu(y, y, stream);
    return " + relu kernel";
  }
  return "";
}

// *no_workspace is set (and SUCCESS returned without running anything) when the workspace pool cannot provide
// the workspace (its limit): the caller then runs the unfused path, without remembering a refusal.
cudnnStatus_t ex_forward(cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
                         const BatchNormTrainArgs& a, const std::array<int, 4>& d, cudaStream_t stream,
                         bool* no_workspace) {
  const BnDescriptors desc = make_descriptors(a.layout, a.x.dtype, d, mode);
  const ActivationDescriptor act = make_relu();
  const bool adds_z = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
  size_t workspace_bytes = 0, reserve_bytes = 0;
  cudnnStatus_t status = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
      handle, mode, ops, desc.data.get(), desc.data.get(), desc.data.get(), desc.param.get(), act.get(),
      &workspace_bytes);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  status = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, mode, ops, act.get(), desc.data.get(),
                                                                &reserve_bytes);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  const size_t reserve_given = a.reserve.defined() ? a.reserve.nbytes() : 0;
  if (reserve_given < reserve_bytes) {
    throw ValueError("reserve: the batch-norm path with ops " + std::string(ops_name(ops)) + " needs " +
                     std::to_string(reserve_bytes) + " bytes of reserve space, got " + std::to_string(reserve_given) +
                     " (allocate it with resnet_native.norm.batch_norm_reserve_size)");
  }
  workspace_bytes = std::max(workspace_bytes, kMinWorkspace);
  void* workspace = WorkspacePool::current().try_get(workspace_bytes, stream);
  *no_workspace = workspace == nullptr;
  if (*no_workspace) return CUDNN_STATUS_SUCCESS;
  return cudnnBatchNormalizationForwardTrainingEx(
      handle, mode, ops, &kOne, &kZero, desc.data.get(), a.x.data, desc.data.get(), adds_z ? a.z.data : nullptr,
      desc.data.get(), a.y.data, desc.param.get(), a.gamma.data, a.beta.data, a.momentum, a.running_mean.data,
      a.running_var.data, a.eps, a.save_mean.data, a.save_invstd.data, act.get(), workspace, workspace_bytes,
      reserve_given ? a.reserve.data : nullptr, reserve_given);
}

cudnnStatus_t plain_forward(cudnnHandle_t handle, cudnnBatchNormMode_t mode, const BatchNormTrainArgs& a,
                            const std::array<int, 4>& d) {
  const BnDescriptors desc = make_descriptors(a.layout, a.x.dtype, d, mode);
  return cudnnBatchNormalizationForwardTraining(
      handle, mode, &kOne, &kZero, desc.data.get(), a.x.data, desc.data.get(), a.y.data, desc.param.get(), a.gamma.data,
      a.beta.data, a.momentum, a.running_mean.data, a.running_var.data, a.eps, a.save_mean.data, a.save_invstd.data);
}

// The blend of dgamma / dbeta with what the arrays hold (betaParamDiff): 1 adds into them (accumulate), in the
// call's own kernels, with no scratch and no add kernels of ours.
const void* param_beta(const BatchNormBackwardArgs& a) {
  return a.accumulate ? &kOne : &kZero;
}

// dy: the gradient the call takes (a.dy with fused ops; with BN ops, dy already masked by the ReLU).
cudnnStatus_t ex_backward(cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
                          const BatchNormBackwardArgs& a, const TensorView& dy, void* workspace, size_t workspace_bytes,
                          const std::array<int, 4>& d) {
  const BnDescriptors desc = make_descriptors(a.layout, a.x.dtype, d, mode);
  const ActivationDescriptor act = make_relu();
  const void* y = ops == CUDNN_BATCHNORM_OPS_BN ? nullptr : a.y.data;  // the ReLU mask's source; BN alone needs none
  void* dz = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION ? a.dz.data : nullptr;
  return cudnnBatchNormalizationBackwardEx(handle, mode, ops, &kOne, &kZero, &kOne, param_beta(a), desc.data.get(),
                                           a.x.data, desc.data.get(), y, desc.data.get(), dy.data, desc.data.get(), dz,
                                           desc.data.get(), a.dx.data, desc.param.get(), a.gamma.data, a.beta.data,
                                           a.dgamma.data, a.dbeta.data, a.eps, a.save_mean.data, a.save_invstd.data,
                                           act.get(), workspace, workspace_bytes, a.reserve.data, a.reserve.nbytes());
}

cudnnStatus_t ex_backward_workspace(cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
                                    const BatchNormBackwardArgs& a, const std::array<int, 4>& d, size_t* bytes) {
  const BnDescriptors desc = make_descriptors(a.layout, a.x.dtype, d, mode);
  const ActivationDescriptor act = make_relu();
  return cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, mode, ops, desc.data.get(), desc.data.get(),
                                                           desc.data.get(), desc.data.get(), desc.data.get(),
                                                           desc.param.get(), act.get(), bytes);
}

cudnnStatus_t plain_backward(cudnnHandle_t handle, cudnnBatchNormMode_t mode, const BatchNormBackwardArgs& a,
                             const TensorView& dy, const std::array<int, 4>& d) {
  const BnDescriptors desc = make_descriptors(a.layout, a.x.dtype, d, mode);
  return cudnnBatchNormalizationBackward(handle, mode, &kOne, &kZero, &kOne, param_beta(a), desc.data.get(), a.x.data,
                                         desc.data.get(), dy.data, desc.data.get(), a.dx.data, desc.param.get(),
                                         a.gamma.data, a.dgamma.data, a.dbeta.data, a.eps, a.save_mean.data,
                                         a.save_invstd.data);
}

// One workspace-pool buffer carved into: [cuDNN workspace | masked dy], each part present only when needed.
// Only the cuDNN workspace is bounded by the pool's limit (the *Ex path checks it and the plain call needs
// none); the masked dy is required by either path.
struct BackwardScratch {
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  TensorView masked_dy;
};

BackwardScratch carve_scratch(const BatchNormBackwardArgs& a, size_t workspace_bytes, bool need_masked_dy,
                              cudaStream_t stream) {
  const size_t masked_bytes = need_masked_dy ? workspace_part_bytes(a.dy.nbytes()) : 0;
  workspace_bytes = workspace_bytes ? workspace_part_bytes(workspace_bytes) : 0;
  const size_t total = workspace_bytes + masked_bytes;
  auto* base = static_cast<unsigned char*>(total ? WorkspacePool::current().get_required(total, stream) : nullptr);
  BackwardScratch s;
  s.workspace = workspace_bytes ? base : nullptr;
  s.workspace_bytes = workspace_bytes;
  if (need_masked_dy) {
    s.masked_dy = a.dy;
    s.masked_dy.data = base + workspace_bytes;
  }
  return s;
}

// Runs `call(mode)`; a persistent call cuDNN refuses is retried in spatial mode. Throws on failure.
template <typename Call>
cudnnBatchNormMode_t run_with_mode_fallback(cudnnBatchNormMode_t mode, const char* expr, Call&& call) {
  cudnnStatus_t status = call(mode);
  // The persistent mode is only a faster variant: whatever it refuses is retried in spatial mode, where a
  // genuinely bad argument is reported.
  if (status != CUDNN_STATUS_SUCCESS && mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT && is_refusal(status)) {
    mode = CUDNN_BATCHNORM_SPATIAL;
    status = call(mode);
  }
  if (status != CUDNN_STATUS_SUCCESS) throw_cudnn_error(status, expr, __FILE__, __LINE__);
  return mode;
}

}  // namespace

size_t batch_norm_reserve_size(Layout layout, DType dtype, const std::array<int, 4>& d, bool relu, bool has_z,
                               cudaStream_t stream) {
  const cudnnBatchNormMode_t mode = preferred_mode(layout);
  const Fusion fusion = decide_fusion(true, layout, dtype, d, relu, has_z, mode);
  if (!fusion.ex) return 0;
  const BnDescriptors desc = make_descriptors(layout, dtype, d, mode);
  const ActivationDescriptor act = make_relu();
  size_t bytes = 0;
  const cudnnStatus_t status = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
      cudnn_handle(stream), mode, fusion.ops, act.get(), desc.data.get(), &bytes);
  // At least one float: the buffer is also the key under which the forward records what it ran for the backward.
  if (status == CUDNN_STATUS_SUCCESS) return std::max(bytes, sizeof(float));
  if (is_refusal(status)) return 0;  // the forward will be refused too and take the plain call
  throw_cudnn_error(status, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize", __FILE__, __LINE__);
}

void batch_norm_forward_training(const BatchNormTrainArgs& a, cudaStream_t stream) {
  const WorkspaceOrder order(stream);  // the *Ex call's workspace is the shared pool's
  const std::array<int, 4> d = nchw_dims(a.x, a.layout);
  const DType dtype = a.x.dtype;
  const bool has_z = a.z.defined();
  const cudnnHandle_t handle = cudnn_handle(stream);
  const cudnnBatchNormMode_t mode = preferred_mode(a.layout);
  const ProblemKey problem = problem_key(true, dtype, d, has_z);
  Fusion fusion = decide_fusion(true, a.layout, dtype, d, a.relu, has_z, mode);
  // A refused *Ex call is remembered and the decision taken again: fused ops narrow to BN, BN to the plain call.
  while (fusion.ex) {
    bool no_workspace = false;
    const cudnnStatus_t status = ex_forward(handle, mode, fusion.ops, a, d, stream, &no_workspace);
    if (no_workspace) {
      fusion.why_not = "workspace over the limit";
      break;
    }
    if (status == CUDNN_STATUS_SUCCESS) {
      record_forward(a.reserve, problem, {true, fusion.ops});
      std::string detail = std::string("cudnnBatchNormalizationForwardTrainingEx(") + ops_name(fusion.ops) + ")";
      if (!fusion.fused) detail += run_epilogue(a.y, a.z, a.relu, stream) + " (unfused: " + fusion.why_not + ")";
      t_last_path = {"train", fusion.fused, true, mode_name(mode), detail};
      return;
    }
    if (!is_refusal(status)) throw_cudnn_error(status, "cudnnBatchNormalizationForwardTrainingEx", __FILE__, __LINE__);
    remember_refusal(true, dtype, d, has_z, fusion.ops, status);
    fusion = decide_fusion(true, a.layout, dtype, d, a.relu, has_z, mode);
  }
  record_forward(a.reserve, problem, {});
  const cudnnBatchNormMode_t ran =
      run_with_mode_fallback(mode, "cudnnBatchNormalizationForwardTraining",
                             [&](cudnnBatchNormMode_t m) { return plain_forward(handle, m, a, d); });
  std::string detail = "cudnnBatchNormalizationForwardTraining" + run_epilogue(a.y, a.z, a.relu, stream);
  detail += " (unfused: " + fusion.why_not + ")";
  t_last_path = {"train", false, false, mode_name(ran), detail};
}

void batch_norm_forward_inference(const BatchNormInferArgs& a, cudaStream_t stream) {
  const std::array<int, 4> d = nchw_dims(a.x, a.layout);
  // Inference has no reduction, so the persistent mode has nothing to speed up: always spatial.
  const cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL;
  const BnDescriptors desc = make_descriptors(a.layout, a.x.dtype, d, mode);
  RN_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
      cudnn_handle(stream), mode, &kOne, &kZero, desc.data.get(), a.x.data, desc.data.get(), a.y.data, desc.param.get(),
      a.gamma.data, a.beta.data, a.running_mean.data, a.running_var.data, a.eps));
  t_last_path = {"infer", false, false, mode_name(mode),
                 "cudnnBatchNormalizationForwardInference" + run_epilogue(a.y, a.z, a.relu, stream)};
}

namespace {

// The gradient reaching bn(x) [+ z] when the add / ReLU ran outside cuDNN: dy masked by y > 0 (into dz with z,
// else into `masked`), or dy itself copied to dz for an add without ReLU. Returns it and says what ran.
TensorView unfused_epilogue_grad(const BatchNormBackwardArgs& a, const TensorView& masked, cudaStream_t stream,
                                 std::string* detail) {
  if (a.relu) {
    kernels::relu_backward(a.dy, a.y, a.has_z ? a.dz : masked, stream);
    *detail += "relu_backward kernel + ";
    return a.has_z ? a.dz : masked;
  }
  if (a.has_z) {
    RN_CUDA_CHECK(cudaMemcpyAsync(a.dz.data, a.dy.data, a.dy.nbytes(), cudaMemcpyDeviceToDevice, stream));
    *detail += "dz copy + ";
  }
  return a.dy;
}

// The *Ex backward, when the forward into a.reserve ran a *Ex call: with its ops if they fused the add / ReLU
// (cuDNN reads the ReLU mask it left in the reserve) and the backward's are not refused, else with BN ops after
// the masking kernels. Returns false (having changed nothing but what a retry overwrites) when it cannot run:
// *why_not says why.
bool try_ex_backward(const BatchNormBackwardArgs& a, const std::array<int, 4>& d, cudnnBatchNormMode_t mode,
                     cudaStream_t stream, std::string* why_not) {
  const DType dtype = a.x.dtype;
  const ForwardRecord forward = forward_record(a.reserve, problem_key(true, dtype, d, a.has_z));
  const Fusion decision = decide_fusion(false, a.layout, dtype, d, a.relu, a.has_z, mode);
  if (!decision.ex) {
    *why_not = decision.why_not;
    return false;
  }
  if (!forward.ex) {
    *why_not = a.reserve.defined() ? "the forward that filled `reserve` took the plain call" : "no reserve given";
    return false;
  }
  const bool fused_ops = forward.ops != CUDNN_BATCHNORM_OPS_BN && decision.fused && decision.ops == forward.ops;
  const cudnnBatchNormOps_t ops = fused_ops ? forward.ops : CUDNN_BATCHNORM_OPS_BN;
  const bool fused = fused_ops || (!a.relu && !a.has_z);
  const cudnnHandle_t handle = cudnn_handle(stream);
  size_t workspace_bytes = 0;
  cudnnStatus_t status = ex_backward_workspace(handle, mode, ops, a, d, &workspace_bytes);
  workspace_bytes = std::max(workspace_bytes, kMinWorkspace);
  const bool masks = !fused && a.relu && !a.has_z;
  if (status == CUDNN_STATUS_SUCCESS && !WorkspacePool::current().within_limit(workspace_part_bytes(workspace_bytes))) {
    *why_not = "workspace over the limit";
    return false;
  }
  std::string detail;
  if (status == CUDNN_STATUS_SUCCESS) {
    const BackwardScratch scratch = carve_scratch(a, workspace_bytes, masks, stream);
    const TensorView grad = fused ? a.dy : unfused_epilogue_grad(a, scratch.masked_dy, stream, &detail);
    status = ex_backward(handle, mode, ops, a, grad, scratch.workspace, scratch.workspace_bytes, d);
  }
  if (status != CUDNN_STATUS_SUCCESS) {
    if (!is_refusal(status)) throw_cudnn_error(status, "cudnnBatchNormalizationBackwardEx", __FILE__, __LINE__);
    remember_refusal(false, dtype, d, a.has_z, ops, status);
    *why_not = "cuDNN refused the *Ex backward (" + cudnn_status_name(status) + ")";
    return false;
  }
  detail += std::string("cudnnBatchNormalizationBackwardEx(") + ops_name(ops) + ")";
  if (a.accumulate) detail += " (accumulating dgamma, dbeta)";
  if (!fused) {
    const std::string why =
        decision.why_not.empty() ? "the forward left the add and ReLU to the elementwise kernels" : decision.why_not;
    detail += " (unfused: " + why + ")";
  }
  t_last_path = {"backward", fused, true, mode_name(mode), detail};
  return true;
}

}  // namespace

void batch_norm_backward(const BatchNormBackwardArgs& a, cudaStream_t stream) {
  const WorkspaceOrder order(stream);  // its workspace and scratch are the shared pool's
  const std::array<int, 4> d = nchw_dims(a.x, a.layout);
  const cudnnBatchNormMode_t mode = preferred_mode(a.layout);
  std::string why_not;
  if (try_ex_backward(a, d, mode, stream, &why_not)) return;
  // The plain call: the masking kernels, then cudnnBatchNormalizationBackward.
  const BackwardScratch scratch = carve_scratch(a, 0, /*need_masked_dy=*/a.relu && !a.has_z, stream);
  std::string detail;
  const TensorView grad = unfused_epilogue_grad(a, scratch.masked_dy, stream, &detail);
  const cudnnHandle_t handle = cudnn_handle(stream);
  const cudnnBatchNormMode_t ran =
      run_with_mode_fallback(mode, "cudnnBatchNormalizationBackward",
                             [&](cudnnBatchNormMode_t m) { return plain_backward(handle, m, a, grad, d); });
  detail += "cudnnBatchNormalizationBackward";
  if (a.accumulate) detail += " (accumulating dgamma, dbeta)";
  t_last_path = {"backward", false, false, mode_name(ran), detail + " (unfused: " + why_not + ")"};
}

BatchNormPath batch_norm_last_path() {
  return t_last_path;
}

}  // namespace rn
