// Launching a selected kernel (select.h) on the current device, as every op of the package does: on the caller's
// stream, no allocation and no synchronisation (workspace, if a kernel ever needs any, from the device's pool),
// every CUDA status checked.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "own_conv.h"

namespace rn::ownconv {

// "" when the current device can run `kernel`'s code (its compute capability is the kernel's sm: sm_90a SASS
// runs on 9.0 only), else why not. Throws NoDeviceError without a GPU.
std::string device_mismatch(const ConvKernel& kernel);

// Runs `kernel` on `stream`; ValueError when the device cannot run it (device_mismatch) or the problem is
// outside the kernel's limits.
void run(const ConvKernel& kernel, const ConvProblem& problem, const ConvOperands& operands,
         const EpilogueArgs& epilogue, cudaStream_t stream);

}  // namespace rn::ownconv
