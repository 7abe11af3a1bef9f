// The one entry point of every convolution: algorithm cache lookup (choose and insert on a miss), then the
// engine the choice names. The bindings build a complete ConvParams (device and workspace cap included) and
// validated operands; nothing here allocates device memory except the workspace pool on a cache miss.
#pragma once

#include <cuda_runtime_api.h>

#include "algo_cache.h"
#include "conv_params.h"

namespace rn {

// Runs one convolution (params.direction, with params.epilogue for Forward) and returns the cached choice it
// used. `allow_fusion` false runs a forward epilogue as separate calls without recording that in the cache
// (the benchmark's unfused variant). Algorithm search (AlgoMode::Find) on a miss is refused during CUDA-graph
// capture: it synchronises.
AlgoCache::Entry convolution(const ConvParams& params, const ConvOperands& ops, bool allow_fusion, cudaStream_t stream);

// The cached choice for `params`, chosen and cached on a miss, without running the convolution (engine='auto'
// uses it where running repeatedly would change the output).
AlgoCache::Entry cached_choice(const ConvParams& params, const ConvOperands& ops, cudaStream_t stream);

// Frees every cached cuDNN object of both engines (legacy descriptor groups, graph execution plans).
void drop_cached_descriptors();

}  // namespace rn
