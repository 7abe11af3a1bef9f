#include "auto_engine.h"

#include <string>

#include "../core/cuda_event.h"
#include "../core/device.h"
#include "../core/error.h"

namespace rn {
namespace {

struct Contender {
  ConvEngineKind engine;
  AlgoCache::Entry choice;
  float ms = -1.0f;
  std::string error;  // why this engine cannot run the problem
  bool out_of_memory = false;
};

// One warm-up call (which chooses and caches on a miss), then kAutoRuns timed calls; the median in ms.
float time_calls(const ConvParams& params, const AutoEngineCalls& calls, cudaStream_t stream,
                 AlgoCache::Entry* choice) {
  *choice = calls.run(params);
  return *median_time_ms(stream, kAutoRuns, [&] {
    calls.run(params);
    return true;
  });
}

void evaluate(Contender& c, const ConvParams& auto_params, const ConvOperands& ops, const AutoEngineCalls& calls,
              cudaStream_t stream) {
  ConvParams params = auto_params;
  params.engine = static_cast<uint8_t>(c.engine);
  try {
    if (ops.beta != 0.0f) {
      // Repeated runs would add into the output each time: use the search's own time (if it timed).
      c.choice = calls.choose(params);
      c.ms = c.choice->time_ms;
    } else {
      c.ms = time_calls(params, calls, stream, &c.choice);
    }
  } catch (const CudnnError& e) {
    c.error = e.what();
  } catch (const ValueError& e) {
    c.error = e.what();
  } catch (const CudaError& e) {
    // Out of memory is not sticky (the pool cleared it): the other engine may still fit. Any other CUDA
    // error may be, and must propagate.
    if (e.code != cudaErrorMemoryAllocation) throw;
    c.error = e.what();
    c.out_of_memory = true;
  }
}

}  // namespace

AlgoChoice choose_auto(const ConvParams& params, const ConvOperands& ops, const AutoEngineCalls& calls,
                       cudaStream_t stream) {
  if (stream_is_capturing(stream)) {
    throw ValueError(
        "engine='auto' would time both engines during CUDA-graph capture (it synchronises); run this "
        "convolution once before capturing, or load an algorithm cache: " +
        params.to_string());
  }
  Contender legacy{ConvEngineKind::Legacy, nullptr};
  Contender graph{ConvEngineKind::Graph, nullptr};
  evaluate(legacy, params, ops, calls, stream);
  evaluate(graph, params, ops, calls, stream);
  if (!legacy.choice && !graph.choice) {
    if (legacy.out_of_memory || graph.out_of_memory) {
      throw CudaError(cudaErrorMemoryAllocation, "engine='auto': out of memory for " + params.to_string() +
                                                     ": legacy: " + legacy.error + "; graph: " + graph.error);
    }
    throw CudnnError(CUDNN_STATUS_NOT_SUPPORTED, "engine='auto': neither engine can run " + params.to_string() +
                                                     ": legacy: " + legacy.error + "; graph: " + graph.error);
  }
  const Contender* winner = nullptr;
  if (!legacy.choice || !graph.choice) {
    winner = legacy.choice ? &legacy : &graph;
  } else if (legacy.ms >= 0.0f && graph.ms >= 0.0f) {
    winner = graph.ms < legacy.ms ? &graph : &legacy;
  } else {
    // Untimed (an accumulating call outside algo='find'): the graph API reaches cuDNN's newer engines, which
    // the legacy API's fixed algorithm list does not include, so it is the better default.
    winner = &graph;
  }
  AlgoChoice choice = *winner->choice;
  choice.time_ms = winner->ms;
  return choice;
}

}  // namespace rn
