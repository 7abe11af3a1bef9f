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
std::atomic<bool> g_fuse_bf16{true};

// (problem, ops) pairs cuDNN refused in a *Ex call -> status name.
using RefusalKey = std::tuple<ProblemKey, int>;
std::mutex g_refusals_mutex;
std::map<RefusalKey, std::string>& refusals() {
  static auto* map = new std::map<RefusalKey, std::string>();
  return *map;
}

// What the last training forward into each reserve buffer ran, and for which problem. The fused backward reads
// the ReLU mask cuDNN left in the reserve, so it may run only after a fused forward of the same problem into
// that same buffer; the backward follows the forward's record, and without one takes the plain call (which needs
// only y, and is correct after either forward path).
struct ReserveRecord {
  ProblemKey problem;
  ForwardRecord forward;
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

namespace {
// Why cuDNN refused (problem, ops) before, or "".
std::string refused(bool forward, DType dtype, const std::array<int, 4>& d, bool has_z, cudnnBatchNormOps_t ops) {
  std::lock_guard<std::mutex> lock(g_refusals_mutex);
  const auto it = refusals().find({problem_key(forward, dtype, d, has_z), static_cast<int>(ops)});
  return it == refusals().end() ? "" : it->second;
}
}  // namespace

Fusion decide_fusion(bool forward, Layout layout, DType dtype, const std::array<int, 4>& d, bool relu, bool has_z,
                     cudnnBatchNormMode_t mode) {
  Fusion f;
  if (mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT) {
    f.why_not = "spatial mode";
  } else if (layout != Layout::NHWC) {
    f.why_not = "NCHW layout";
  } else if (const std::string status = refused(forward, dtype, d, has_z, CUDNN_BATCHNORM_OPS_BN); !status.empty()) {
    f.why_not = "cuDNN refused this shape (" + status + ")";
  }
  f.ex = f.why_not.empty();
  if (!f.ex) return f;
  if (!relu && !has_z) {
    f.fused = true;  // bn(x) is the whole op
    return f;
  }
  const cudnnBatchNormOps_t ops = has_z ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  if (!relu) {
    f.why_not = "an add without ReLU (cuDNN has no BN_ADD op)";
  } else if (dtype == DType::F32) {
    f.why_not = "fp32 activations (cuDNN's fused ops are for half precision)";
  } else if (dtype == DType::BF16 && !g_fuse_bf16.load()) {
    f.why_not = "bf16 fusion disabled";
  } else if (d[1] % 4 != 0) {
    f.why_not = "C not a multiple of 4";
  } else if (const std::string status = refused(forward, dtype, d, has_z, ops); !status.empty()) {
    f.why_not = "cuDNN refused the fused ops for this shape (" + status + ")";
  }
  f.fused = f.why_not.empty();
  if (f.fused) f.ops = ops;
  return f;
}

void record_forward(const TensorView& reserve, const ProblemKey& problem, ForwardRecord record) {
  if (!reserve.defined()) return;
  std::lock_guard<std::mutex> lock(g_refusals_mutex);
  auto& records = reserve_records();
  if (records.size() >= kMaxReserveRecords) records.clear();
  records[reserve.data] = {problem, record};
}

ForwardRecord forward_record(const TensorView& reserve, const ProblemKey& problem) {
  if (!reserve.defined()) return {};
  std::lock_guard<std::mutex> lock(g_refusals_mutex);
  const auto it = reserve_records().find(reserve.data);
  if (it == reserve_records().end() || it->second.problem != problem) return {};
  return it->second.forward;
}

void remember_refusal(bool forward, DType dtype, const std::array<int, 4>& d, bool has_z, cudnnBatchNormOps_t ops,
                      cudnnStatus_t status) {
  std::lock_guard<std::mutex> lock(g_refusals_mutex);
  refusals()[{problem_key(forward, dtype, d, has_z), static_cast<int>(ops)}] = cudnn_status_name(status);
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
