#include "batch_norm_path.h"

#include <atomic>
#include <map>
#include <mutex>

#include "../core/error.h"
#include "batch_norm.h"

namespace rn {
namespace bn_path {
namespace {

std::atomic<int> g_mode_policy{static_cast<int>(BatchNormModePolicy::Auto)};
std::atomic<bool> g_fuse_bf16{false};

// Shapes for which cuDNN refused a fused call -> status name.
std::mutex g_refusals_mutex;
std::map<ProblemKey, std::string>& refusals() {
  static auto* map = new std::map<ProblemKey, std::string>();
  return *map;
}

// Which reserve buffers were last filled by a fused forward call, and for which problem. The fused backward
// reads the ReLU mask cuDNN left in the reserve, so it may run only after a fused forward of the same problem
// into that same buffer; anything else (a refusal, a policy change, a buffer reused) takes the unfused backward,
// which needs only y.
struct ReserveRecord {
  ProblemKey problem;
  bool fused;
};
std::map<const void*, ReserveRecord>& reserve_records() {
  static auto* map = new std::map<const void*, ReserveRecord>();
  return *map;
}
constexpr size_t kMaxReserveRecords = 1 << 14;  // a few per BN layer; cleared wholesale past this

}  // namespace

ProblemKey problem_key(bool forward, DType dtype, const std::array<int, 4>& d, bool has_z) {
  return {forward, static_cast<int>(dtype), d[0], d[1], d[2], d[3], has_z};
}

// cuDNN 9 groups statuses by thousands: 2xxx bad parameter, 3xxx not supported. A bad-parameter status counts
// too: the fused ops and the persistent mode are documented for narrow sets of configurations, and the plain
// spatial call (which reports a real argument error) runs next anyway.
bool is_refusal(cudnnStatus_t status) {
  const int group = static_cast<int>(status) / 1000;
  return group == 2 || group == 3;
}

const char* mode_name(cudnnBatchNormMode_t mode) {
  return mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT ? "persistent" : "spatial";
}

const char* ops_name(cudnnBatchNormOps_t ops) {
  switch (ops) {
    case CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION:
      return "BN_ADD_ACTIVATION";
    case CUDNN_BATCHNORM_OPS_BN_ACTIVATION:
      return "BN_ACTIVATION";
    default:
      return "BN";
  }
}

cudnnBatchNormMode_t preferred_mode(Layout layout) {
  switch (static_cast<BatchNormModePolicy>(g_mode_policy.load())) {
    case BatchNormModePolicy::Persistent:
      return CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
    case BatchNormModePolicy::Spatial:
      return CUDNN_BATCHNORM_SPATIAL;
    case BatchNormModePolicy::Auto:
      break;
  }
  return layout == Layout::NHWC ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : CUDNN_BATCHNORM_SPATIAL;
}

Fusion decide_fusion(bool forward, Layout layout, DType dtype, const std::array<int, 4>& d, bool relu, bool has_z,
                     cudnnBatchNormMode_t mode) {
  Fusion f;
  if (!relu && has_z) {
    f.why_not = "an add without ReLU (cuDNN has no BN_ADD op)";
  } else if (mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT) {
    f.why_not = "spatial mode";
  } else if (layout != Layout::NHWC) {
    f.why_not = "NCHW layout";
  } else if (dtype == DType::F32) {
    f.why_not = "fp32 activations";
  } else if (dtype == DType::BF16 && !g_fuse_bf16.load()) {
    f.why_not = "bf16 fusion disabled (cuDNN documents fp16)";
  } else if (d[1] % 4 != 0) {
    f.why_not = "C not a multiple of 4";
  } else {
    std::lock_guard<std::mutex> lock(g_refusals_mutex);
    const auto it = refusals().find(problem_key(forward, dtype, d, has_z));
    if (it != refusals().end()) f.why_not = "cuDNN refused this shape (" + it->second + ")";
  }
  f.fused = f.why_not.empty();
  f.ops = !relu   ? CUDNN_BATCHNORM_OPS_BN
          : has_z ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                  : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  return f;
}

void record_forward(const TensorView& reserve, const ProblemKey& problem, bool fused) {
  if (!reserve.defined()) return;
  std::lock_guard<std::mutex> lock(g_refusals_mutex);
  auto& records = reserve_records();
  if (records.size() >= kMaxReserveRecords) records.clear();
  records[reserve.data] = {problem, fused};
}

bool filled_by_fused_forward(const TensorView& reserve, const ProblemKey& problem) {
  if (!reserve.defined()) return false;
  std::lock_guard<std::mutex> lock(g_refusals_mutex);
  const auto it = reserve_records().find(reserve.data);
  return it != reserve_records().end() && it->second.fused && it->second.problem == problem;
}

void remember_refusal(bool forward, DType dtype, const std::array<int, 4>& d, bool has_z, cudnnStatus_t status) {
  std::lock_guard<std::mutex> lock(g_refusals_mutex);
  refusals()[problem_key(forward, dtype, d, has_z)] = cudnn_status_name(status);
}

}  // namespace bn_path

void set_batch_norm_mode_policy(BatchNormModePolicy policy) {
  bn_path::g_mode_policy.store(static_cast<int>(policy));
}
BatchNormModePolicy batch_norm_mode_policy() {
  return static_cast<BatchNormModePolicy>(bn_path::g_mode_policy.load());
}
void set_batch_norm_fuse_bf16(bool enabled) {
  bn_path::g_fuse_bf16.store(enabled);
}
bool batch_norm_fuse_bf16() {
  return bn_path::g_fuse_bf16.load();
}

void clear_batch_norm_refusals() {
  std::lock_guard<std::mutex> lock(bn_path::g_refusals_mutex);
  bn_path::refusals().clear();
}

}  // namespace rn
