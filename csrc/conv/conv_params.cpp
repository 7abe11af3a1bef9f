#include "conv_params.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "../core/error.h"

namespace rn {
namespace {

constexpr const char* kKeyVersion = "conv2d.v1";

const char* precision_key_name(uint8_t p) {
  return p <= static_cast<uint8_t>(Precision::FP8) ? precision_name(static_cast<Precision>(p)) : "invalid";
}

const char* out_dtype_key_name(uint8_t out_dtype) {
  for (DType t : kQuantizedOutDtypes) {
    if (out_dtype == out_dtype_code(t)) return dtype_short_name(t);
  }
  return "invalid";
}

const char* layout_key_name(uint8_t l) {
  return l <= static_cast<uint8_t>(Layout::NHWC) ? layout_name(static_cast<Layout>(l)) : "invalid";
}

std::string join(const int32_t* values, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(values[i]);
  return s;
}

[[noreturn]] void malformed(const std::string& text, const std::string& why) {
  throw ValueError("malformed convolution key (" + why + "): '" + text + "'");
}

// The field parsers throw ValueError saying what is wrong with `value`; from_string names the field and the key.
int64_t parse_int(const std::string& value, int64_t lo, int64_t hi) {
  if (value.empty()) throw ValueError("empty number");
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) throw ValueError("bad number '" + value + "'");
  return v;
}

void parse_ints(const std::string& value, int32_t* out, int n) {
  std::vector<std::string> parts;
  std::stringstream ss(value);
  std::string part;
  while (std::getline(ss, part, ',')) parts.push_back(part);
  if (static_cast<int>(parts.size()) != n || (!value.empty() && value.back() == ',')) {
    throw ValueError("expected " + std::to_string(n) + " comma-separated numbers, got '" + value + "'");
  }
  for (int i = 0; i < n; ++i) out[i] = static_cast<int32_t>(parse_int(parts[i], INT32_MIN, INT32_MAX));
}

uint64_t parse_workspace_cap(const std::string& value) {
  if (value == "none") return UINT64_MAX;
  if (value.empty() || value[0] == '-') throw ValueError("bad workspace cap '" + value + "'");
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v == UINT64_MAX) throw ValueError("bad workspace cap '" + value + "'");
  return v;
}

constexpr const char* kKeys[] = {"dir", "dev", "prec", "layout", "engine", "epi", "det",    "mode", "fixed",
                                 "x",   "w",   "y",    "pad",    "stride", "dil", "groups", "ws"};
constexpr int kNumKeys = sizeof(kKeys) / sizeof(kKeys[0]);

// Field `i` of kKeys into `p`.
void parse_field(ConvParams& p, int i, const std::string& v) {
  switch (i) {
    case 0:
      p.direction = static_cast<uint8_t>(parse_direction(v));
      return;
    case 1:
      p.device = static_cast<int32_t>(parse_int(v, 0, INT32_MAX));
      return;
    case 2:
      p.precision = static_cast<uint8_t>(parse_precision(v));
      return;
    case 3:
      p.layout = static_cast<uint8_t>(parse_layout(v));
      return;
    case 4:
      p.engine = static_cast<uint8_t>(parse_engine(v));
      return;
    case 5:
      p.epilogue = parse_epilogue(v);
      return;
    case 6:
      p.deterministic = static_cast<uint8_t>(parse_int(v, 0, 1));
      return;
    case 7:
      p.algo_mode = static_cast<uint8_t>(parse_algo_mode(v));
      return;
    case 8:
      p.fixed_algo = static_cast<int32_t>(parse_int(v, INT32_MIN, INT32_MAX));
      return;
    case 9:
      parse_ints(v, p.x, 4);
      return;
    case 10:
      parse_ints(v, p.w, 4);
      return;
    case 11:
      parse_ints(v, p.y, 4);
      return;
    case 12:
      parse_ints(v, p.pad, 2);
      return;
    case 13:
      parse_ints(v, p.stride, 2);
      return;
    case 14:
      parse_ints(v, p.dilation, 2);
      return;
    case 15:
      p.groups = static_cast<int32_t>(parse_int(v, INT32_MIN, INT32_MAX));
      return;
    default:
      p.workspace_cap = parse_workspace_cap(v);
      return;
  }
}

}  // namespace

std::string ConvParams::to_string() const {
  std::string s = kKeyVersion;
  s += std::string(" dir=") + direction_key(static_cast<ConvDirection>(direction));
  s += " dev=" + std::to_string(device);
  s += std::string(" prec=") + precision_key_name(precision);
  s += std::string(" layout=") + layout_key_name(layout);
  s += std::string(" engine=") + engine_name(static_cast<ConvEngineKind>(engine));
  s += " epi=" + epilogue_name(epilogue);
  s += " det=" + std::to_string(deterministic);
  s += std::string(" mode=") + algo_mode_name(static_cast<AlgoMode>(algo_mode));
  s += " fixed=" + std::to_string(fixed_algo);
  s += " x=" + join(x, 4);
  s += " w=" + join(w, 4);
  s += " y=" + join(y, 4);
  s += " pad=" + join(pad, 2);
  s += " stride=" + join(stride, 2);
  s += " dil=" + join(dilation, 2);
  s += " groups=" + std::to_string(groups);
  s += " ws=" + (workspace_cap == UINT64_MAX ? std::string("none") : std::to_string(workspace_cap));
  if (out_dtype != 0) s += std::string(" out=") + out_dtype_key_name(out_dtype);
  return s;
}

ConvParams ConvParams::from_string(const std::string& text) {
  std::vector<std::string> tokens;
  std::stringstream ss(text);
  std::string token;
  while (ss >> token) tokens.push_back(token);
  const bool has_out = tokens.size() == kNumKeys + 2;  // the optional last field, out=<dtype of y>
  if ((tokens.size() != kNumKeys + 1 && !has_out) || tokens[0] != kKeyVersion) {
    malformed(text, std::string("expected '") + kKeyVersion + "' and " + std::to_string(kNumKeys) + " fields");
  }
  ConvParams p;
  for (int i = 0; i < kNumKeys; ++i) {
    const std::string& t = tokens[i + 1];
    const std::string prefix = std::string(kKeys[i]) + "=";
    if (t.compare(0, prefix.size(), prefix) != 0) malformed(text, "expected field '" + prefix + "...'");
    try {
      parse_field(p, i, t.substr(prefix.size()));
    } catch (const ValueError& e) {
      malformed(text, "field '" + std::string(kKeys[i]) + "': " + e.what());
    }
  }
  if (has_out) {
    const std::string& t = tokens.back();
    for (DType d : kQuantizedOutDtypes) {
      if (t == std::string("out=") + dtype_short_name(d)) p.out_dtype = out_dtype_code(d);
    }
    if (p.out_dtype == 0) malformed(text, "field 'out': expected int8, fp8, fp16 or fp32, got '" + t + "'");
  }
  return p;
}

}  // namespace rn
