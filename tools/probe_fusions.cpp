// Probe: which of the MLPerf ResNet fusions cuDNN's graph API offers on this GPU, and what each costs per layer
// against the plain convolution it would replace. Each graph is built through cudnn-frontend's C++ API, its plans
// are built and timed, and the fastest plan's median counts.
//
// Patterns, per convolution of a ResNet (NHWC, fp16 or bf16 storage, fp32 accumulation). The first set:
//   fprop            Y = conv(X, W)                                         the forward baseline
//   fprop_genstats   Y = conv(X, W); sum, sum of squares of Y per channel   BN statistics in the epilogue
//   sbr_fprop_gen    Y = conv(relu(X * s + b), W) + the statistics         the previous BN applied in the prologue
//                                                                           (prologue stored in the io type)
//   dgrad            dX = dgrad(dY, W)                                      the backward-data baseline
//   dgrad_drelu_dbn  dgrad, ReLU backward against relu(bn(X)) recomputed, and BN's weight gradients and
//                    dX coefficients (dbn_weight, fp32 outputs)            the backward fusion
//   wgrad            dW = wgrad(dY, X)                                      the backward-filter baseline
//   sbr_wgrad        dW = wgrad(dY, relu(X * s + b))                         the previous BN applied in the prologue
//   dx_apply         dX = a * dY + b * X + c per channel                   cuDNN's dBNApply pattern: the BN-backward
//                                                                           pass the fusion leaves
// and the graphs of cudnn-frontend's samples, in probe_fusions_specialized.cpp: sbrcs, conv_genstats, dbarcs,
// dbarcs_relu, convbn_wgrad, dgrad_drelu_bnbwdw.
//
// Usage: probe_fusions MODEL BATCH DTYPE [PATTERN,...] [DEADLINE_S]
//   MODEL resnet18|resnet50 (CIFAR stem); DTYPE fp16|bf16, or list: print the distinct convolutions and exit.
//   FUSIONS_ENUM=all: every heuristics mode (A, B, FALLBACK) and every engine of cuDNN's global list that takes the
//     graph (CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT; default knobs unless a heuristics mode chose others; a
//     precompiled engine only that list offers for a fused graph also gets each knob swept over its range),
//     up to FUSIONS_MAX_PLANS (24) built per graph, FUSIONS_MAX_RTC (3) of them runtime-compiled, no new build
//     after FUSIONS_GRAPH_S (1) seconds on a graph; each plan timed as the median of 5 trials of 4 back-to-back runs.
//     One JSON line per plan (to the file FUSIONS_PLANS names, else stdout) and one per graph listing its engines
//     and their knobs' ranges, besides the graph's own line.
//     Without it: heuristics A + FALLBACK, 8 plans per graph, 15 single runs each, as the first runs of this probe.
//   DEADLINE_S: past 3/4 of it plans are capped at 4 per graph, past it the remaining graphs are skipped.
//   Every plan's outputs are poisoned (NaN) before its first run and sampled after it: one that leaves them unwritten
//   or not finite is counted in bad_output, and its time (in its plan line) is not a result.
//   FUSIONS_DRY=1: build and validate every graph, no GPU needed (a check of the graphs on a machine without one).
// Prints one JSON object per graph: {model, layer, dtype, pattern, shape, count, ok, ms, plans, built, tag, ...}.
#include "probe_fusions.h"

#include <algorithm>
#include <cstring>
#include <random>

namespace probe {

std::vector<Layer> layers_of(const std::string& model, int64_t n) {
  std::vector<Layer> out;
  auto add = [&](const std::string& name, int64_t c, int64_t k, int64_t hw, int64_t r, int64_t s, int count) {
    for (auto& l : out) {
      if (l.c == c && l.k == k && l.h == hw && l.r == r && l.stride == s) {
        l.count += count;
        return;
      }
    }
    out.push_back({name, n, c, k, hw, hw, r, s, count});
  };
  const int64_t widths[4] = {64, 128, 256, 512};
  const bool bottleneck = model != "resnet18";
  const int blocks[2][4] = {{2, 2, 2, 2}, {3, 4, 6, 3}};
  int64_t in = 64, hw = 32;
  for (int st = 0; st < 4; ++st) {
    const int64_t w = widths[st], out_c = bottleneck ? 4 * w : w;
    for (int b = 0; b < blocks[bottleneck][st]; ++b) {
      const int64_t s = (b == 0 && st > 0) ? 2 : 1;
      const std::string tag = "s" + std::to_string(st + 1) + (b == 0 ? "b1" : "bN");
      if (bottleneck) {  // torchvision's v1.5: the stride is on the 3x3 convolution
        add(tag + ".conv1", in, w, hw, 1, 1, 1);
        add(tag + ".conv2", w, w, hw, 3, s, 1);
      } else {
        add(tag + ".conv1", in, w, hw, 3, s, 1);
      }
      if (s != 1 || in != out_c) add(tag + ".down", in, out_c, hw, 1, s, 1);
      hw /= s;
      if (bottleneck) {
        add(tag + ".conv3", w, out_c, hw, 1, 1, 1);
      } else {
        add(tag + ".conv2", w, w, hw, 3, 1, 1);
      }
      in = out_c;
    }
  }
  return out;
}

bool build_first_patterns(Probe& pr, const std::string& pattern, const Layer& l, DataType io) {
  using PW = fe::PointwiseMode_t;
  // The prologue's output feeds the convolution, so these store it in the io type.
  const bool prologue = pattern.rfind("sbr_", 0) == 0;
  pr.graph.set_io_data_type(io)
      .set_intermediate_data_type(prologue ? io : DataType::FLOAT)
      .set_compute_data_type(DataType::FLOAT);
  const int64_t p = l.p(), q = l.q(), pad = l.pad();
  auto sbr = [&](const TensorPtr& x) {  // relu(x * s + b), the previous batch norm, s and b in the io type
    auto s = pr.channel("bn_scale", l.c), b = pr.channel("bn_bias", l.c);
    return pr.pw(pr.pw(pr.pw(x, s, PW::MUL), b, PW::ADD), PW::RELU_FWD);
  };
  if (pattern == "fprop" || pattern == "fprop_genstats" || pattern == "sbr_fprop_gen") {
    TensorPtr x = pr.act("x", l.n, l.c, l.h, l.w);
    if (pattern == "sbr_fprop_gen") x = sbr(x);
    auto y = pr.graph.conv_fprop(x, pr.filter(l),
                                 fe::graph::Conv_fprop_attributes()
                                     .set_padding({pad, pad})
                                     .set_stride({l.stride, l.stride})
                                     .set_dilation({1, 1}));
    pr.output(y);
    if (pattern != "fprop") {
      auto [sum, sq] = pr.graph.genstats(y, fe::graph::Genstats_attributes().set_name("genstats"));
      pr.output(sum, DataType::FLOAT);
      pr.output(sq, DataType::FLOAT);
    }
  } else if (pattern == "dgrad" || pattern == "dgrad_drelu_dbn") {
    auto dy = pr.act("dy", l.n, l.k, p, q);
    auto dx = pr.graph.conv_dgrad(dy, pr.filter(l),
                                  fe::graph::Conv_dgrad_attributes()
                                      .set_padding({pad, pad})
                                      .set_stride({l.stride, l.stride})
                                      .set_dilation({1, 1}));
    dx->set_dim({l.n, l.c, l.h, l.w});
    if (pattern == "dgrad") {
      pr.output(dx);
    } else {
      auto x = pr.act("x", l.n, l.c, l.h, l.w);
      auto mean = pr.channel("mean", l.c, DataType::FLOAT), invstd = pr.channel("invstd", l.c, DataType::FLOAT),
           gamma = pr.channel("gamma", l.c, DataType::FLOAT), beta = pr.channel("beta", l.c, DataType::FLOAT);
      auto y = pr.pw(pr.pw(pr.pw(pr.pw(x, mean, PW::SUB), invstd, PW::MUL), gamma, PW::MUL), beta, PW::ADD);
      auto drelu = pr.pw(dx, y, PW::RELU_BWD);
      pr.output(drelu);
      auto outs = pr.graph.dbn_weight(drelu, x, mean, invstd, gamma, fe::graph::DBN_weight_attributes());
      for (auto& t : outs) pr.output(t, DataType::FLOAT);
    }
  } else if (pattern == "wgrad" || pattern == "sbr_wgrad") {
    auto dy = pr.act("dy", l.n, l.k, p, q);
    TensorPtr x = pr.act("x", l.n, l.c, l.h, l.w);
    if (pattern == "sbr_wgrad") x = sbr(x);
    auto dw = pr.graph.conv_wgrad(dy, x,
                                  fe::graph::Conv_wgrad_attributes()
                                      .set_padding({pad, pad})
                                      .set_stride({l.stride, l.stride})
                                      .set_dilation({1, 1}));
    dw->set_dim({l.k, l.c, l.r, l.r}).set_stride({l.c * l.r * l.r, 1, l.r * l.c, l.c});
    pr.output(dw);
  } else if (pattern == "dx_apply") {
    // BN backward's last pass, on the convolution's input (n, c, h, w): dx = a * dy + b * x + c, with the fp32
    // coefficients dbn_weight produces: the dBNApply form of cuDNN's specialized engines.
    auto dy = pr.act("dy", l.n, l.c, l.h, l.w), x = pr.act("x", l.n, l.c, l.h, l.w);
    auto a = pr.channel("a", l.c, DataType::FLOAT), b = pr.channel("b", l.c, DataType::FLOAT),
         c = pr.channel("c", l.c, DataType::FLOAT);
    pr.output(pr.pw(pr.pw(pr.pw(dy, a, PW::MUL), pr.pw(x, b, PW::MUL), PW::ADD), c, PW::ADD));
  } else {
    return false;
  }
  return true;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (ch == '\n') {
      o += "\\n";
      continue;
    }
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    o += ch;
  }
  return o.size() > 400 ? o.substr(0, 400) : o;
}

void init_device(Device& d, int64_t batch, const std::string& dtype, const Options& o) {
  if (o.dry) return;
  const cudnnStatus_t s = cudnnCreate(&d.handle);
  if (s != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "cudnnCreate failed: %s\n", cudnnGetErrorString(s));
    std::exit(2);
  }
  CHECK_CUDA(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  if (cudnnSetStream(d.handle, d.stream) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "cudnnSetStream failed\n");
    std::exit(2);
  }
  // Which cuDNN, frontend and GPU measured: the report's header.
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"kind\": \"device\", \"gpu\": \"%s\", \"cc\": \"%d.%d\", \"cudnn\": %zu, \"frontend\": %d}\n",
              json_escape(prop.name).c_str(), prop.major, prop.minor, cudnnGetVersion(), CUDNN_FRONTEND_VERSION);
  CHECK_CUDA(cudaEventCreate(&d.start));
  CHECK_CUDA(cudaEventCreate(&d.stop));
  d.workspace_bytes = size_t(2) << 30;
  CHECK_CUDA(cudaMalloc(&d.workspace, d.workspace_bytes));
  // The largest activation of either model: batch x 256 channels x 32 x 32 (and its equals at lower resolutions).
  const size_t act = size_t(batch) * 256 * 32 * 32 * 2;
  d.input_bytes = 3 * act + (size_t(64) << 20);   // x, a residual or dy, a filter
  d.output_bytes = 2 * act + (size_t(64) << 20);  // y and a written ReLU (or dgrad's ReLU backward), statistics
  CHECK_CUDA(cudaMalloc(&d.inputs, d.input_bytes));
  CHECK_CUDA(cudaMalloc(&d.outputs, d.output_bytes));
  // Random finite values (the same bits read as fp16 or bf16 stay in [-1, 1)), never zeros: zeros can run faster.
  std::mt19937 rng(1234);
  std::vector<uint16_t> host(size_t(1) << 24);
  for (auto& v : host) v = static_cast<uint16_t>((rng() & 0x80FF) | (dtype == "bf16" ? 0x3E00 : 0x3000));
  for (size_t at = 0; at < d.input_bytes; at += host.size() * 2) {
    CHECK_CUDA(
        cudaMemcpy(d.inputs + at, host.data(), std::min(host.size() * 2, d.input_bytes - at), cudaMemcpyHostToDevice));
  }
  // 0.5 in HALF, BFLOAT16 and FLOAT, for every per-channel input (at most 2048 channels).
  const uint32_t half[3] = {0x3800, 0x3F00, 0x3F000000};
  for (int b = 0; b < 3; ++b) {
    const size_t eb = b == 2 ? 4 : 2;
    std::vector<unsigned char> block(8192 * eb);
    for (size_t i = 0; i < 8192; ++i) std::memcpy(block.data() + i * eb, &half[b], eb);
    CHECK_CUDA(cudaMalloc(&d.params[b], block.size()));
    CHECK_CUDA(cudaMemcpy(d.params[b], block.data(), block.size(), cudaMemcpyHostToDevice));
  }
}

}  // namespace probe

namespace {

double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace probe;
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s resnet18|resnet50 BATCH fp16|bf16|list [pattern,...] [deadline_s]\n", argv[0]);
    return 2;
  }
  const std::string model = argv[1], dtype = argv[3];
  const int64_t batch = std::atoll(argv[2]);
  if (dtype == "list") {
    for (const auto& l : layers_of(model, batch)) {
      std::printf("%s %lldx%lldx%lldx%lld k%lld r%lld s%lld x%d\n", l.name.c_str(), (long long)l.n, (long long)l.c,
                  (long long)l.h, (long long)l.w, (long long)l.k, (long long)l.r, (long long)l.stride, l.count);
    }
    return 0;
  }
  if (dtype != "fp16" && dtype != "bf16") {
    std::fprintf(stderr, "DTYPE must be fp16, bf16 or list, not %s\n", dtype.c_str());
    return 2;
  }
  Options o;
  const char* mode = std::getenv("FUSIONS_ENUM");
  o.enumerate = mode && std::string(mode) == "all";
  o.dry = env_or("FUSIONS_DRY", 0) != 0;
  if (o.enumerate) {
    o.max_plans = 24;
    o.max_rtc = 3;  // runtime compilation of a pointwise graph costs far more than timing a precompiled plan
    o.graph_s = 1;
    o.warmup = 1;
    o.repeats = 5;
    o.batch = 4;
  }
  o.max_plans = static_cast<int>(env_or("FUSIONS_MAX_PLANS", o.max_plans));
  o.max_rtc = static_cast<int>(env_or("FUSIONS_MAX_RTC", o.max_rtc));
  o.graph_s = env_or("FUSIONS_GRAPH_S", o.graph_s);
  if (const char* path = std::getenv("FUSIONS_PLANS"); path && *path && !(o.plans = std::fopen(path, "a"))) {
    std::fprintf(stderr, "cannot open %s\n", path);
    return 2;
  }
  o.deadline_s = argc > 5 && *argv[5] ? std::atof(argv[5]) : 1e9;
  const std::string first = "fprop,fprop_genstats,sbr_fprop_gen,dgrad,dgrad_drelu_dbn,wgrad,sbr_wgrad,dx_apply";
  // The enumeration's list: the baselines, the samples' graphs, the two first-set variants they differ from
  // (prologue stored in the io type; fp32 dbn_weight outputs) and dBNApply.
  const std::string all =
      "fprop,dgrad,wgrad,conv_genstats,sbrcs,sbr_fprop_gen,dbarcs,dbarcs_relu,convbn_wgrad,dgrad_drelu_bnbwdw,"
      "dgrad_drelu_dbn,dx_apply";
  const std::string list = argc > 4 && *argv[4] ? argv[4] : (o.enumerate ? all : first);
  std::vector<std::string> patterns;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) patterns.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  Device d;
  init_device(d, batch, dtype, o);
  for (const auto& l : layers_of(model, batch)) {
    for (const auto& pattern : patterns) run_graph(d, o, model, l, dtype, pattern);
  }
  return 0;
}
