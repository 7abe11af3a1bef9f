// engine='auto': decides per problem between the legacy and the graph engine by timing both once.
//
// Each engine chooses under its own key (ConvParams::engine = Legacy / Graph), so both choices are cached, stay
// valid and are saved to the cache file; the winner's choice is what the dispatcher stores under the auto key.
// The dispatcher hands in the two calls this needs (conv_dispatch.cpp): this file does not call back into it.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

#include "algo_cache.h"
#include "conv_params.h"

namespace rn {

// What choose_auto may do with one engine's key (params.engine is Legacy or Graph).
struct AutoEngineCalls {
  // Runs the convolution on the call's operands (choosing and caching on a miss); returns the choice it used.
  std::function<AlgoCache::Entry(const ConvParams&)> run;
  // The cached choice, chosen and cached on a miss, without running the convolution.
  std::function<AlgoCache::Entry(const ConvParams&)> choose;
};

// Runs the call on each engine (one warm-up that also searches on a cache miss, then kAutoRuns timed runs,
// median) and returns the faster engine's choice with time_ms set to its median. An engine that cannot run
// the problem loses; when both fail, the legacy engine's error is raised.
// A call that accumulates into its output (ops.beta != 0) is not run repeatedly: the engines' own search
// times decide when both exist (algo='find'), else the graph engine is preferred.
// Throws ValueError during CUDA-graph capture (timing synchronises).
AlgoChoice choose_auto(const ConvParams& params, const ConvOperands& ops, const AutoEngineCalls& calls,
                       cudaStream_t stream);

constexpr int kAutoRuns = 3;

}  // namespace rn
