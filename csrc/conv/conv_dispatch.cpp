#include "conv_dispatch.h"

#include <optional>
#include <string>

#include "../core/device.h"
#include "../core/error.h"
#include "graph_engine.h"
#ifdef RN_HAVE_GRAPH_ENGINE
#include "graph/auto_engine.h"
#endif
#include "legacy_descriptors.h"
#include "legacy_engine.h"

namespace rn {
namespace {

std::string describe_convolution(const void* data) {
  return "conv2d " + static_cast<const ConvParams*>(data)->to_string();
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

AlgoChoice choose_with_engine(const ConvParams& params, const ConvOperands& ops, cudnnHandle_t handle,
                              cudaStream_t stream) {
  const AlgoMode mode = static_cast<AlgoMode>(params.algo_mode);
  if (static_cast<ConvEngineKind>(params.engine) == ConvEngineKind::Graph) {
#ifdef RN_HAVE_GRAPH_ENGINE
    return graph::choose(params, ops, mode, params.fixed_algo, handle, stream);
#else
    throw ValueError("engine: the graph engine is not compiled into this build");
#endif
  }
  return legacy::choose(params, ops, mode, params.fixed_algo, handle, stream);
}

AlgoCache::Entry cached_or_chosen(const ConvParams& params, const ConvOperands& ops, bool allow_fusion,
                                  cudnnHandle_t handle, cudaStream_t stream) {
  AlgoCache& cache = AlgoCache::global();
  if (AlgoCache::Entry hit = cache.lookup(params)) return hit;

  const bool legacy = static_cast<ConvEngineKind>(params.engine) == ConvEngineKind::Legacy;
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
#ifdef RN_HAVE_GRAPH_ENGINE
  // 'auto': each engine chooses under its own key (counting its own finds), then both are timed.
  const bool automatic = static_cast<ConvEngineKind>(params.engine) == ConvEngineKind::Auto;
  AlgoChoice choice = automatic ? graph::choose_auto(params, ops, allow_fusion, stream)
                                : choose_with_engine(params, ops, handle, stream);
  if (!automatic && static_cast<AlgoMode>(choice.mode) == AlgoMode::Find) cache.count_find();
#else
  (void)allow_fusion;
  AlgoChoice choice = choose_with_engine(params, ops, handle, stream);
  if (static_cast<AlgoMode>(choice.mode) == AlgoMode::Find) cache.count_find();
#endif
  if (legacy && params.epilogue != kEpilogueNone && !cache.peek(plain)) {
    AlgoChoice for_plain = choice;
    for_plain.fused_path.clear();
    cache.insert(plain, std::move(for_plain));
  }
  return cache.insert(params, std::move(choice));
}

}  // namespace

bool graph_engine_available() {
#ifdef RN_HAVE_GRAPH_ENGINE
  return true;
#else
  return false;
#endif
}

ConvEngineKind resolve_engine(ConvEngineKind requested) {
#ifdef RN_HAVE_GRAPH_ENGINE
  // 'auto' stays in the key: its entry is the winner of timing both engines (graph/auto_engine.h).
  return requested;
#else
  if (requested == ConvEngineKind::Graph) {
    throw ValueError("engine: 'graph' is not available, this build has only the legacy engine");
  }
  return ConvEngineKind::Legacy;
#endif
}

AlgoCache::Entry convolution(const ConvParams& params, const ConvOperands& ops, bool allow_fusion,
                             cudaStream_t stream) {
  OpContext context(&describe_convolution, &params);
  cudnnHandle_t handle = cudnn_handle(stream);
  AlgoCache::Entry choice = cached_or_chosen(params, ops, allow_fusion, handle, stream);

  if (static_cast<ConvEngineKind>(choice->engine) == ConvEngineKind::Graph) {
#ifdef RN_HAVE_GRAPH_ENGINE
    graph::run(params, *choice, ops, handle, stream);
    return choice;
#else
    throw ValueError("engine: a cached choice names the graph engine, which is not compiled into this build");
#endif
  }

  const bool epilogue =
      static_cast<ConvDirection>(params.direction) == ConvDirection::Forward && params.epilogue != kEpilogueNone;
  if (!epilogue) {
    legacy::run(params, *choice, ops, handle, stream);
    return choice;
  }
  if (!allow_fusion || starts_with(choice->fused_path, "unfused")) {
    // Fusion disabled by the caller (not recorded), or cuDNN refused this key before: do not ask it again.
    // (No refusal string is built here: this runs on every call of such a key.)
    legacy::run_forward_unfused(params, *choice, ops, handle, stream);
    return choice;
  }
  const std::optional<legacy::FusionRefusal> refusal = legacy::try_forward_fused(params, *choice, ops, handle, stream);
  if (refusal) legacy::run_forward_unfused(params, *choice, ops, handle, stream);
  // Record what cuDNN decided, not a momentary lack of workspace memory.
  if (refusal && !refusal->lasting) return choice;
  const std::string path = refusal ? refusal->reason : "fused";
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
#ifdef RN_HAVE_GRAPH_ENGINE
  graph::clear_plans();
#endif
}

}  // namespace rn
