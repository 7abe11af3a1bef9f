#include "live_counts.h"

#include <array>

namespace rn {
namespace {

std::array<std::atomic<int64_t>, kNumKinds> g_live{};
std::array<std::atomic<bool>, kNumKinds> g_seen{};

const char* backend_type_name(int type) {
  switch (static_cast<cudnnBackendDescriptorType_t>(type)) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      return "backend.POINTWISE";
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      return "backend.CONVOLUTION";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      return "backend.ENGINE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      return "backend.ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return "backend.ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      return "backend.EXECUTION_PLAN";
    case CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR:
      return "backend.INTERMEDIATE_INFO";
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR:
      return "backend.KNOB_CHOICE";
    case CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR:
      return "backend.KNOB_INFO";
    case CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR:
      return "backend.LAYOUT_INFO";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
      return "backend.OPERATION_CONVOLUTION_FORWARD";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      return "backend.OPERATION_CONVOLUTION_BACKWARD_FILTER";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
      return "backend.OPERATION_CONVOLUTION_BACKWARD_DATA";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
      return "backend.OPERATION_POINTWISE";
    case CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR:
      return "backend.OPERATION_GEN_STATS";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      return "backend.OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      return "backend.VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      return "backend.TENSOR";
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
      return "backend.MATMUL";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
      return "backend.OPERATION_MATMUL";
    case CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR:
      return "backend.OPERATION_BN_FINALIZE_STATISTICS";
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
      return "backend.REDUCTION";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
      return "backend.OPERATION_REDUCTION";
    case CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR:
      return "backend.OPERATION_BN_BWD_WEIGHTS";
    case CUDNN_BACKEND_RESAMPLE_DESCRIPTOR:
      return "backend.RESAMPLE";
    case CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR:
      return "backend.OPERATION_NORM_FORWARD";
    case CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR:
      return "backend.OPERATION_NORM_BACKWARD";
    default:
      return nullptr;
  }
}

}  // namespace

std::atomic<int64_t>& live_counter(int kind) {
  g_seen[kind].store(true, std::memory_order_relaxed);
  return g_live[kind];
}

const char* descriptor_kind_name(int kind) {
  switch (kind) {
    case kHandle:
      return "handle";
    case kTensor:
      return "tensor";
    case kFilter:
      return "filter";
    case kConvolution:
      return "convolution";
    case kActivation:
      return "activation";
    case kPooling:
      return "pooling";
    default:
      break;
  }
  if (kind >= kBackendBase && kind < kNumKinds) {
    const char* name = backend_type_name(kind - kBackendBase);
    return name ? name : "backend.OTHER";
  }
  return "unknown";
}

std::map<std::string, int64_t> live_descriptor_counts() {
  std::map<std::string, int64_t> counts;
  for (int kind = 0; kind < kNumKinds; ++kind) {
    if (g_seen[kind].load(std::memory_order_relaxed)) counts[descriptor_kind_name(kind)] += g_live[kind].load();
  }
  return counts;
}

}  // namespace rn
