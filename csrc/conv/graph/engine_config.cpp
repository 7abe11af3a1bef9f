#include "engine_config.h"

#include <cstdlib>

#include "../../core/error.h"
#include "backend_attr.h"

namespace rn::graph {
namespace {

// Room for every numerical note and knob type: the header's counts only grow between releases, so the counts
// compiled in cover the (same or older) library loaded at run time.
constexpr int kMaxNotes = CUDNN_NUMERICAL_NOTE_TYPE_COUNT;
constexpr int kMaxKnobs = CUDNN_KNOB_TYPE_COUNTS;

// Copies the engine a config refers to into a new (counted) engine descriptor.
BackendDescriptor engine_of(cudnnBackendDescriptor_t config) {
  BackendDescriptor engine = make_backend(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t count = 0;
  RN_CUDNN_CHECK(
      cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &raw));
  return engine;
}

// `count` new descriptors of `type`, and their raw handles in `raw` (for a get-attribute call to fill).
std::vector<BackendDescriptor> make_backends(cudnnBackendDescriptorType_t type, int64_t count,
                                             std::vector<cudnnBackendDescriptor_t>& raw) {
  std::vector<BackendDescriptor> descriptors;
  descriptors.reserve(count);
  raw.clear();
  for (int64_t i = 0; i < count; ++i) {
    descriptors.push_back(make_backend(type));
    raw.push_back(descriptors.back().get());
  }
  return descriptors;
}

// The finalized engine `engine_id` of `graph`.
BackendDescriptor make_engine(cudnnBackendDescriptor_t graph, int64_t engine_id) {
  BackendDescriptor engine = make_backend(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  set_descriptor(engine.get(), CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
  set_int64(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, engine_id);
  finalize(engine.get());
  return engine;
}

uint32_t notes_of(cudnnBackendDescriptor_t engine) {
  cudnnBackendNumericalNote_t notes[kMaxNotes];
  int64_t count = 0;
  RN_CUDNN_CHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                          kMaxNotes, &count, notes));
  uint32_t bits = 0;
  for (int64_t i = 0; i < count && i < kMaxNotes; ++i) {
    const int note = static_cast<int>(notes[i]);
    if (note >= 0 && note < 32) bits |= 1u << note;
  }
  return bits;
}

}  // namespace

std::string format_knobs(const KnobChoices& knobs) {
  std::string s;
  for (const auto& [type, value] : knobs) {
    if (!s.empty()) s += ';';
    s += std::to_string(type) + '=' + std::to_string(value);
  }
  return s;
}

KnobChoices parse_knobs(const std::string& text) {
  KnobChoices knobs;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    const size_t eq = item.find('=');
    char* type_end = nullptr;
    char* value_end = nullptr;
    const long long type = eq == std::string::npos ? 0 : std::strtoll(item.c_str(), &type_end, 10);
    const long long value = eq == std::string::npos ? 0 : std::strtoll(item.c_str() + eq + 1, &value_end, 10);
    if (eq == std::string::npos || eq == 0 || type_end != item.c_str() + eq || eq + 1 == item.size() ||
        value_end != item.c_str() + item.size() || type < 0) {
      throw ValueError("knobs: malformed knob choice '" + item + "' in '" + text + "' (expected type=value;...)");
    }
    knobs.emplace_back(type, value);
    start = end + 1;
  }
  return knobs;
}

std::vector<BackendDescriptor> heuristic_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode) {
  BackendDescriptor heur = make_backend(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  set_descriptor(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  set_enum(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode);
  finalize(heur.get());

  int64_t available = 0;
  RN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                          &available, nullptr));
  std::vector<cudnnBackendDescriptor_t> raw;
  std::vector<BackendDescriptor> configs = make_backends(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, available, raw);
  if (available == 0) return configs;
  int64_t returned = 0;
  RN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          available, &returned, raw.data()));
  if (returned < available) configs.erase(configs.begin() + returned, configs.end());
  return configs;
}

EngineInfo inspect_config(cudnnBackendDescriptor_t config) {
  EngineInfo info;
  BackendDescriptor engine = engine_of(config);
  info.engine_id = get_int64(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
  info.notes = notes_of(engine.get());

  std::vector<cudnnBackendDescriptor_t> raw;
  const std::vector<BackendDescriptor> choices = make_backends(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, kMaxKnobs, raw);
  int64_t count = 0;
  RN_CUDNN_CHECK(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          kMaxKnobs, &count, raw.data()));
  for (int64_t i = 0; i < count && i < kMaxKnobs; ++i) {
    cudnnBackendKnobType_t type{};
    int64_t n = 0;
    RN_CUDNN_CHECK(
        cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type));
    const int64_t value = get_int64(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE);
    info.knobs.emplace_back(static_cast<int64_t>(type), value);
  }
  return info;
}

uint32_t engine_notes(cudnnBackendDescriptor_t graph, int64_t engine_id) {
  return notes_of(make_engine(graph, engine_id).get());
}

BuiltConfig build_config(cudnnBackendDescriptor_t graph, int64_t engine_id, const KnobChoices& knobs) {
  BuiltConfig built;
  BackendDescriptor engine = make_engine(graph, engine_id);
  const cudnnBackendDescriptor_t engine_raw = engine.get();
  built.parts.push_back(std::move(engine));

  std::vector<cudnnBackendDescriptor_t> choices;
  for (const auto& [type, value] : knobs) {
    BackendDescriptor choice = make_backend(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    set_enum(choice.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE,
             static_cast<cudnnBackendKnobType_t>(type));
    set_int64(choice.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, value);
    finalize(choice.get());
    choices.push_back(choice.get());
    built.parts.push_back(std::move(choice));
  }

  auto config = std::make_unique<BackendDescriptor>(make_backend(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  set_descriptor(config->get(), CUDNN_ATTR_ENGINECFG_ENGINE, engine_raw);
  if (!choices.empty()) set_descriptors(config->get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, choices);
  finalize(config->get());
  built.config = std::move(config);
  return built;
}

BackendDescriptor make_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t config) {
  BackendDescriptor plan = make_backend(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set_handle(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
  set_descriptor(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  finalize(plan.get());
  return plan;
}

int64_t plan_workspace(cudnnBackendDescriptor_t plan) {
  return get_int64(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
}

}  // namespace rn::graph
