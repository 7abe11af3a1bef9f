#include "conv_names.h"

#include "../core/error.h"

namespace rn {
namespace {

template <class Enum, size_t N>
const char* name_in(const EnumName<Enum> (&table)[N], Enum value) {
  for (const EnumName<Enum>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "invalid";
}

template <class Enum, size_t N>
Enum parse_in(const EnumName<Enum> (&table)[N], const std::string& name, const char* what) {
  std::string expected;
  for (const EnumName<Enum>& entry : table) {
    if (name == entry.name) return entry.value;
    expected += std::string(expected.empty() ? "'" : ", '") + entry.name + "'";
  }
  throw ValueError(std::string(what) + ": expected one of " + expected + ", got '" + name + "'");
}

const DirectionNames* direction_entry(ConvDirection d) {
  for (const DirectionNames& entry : kDirectionNames) {
    if (entry.value == d) return &entry;
  }
  return nullptr;
}

}  // namespace

const char* direction_key(ConvDirection d) {
  const DirectionNames* entry = direction_entry(d);
  return entry ? entry->key : "invalid";
}

const char* direction_label(ConvDirection d) {
  const DirectionNames* entry = direction_entry(d);
  return entry ? entry->label : "invalid";
}

const char* engine_name(ConvEngineKind e) {
  return name_in(kEngineNames, e);
}

const char* algo_mode_name(AlgoMode m) {
  return name_in(kAlgoModeNames, m);
}

std::string epilogue_name(uint8_t flags) {
  if (flags == kEpilogueNone) return "none";
  std::string s;
  for (const auto& part : kEpiloguePartNames) {
    if (flags & part.value) s += std::string(s.empty() ? "" : "+") + part.name;
  }
  if (flags & ~kEpilogueAll) s += std::string(s.empty() ? "" : "+") + "invalid";
  return s;
}

ConvDirection parse_direction(const std::string& name) {
  for (const DirectionNames& entry : kDirectionNames) {
    if (name == entry.name || name == entry.key) return entry.value;
  }
  throw ValueError("direction: expected 'forward', 'backward_data' or 'backward_filter', got '" + name + "'");
}

ConvEngineKind parse_engine(const std::string& name) {
  return parse_in(kEngineNames, name, "engine");
}

AlgoMode parse_algo_mode(const std::string& name) {
  return parse_in(kAlgoModeNames, name, "algo mode");
}

uint8_t parse_epilogue(const std::string& name) {
  if (name == "none" || name.empty()) return kEpilogueNone;
  uint8_t flags = 0;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('+', start);
    if (end == std::string::npos) end = name.size();
    const std::string part = name.substr(start, end - start);
    uint8_t bit = 0;
    for (const auto& entry : kEpiloguePartNames) {
      if (part == entry.name) bit = entry.value;
    }
    if (bit == 0 || (flags & bit)) {
      throw ValueError("epilogue: " + std::string(bit ? "repeated" : "unknown") + " part '" + part + "' in '" + name +
                       "' (expected 'none' or a '+'-joined set of 'scale', 'bias', 'residual', 'relu')");
    }
    flags |= bit;
    start = end + 1;
  }
  return flags;
}

}  // namespace rn
