#include "conv_dispatch.h"

#include <chrono>
#include <optional>
#include <string>

#include "../core/device.h"
#include "../core/error.h"
#include "../core/workspace.h"
#include "auto_engine.h"
#include "graph/graph_engine.h"
#include "legacy_descriptors.h"
#include "legacy_engine.h"

namespace rn {
namespace {

const std::string kFusedPath = "fused";

std::string describe_convolution(const void* data) {
  return "conv2d " + static_cast<const ConvParams*>(data)->to_string();
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

AlgoChoice choose_with_engine(const ConvParams& params, const ConvOperands& ops, bool allow_fusion,
                              cudnnHandle_t handle, cudaStream_t stream) {
  switch (static_cast<ConvEngineKind>(params.engine)) {
    case ConvEngineKind::Graph:
      return graph::choose(params, ops, handle, stream);
    case ConvEngineKind::Legacy:
      return legacy::choose(params, ops, handle, stream);
    case ConvEngineKind::Auto:
      break;
  }
  // 'auto': each engine chooses under its own key (counting its own finds), then both are timed.
  const AutoEngineCalls calls{
      [&](const ConvParams& p) { return convolution(p, ops, allow_fusion, stream); },
      [&](const ConvParams& p) { return cached_choice(p, ops, stream); },
  };
  return choose_auto(params, ops, calls, stream);
}

AlgoCache::Entry cached_or_chosen(const ConvParams& params, const ConvOperands& ops, bool allow_fusion,
                                  cudnnHandle_t handle, cudaStream_t stream) {
  AlgoCache& cache = AlgoCache::global();
  if (AlgoCache::Entry hit = cache.lookup(params)) return hit;

  const auto engine = static_cast<ConvEngineKind>(params.engine);
  const bool legacy = engine == ConvEngineKind::Legacy;
  ConvParams plain = params;
  plain.epilogue = kEpilogueNone;
  if (legacy && params.epilogue != kEpilogueNone) {
    // The legacy engine times the plain convolution for a fused key too: reuse a search already done.
    if (AlgoCache::Entry known = cache.peek(plain)) {
      AlgoChoice reused = *known;
      reused.fused_path.clear();
      return cache.insert(params, std::move(reused));
    }
  }
  if (static_cast<AlgoMode>(params.algo_mode) == AlgoMode::Find && stream_is_capturing(stream)) {
    throw ValueError(
        "algo='find' would search for an algorithm during CUDA-graph capture (it synchronises); "
        "run this convolution once before capturing, or load an algorithm cache: " +
        params.to_string());
  }
  const auto searching = std::chrono::steady_clock::now();
  AlgoChoice choice = choose_with_engine(params, ops, allow_fusion, handle, stream);
  choice.search_ms = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - searching).count();
  if (engine != ConvEngineKind::Auto && static_cast<AlgoMode>(choice.mode) == AlgoMode::Find) cache.count_find();
  if (legacy && params.epilogue != kEpilogueNone && !cache.peek(plain)) {
    AlgoChoice for_plain = choice;
    for_plain.fused_path.clear();
    cache.insert(plain, std::move(for_plain));
  }
  return cache.insert(params, std::move(choice));
}

}  // namespace

AlgoCache::Entry convolution(const ConvParams& params, const ConvOperands& ops, bool allow_fusion,
                             cudaStream_t stream) {
  OpContext context(&describe_convolution, &params);
  if (is_quantized(static_cast<Precision>(params.precision)) &&
      static_cast<ConvEngineKind>(params.engine) != ConvEngineKind::Graph) {
    throw ValueError("engine: int8 / fp8 convolutions run on the graph engine only (engine='graph')");
  }
  cudnnHandle_t handle = cudnn_handle(stream);
  const WorkspaceOrder order(stream);  // the search and the call may both use the shared workspace
  AlgoCache::Entry choice = cached_or_chosen(params, ops, allow_fusion, handle, stream);

  if (static_cast<ConvEngineKind>(choice->engine) == ConvEngineKind::Graph) {
    graph::run(params, *choice, ops, handle, stream);
    return choice;
  }
  const bool epilogue =
      static_cast<ConvDirection>(params.direction) == ConvDirection::Forward && params.epilogue != kEpilogueNone;
  if (!epilogue) {
    legacy::run(params, *choice, ops, handle, stream);
    return choice;
  }
  // Fusion disabled by the caller (not recorded), or cuDNN refused this key before: do not ask it again.
  // (No refusal string is built then: this runs on every call of such a key.)
  const bool try_fused = allow_fusion && !starts_with(choice->fused_path, "unfused");
  const std::optional<legacy::FusionRefusal> refusal =
      legacy::run_forward_epilogue(params, *choice, ops, try_fused, handle, stream);
  // Record what cuDNN decided, not a momentary lack of workspace memory.
  if (!try_fused || (refusal && !refusal->lasting)) return choice;
  const std::string& path = refusal ? refusal->reason : kFusedPath;
  if (path != choice->fused_path) {
    AlgoCache::global().set_fused_path(params, path);
    if (AlgoCache::Entry updated = AlgoCache::global().peek(params)) choice = updated;
  }
  return choice;
}

AlgoCache::Entry cached_choice(const ConvParams& params, const ConvOperands& ops, cudaStream_t stream) {
  OpContext context(&describe_convolution, &params);
  return cached_or_chosen(params, ops, true, cudnn_handle(stream), stream);
}

void drop_cached_descriptors() {
  legacy::clear_descriptor_cache();
  graph::clear_plans();
}

}  // namespace rn
