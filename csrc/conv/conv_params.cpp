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

int64_t parse_int(const std::string& text, const std::string& value, int64_t lo, int64_t hi) {
  if (value.empty()) malformed(text, "empty number");
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) malformed(text, "bad number '" + value + "'");
  return v;
}

void parse_ints(const std::string& text, const std::string& value, int32_t* out, int n) {
  std::vector<std::string> parts;
  std::stringstream ss(value);
  std::string part;
  while (std::getline(ss, part, ',')) parts.push_back(part);
  if (static_cast<int>(parts.size()) != n || (!value.empty() && value.back() == ',')) {
    malformed(text, "expected " + std::to_string(n) + " comma-separated numbers, got '" + value + "'");
  }
  for (int i = 0; i < n; ++i) out[i] = static_cast<int32_t>(parse_int(text, parts[i], INT32_MIN, INT32_MAX));
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
  static const char* const kKeys[] = {"dir", "dev", "prec", "layout", "engine", "epi", "det",    "mode", "fixed",
                                      "x",   "w",   "y",    "pad",    "stride", "dil", "groups", "ws"};
  constexpr int kNumKeys = sizeof(kKeys) / sizeof(kKeys[0]);
  const bool has_out = tokens.size() == kNumKeys + 2;  // the optional last field, out=<dtype of y>
  if ((tokens.size() != kNumKeys + 1 && !has_out) || tokens[0] != kKeyVersion) {
    malformed(text, std::string("expected '") + kKeyVersion + "' and " + std::to_string(kNumKeys) + " fields");
  }
  std::string values[kNumKeys];
  for (int i = 0; i < kNumKeys; ++i) {
    const std::string& t = tokens[i + 1];
    const std::string prefix = std::string(kKeys[i]) + "=";
    if (t.compare(0, prefix.size(), prefix) != 0) malformed(text, "expected field '" + prefix + "...'");
    values[i] = t.substr(prefix.size());
  }
  ConvParams p;
  try {
    p.direction = static_cast<uint8_t>(parse_direction(values[0]));
    p.device = static_cast<int32_t>(parse_int(text, values[1], 0, INT32_MAX));
    p.precision = static_cast<uint8_t>(parse_precision(values[2]));
    p.layout = static_cast<uint8_t>(parse_layout(values[3]));
    p.engine = static_cast<uint8_t>(parse_engine(values[4]));
    p.epilogue = parse_epilogue(values[5]);
    p.deterministic = static_cast<uint8_t>(parse_int(text, values[6], 0, 1));
    p.algo_mode = static_cast<uint8_t>(parse_algo_mode(values[7]));
  } catch (const ValueError& e) {
    malformed(text, e.what());
  }
  p.fixed_algo = static_cast<int32_t>(parse_int(text, values[8], INT32_MIN, INT32_MAX));
  parse_ints(text, values[9], p.x, 4);
  parse_ints(text, values[10], p.w, 4);
  parse_ints(text, values[11], p.y, 4);
  parse_ints(text, values[12], p.pad, 2);
  parse_ints(text, values[13], p.stride, 2);
  parse_ints(text, values[14], p.dilation, 2);
  p.groups = static_cast<int32_t>(parse_int(text, values[15], INT32_MIN, INT32_MAX));
  if (values[16] == "none") {
    p.workspace_cap = UINT64_MAX;
  } else {
    if (values[16].empty() || values[16][0] == '-') malformed(text, "bad workspace cap '" + values[16] + "'");
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(values[16].c_str(), &end, 10);
    if (errno != 0 || *end != '\0' || v == UINT64_MAX) malformed(text, "bad workspace cap '" + values[16] + "'");
    p.workspace_cap = v;
  }
  if (has_out) {
    const std::string& t = tokens.back();
    for (DType d : kQuantizedOutDtypes) {
      if (t == std::string("out=") + dtype_short_name(d)) p.out_dtype = out_dtype_code(d);
    }
    if (p.out_dtype == 0) malformed(text, "expected out=int8|fp8|fp16|fp32, got '" + t + "'");
  }
  return p;
}

}  // namespace rn
