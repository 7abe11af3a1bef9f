#include "run.h"

#include <array>
#include <atomic>

#include "../core/device.h"
#include "../core/error.h"
#include "../core/workspace.h"

namespace rn::ownconv {
namespace {

// major * 10 + minor of the current device, queried once per device.
int compute_capability() {
  static std::array<std::atomic<int>, 64> cached{};  // 0: not queried yet
  const int device = current_device();
  const bool cacheable = device >= 0 && device < static_cast<int>(cached.size());
  int cc = cacheable ? cached[device].load(std::memory_order_relaxed) : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    RN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    RN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cc = major * 10 + minor;
    if (cacheable) cached[device].store(cc, std::memory_order_relaxed);
  }
  return cc;
}

}  // namespace

std::string device_mismatch(const ConvKernel& kernel) {
  const int cc = compute_capability();
  if (cc == kernel.info().sm) return "";
  return kernel.info().name + " is compiled for sm_" + std::to_string(kernel.info().sm) + "a only; this GPU is sm_" +
         std::to_string(cc);
}

void run(const ConvKernel& kernel, const ConvProblem& problem, const ConvOperands& operands,
         const EpilogueArgs& epilogue, cudaStream_t stream) {
  const std::string mismatch = device_mismatch(kernel);
  if (!mismatch.empty()) throw ValueError(mismatch + " (use the cuDNN path)");
  const size_t bytes = kernel.workspace_bytes(problem);
  if (bytes == 0) {
    kernel.launch(problem, operands, epilogue, nullptr, stream);
    return;
  }
  const WorkspaceOrder order(stream);  // the shared buffer's users on other streams finish first
  void* workspace = WorkspacePool::current().get_required(bytes, stream);
  kernel.launch(problem, operands, epilogue, workspace, stream);
}

}  // namespace rn::ownconv
