// Engine configurations and execution plans for a finalized operation graph: what heuristics propose, what an
// engine config says about itself (global engine index, numerical notes, knob choices), how to rebuild a config
// from (engine index, knob choices) alone — the form stored in the algorithm cache file — and execution plans.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../../core/descriptor.h"
#include "conv_op_graph.h"

namespace rn::graph {

using KnobChoices = std::vector<std::pair<int64_t, int64_t>>;  // (cudnnBackendKnobType_t, value)

// "type=value;type=value" with the numeric knob type (stable across cuDNN versions); "" for no knobs.
std::string format_knobs(const KnobChoices& knobs);
// Inverse of format_knobs; throws rn::ValueError on malformed text.
KnobChoices parse_knobs(const std::string& text);

struct EngineInfo {
  int64_t engine_id = -1;  // CUDNN_ATTR_ENGINE_GLOBAL_INDEX
  uint32_t notes = 0;      // bit (1 << cudnnBackendNumericalNote_t) per numerical note
  KnobChoices knobs;       // as chosen by the config
};

// Engine configs proposed by heuristics `mode` for the finalized graph, best first (possibly none).
std::vector<BackendDescriptor> heuristic_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode);

// Reads the engine index, numerical notes and knob choices of a (finalized) engine config.
EngineInfo inspect_config(cudnnBackendDescriptor_t config);

// Numerical notes of engine `engine_id` on `graph` (finalizes a throwaway engine descriptor).
uint32_t engine_notes(cudnnBackendDescriptor_t graph, int64_t engine_id);

// An engine config rebuilt from its engine index and knob choices. `parts` holds the engine and knob choice
// descriptors that `config` refers to; they live as long as the config.
struct BuiltConfig {
  std::vector<BackendDescriptor> parts;
  std::unique_ptr<BackendDescriptor> config;
};
BuiltConfig build_config(cudnnBackendDescriptor_t graph, int64_t engine_id, const KnobChoices& knobs);

// A finalized execution plan for `config` (throws CudnnError when the engine cannot run the graph).
BackendDescriptor make_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t config);
int64_t plan_workspace(cudnnBackendDescriptor_t plan);

}  // namespace rn::graph
