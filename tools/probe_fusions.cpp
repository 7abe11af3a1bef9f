// Probe: which of the MLPerf ResNet fusions cuDNN's graph API offers on this GPU, and what each costs per layer
// against the plain convolution it would replace. Each graph is built through cudnn-frontend's C++ API, up to
// MAX_PLANS of its heuristic candidates are built and timed, and the fastest plan's median counts.
//
// Patterns, per convolution of a ResNet (NHWC, fp16 or bf16 storage, fp32 accumulation):
//   fprop            Y = conv(X, W)                                         the forward baseline
//   fprop_genstats   Y = conv(X, W); sum, sum of squares of Y per channel   BN statistics in the epilogue
//   sbr_fprop_gen    Y = conv(relu(X * s + b), W) + the statistics         the previous BN applied in the prologue
//   dgrad            dX = dgrad(dY, W)                                      the backward-data baseline
//   dgrad_drelu_dbn  dgrad, ReLU backward against relu(bn(X)) recomputed, and BN's weight gradients and
//                    dX coefficients (dbn_weight)                          the backward fusion
//   wgrad            dW = wgrad(dY, X)                                      the backward-filter baseline
//   sbr_wgrad        dW = wgrad(dY, relu(X * s + b))                         the previous BN applied in the prologue
//   dx_apply         dX = a * dY + b * X + c per channel                   the BN-backward pass the fusion leaves
//
// Usage: probe_fusions MODEL BATCH DTYPE [PATTERN,...]   (MODEL resnet18|resnet50, CIFAR stem; DTYPE fp16|bf16;
//        DTYPE list: print the model's distinct convolutions and exit, without a GPU)
// Prints one JSON object per line: {model, layer, dtype, pattern, shape, count, ok, ms, plans, built, tag, error}.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

#define CHECK_CUDA(e)                                                                                  \
  do {                                                                                                 \
    cudaError_t s_ = (e);                                                                              \
    if (s_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #e, cudaGetErrorString(s_), __FILE__, __LINE__); \
      std::exit(2);                                                                                    \
    }                                                                                                  \
  } while (0)

namespace {

constexpr int MAX_PLANS = 8;
constexpr int WARMUP = 3;
constexpr int REPEATS = 15;
constexpr size_t WORKSPACE_BYTES = size_t(2) << 30;

struct Layer {
  std::string name;
  int64_t n, c, k, h, w, r, stride;
  int count;  // how many convolutions of the model have this shape
  int64_t p() const { return (h + 2 * (r / 2) - r) / stride + 1; }
  int64_t q() const { return (w + 2 * (r / 2) - r) / stride + 1; }
};

// The distinct convolutions of torchvision's ResNet-18 / ResNet-50 with the CIFAR stem (3x3, stride 1, no max
// pool) at 32x32, with how often each occurs.
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

std::vector<int64_t> nhwc_strides(int64_t c, int64_t h, int64_t w) {
  return {c * h * w, 1, w * c, c};
}

// A graph being probed: the frontend graph and every tensor that needs memory, with its element count and whether
// it is a per-channel float tensor (filled with small positive values) or an activation/filter (random values).
struct Probe {
  fe::graph::Graph graph;
  std::vector<std::pair<TensorPtr, std::pair<int64_t, bool>>> tensors;

  TensorPtr act(const std::string& name, int64_t n, int64_t c, int64_t h, int64_t w) {
    auto t = graph.tensor(
        fe::graph::Tensor_attributes().set_name(name).set_dim({n, c, h, w}).set_stride(nhwc_strides(c, h, w)));
    tensors.push_back({t, {n * c * h * w, false}});
    return t;
  }
  TensorPtr channel(const std::string& name, int64_t c, bool fp32 = true) {
    auto a = fe::graph::Tensor_attributes().set_name(name).set_dim({1, c, 1, 1}).set_stride({c, 1, c, c});
    if (fp32) a.set_data_type(fe::DataType_t::FLOAT);
    auto t = graph.tensor(a);
    tensors.push_back({t, {c, fp32}});
    return t;
  }
  void output(const TensorPtr& t, int64_t elements, bool fp32) {
    t->set_output(true);
    if (fp32) t->set_data_type(fe::DataType_t::FLOAT);
    tensors.push_back({t, {elements, fp32}});
  }
  TensorPtr pw(const TensorPtr& a, fe::PointwiseMode_t mode) {
    return graph.pointwise(a, fe::graph::Pointwise_attributes().set_mode(mode));
  }
  TensorPtr pw(const TensorPtr& a, const TensorPtr& b, fe::PointwiseMode_t mode) {
    return graph.pointwise(a, b, fe::graph::Pointwise_attributes().set_mode(mode));
  }
  // relu(x * s + b): the previous batch norm, applied per channel.
  TensorPtr scale_bias_relu(const TensorPtr& x, int64_t c, bool fp32_params) {
    auto s = channel("bn_scale", c, fp32_params), b = channel("bn_bias", c, fp32_params);
    return pw(pw(pw(x, s, fe::PointwiseMode_t::MUL), b, fe::PointwiseMode_t::ADD), fe::PointwiseMode_t::RELU_FWD);
  }
};

void build_pattern(Probe& pr, const std::string& pattern, const Layer& l) {
  const int64_t p = l.p(), q = l.q(), pad = l.r / 2;
  auto W = [&] {
    auto t = pr.graph.tensor(fe::graph::Tensor_attributes()
                                 .set_name("w")
                                 .set_dim({l.k, l.c, l.r, l.r})
                                 .set_stride({l.c * l.r * l.r, 1, l.r * l.c, l.c}));
    pr.tensors.push_back({t, {l.k * l.c * l.r * l.r, false}});
    return t;
  };
  auto fprop_opts =
      fe::graph::Conv_fprop_attributes().set_padding({pad, pad}).set_stride({l.stride, l.stride}).set_dilation({1, 1});
  if (pattern == "fprop" || pattern == "fprop_genstats" || pattern == "sbr_fprop_gen") {
    TensorPtr x = pr.act("x", l.n, l.c, l.h, l.w);
    if (pattern == "sbr_fprop_gen") x = pr.scale_bias_relu(x, l.c, false);
    auto y = pr.graph.conv_fprop(x, W(), fprop_opts);
    pr.output(y, l.n * l.k * p * q, false);
    if (pattern != "fprop") {
      auto [sum, sq] = pr.graph.genstats(y, fe::graph::Genstats_attributes().set_name("genstats"));
      pr.output(sum, l.k, true);
      pr.output(sq, l.k, true);
    }
  } else if (pattern == "dgrad" || pattern == "dgrad_drelu_dbn") {
    auto dy = pr.act("dy", l.n, l.k, p, q);
    auto dx = pr.graph.conv_dgrad(dy, W(),
                                  fe::graph::Conv_dgrad_attributes()
                                      .set_padding({pad, pad})
                                      .set_stride({l.stride, l.stride})
                                      .set_dilation({1, 1}));
    dx->set_dim({l.n, l.c, l.h, l.w});
    if (pattern == "dgrad") {
      pr.output(dx, l.n * l.c * l.h * l.w, false);
    } else {
      auto x = pr.act("x", l.n, l.c, l.h, l.w);
      auto mean = pr.channel("mean", l.c), invstd = pr.channel("invstd", l.c), scale = pr.channel("gamma", l.c),
           bias = pr.channel("beta", l.c);
      auto y = pr.pw(pr.pw(pr.pw(pr.pw(x, mean, fe::PointwiseMode_t::SUB), invstd, fe::PointwiseMode_t::MUL), scale,
                           fe::PointwiseMode_t::MUL),
                     bias, fe::PointwiseMode_t::ADD);
      auto drelu = pr.pw(dx, y, fe::PointwiseMode_t::RELU_BWD);
      pr.output(drelu, l.n * l.c * l.h * l.w, false);
      auto outs = pr.graph.dbn_weight(drelu, x, mean, invstd, scale, fe::graph::DBN_weight_attributes());
      for (auto& t : outs) pr.output(t, l.c, true);
    }
  } else if (pattern == "wgrad" || pattern == "sbr_wgrad") {
    auto dy = pr.act("dy", l.n, l.k, p, q);
    TensorPtr x = pr.act("x", l.n, l.c, l.h, l.w);
    if (pattern == "sbr_wgrad") x = pr.scale_bias_relu(x, l.c, false);
    auto dw = pr.graph.conv_wgrad(dy, x,
                                  fe::graph::Conv_wgrad_attributes()
                                      .set_padding({pad, pad})
                                      .set_stride({l.stride, l.stride})
                                      .set_dilation({1, 1}));
    dw->set_dim({l.k, l.c, l.r, l.r}).set_stride({l.c * l.r * l.r, 1, l.r * l.c, l.c});
    pr.output(dw, l.k * l.c * l.r * l.r, false);
  } else if (pattern == "dx_apply") {
    // BN backward's last pass, on the convolution's input (n, c, h, w): dx = a * dy + b * x + c.
    auto dy = pr.act("dy", l.n, l.c, l.h, l.w), x = pr.act("x", l.n, l.c, l.h, l.w);
    auto a = pr.channel("a", l.c), b = pr.channel("b", l.c), c = pr.channel("c", l.c);
    auto dx = pr.pw(
        pr.pw(pr.pw(dy, a, fe::PointwiseMode_t::MUL), pr.pw(x, b, fe::PointwiseMode_t::MUL), fe::PointwiseMode_t::ADD),
        c, fe::PointwiseMode_t::ADD);
    pr.output(dx, l.n * l.c * l.h * l.w, false);
  } else {
    throw std::runtime_error("unknown pattern " + pattern);
  }
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

struct Device {
  cudnnHandle_t handle{};
  cudaStream_t stream{};
  void* workspace{};
  char* arena{};
  size_t arena_bytes{};
  float* channels{};
  cudaEvent_t start{}, stop{};
};

double time_plan(Device& d, Probe& pr, std::unordered_map<TensorPtr, void*>& pack, int64_t index, std::string& err) {
  for (int i = 0; i < WARMUP; ++i) {
    auto s = pr.graph.execute_plan_at_index(d.handle, pack, d.workspace, index);
    if (s.is_bad()) {
      err = s.get_message();
      return -1;
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(d.stream));
  std::vector<float> ms;
  for (int i = 0; i < REPEATS; ++i) {
    CHECK_CUDA(cudaEventRecord(d.start, d.stream));
    auto s = pr.graph.execute_plan_at_index(d.handle, pack, d.workspace, index);
    CHECK_CUDA(cudaEventRecord(d.stop, d.stream));
    CHECK_CUDA(cudaEventSynchronize(d.stop));
    if (s.is_bad()) {
      err = s.get_message();
      return -1;
    }
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, d.start, d.stop));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run_one(Device& d, const std::string& model, const Layer& l, const std::string& dtype,
             const std::string& pattern) {
  const auto t0 = std::chrono::steady_clock::now();
  Probe pr;
  const auto io = dtype == "bf16" ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  // The prologue's output feeds the convolution, so it is stored in the io type.
  const bool prologue = pattern.rfind("sbr_", 0) == 0;
  pr.graph.set_io_data_type(io)
      .set_intermediate_data_type(prologue ? io : fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  std::string error, tag;
  int64_t plans = 0;
  int built = 0;
  double best = -1;
  std::ostringstream shape;
  shape << l.n << "x" << l.c << "x" << l.h << "x" << l.w << " k" << l.k << " r" << l.r << " s" << l.stride;
  try {
    build_pattern(pr, pattern, l);
    auto check = [&](fe::error_object s, const char* step) {
      if (s.is_bad()) throw std::runtime_error(std::string(step) + ": " + s.get_message());
    };
    check(pr.graph.validate(), "validate");
    check(pr.graph.build_operation_graph(d.handle), "build_operation_graph");
    check(pr.graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans");
    plans = pr.graph.get_execution_plan_count();
    check(pr.graph.check_support(d.handle), "check_support");
    // Memory: activations and filters from the random arena, per-channel floats from the constant block.
    std::unordered_map<TensorPtr, void*> pack;
    size_t offset = 0;
    int64_t channel_offset = 0;
    for (auto& [t, info] : pr.tensors) {
      const auto [elements, fp32] = info;
      if (fp32) {
        pack[t] = d.channels + channel_offset;
        channel_offset += (elements + 63) / 64 * 64;
      } else {
        const size_t bytes = (size_t(elements) * 2 + 255) / 256 * 256;
        if (offset + bytes > d.arena_bytes) throw std::runtime_error("arena too small");
        pack[t] = d.arena + offset;
        offset += bytes;
      }
    }
    for (int64_t i = 0; i < plans && built < MAX_PLANS; ++i) {
      if (pr.graph.build_plan_at_index(i).is_bad()) continue;
      int64_t ws = 0;
      if (pr.graph.get_workspace_size_plan_at_index(i, ws).is_bad() || size_t(ws) > WORKSPACE_BYTES) continue;
      ++built;
      std::string e;
      const double ms = time_plan(d, pr, pack, i, e);
      if (ms < 0) {
        error = e;
        continue;
      }
      if (best < 0 || ms < best) {
        best = ms;
        if (pr.graph.get_plan_name_at_index(i, tag).is_bad()) tag = "?";
      }
    }
    if (built == 0 && error.empty()) error = "no plan could be built";
  } catch (const std::exception& e) {
    error = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"model\": \"%s\", \"layer\": \"%s\", \"dtype\": \"%s\", \"pattern\": \"%s\", \"shape\": \"%s\", "
      "\"count\": %d, \"ok\": %s, \"ms\": %.5f, \"plans\": %lld, \"built\": %d, \"tag\": \"%s\", \"seconds\": %.2f, "
      "\"error\": \"%s\"}\n",
      model.c_str(), l.name.c_str(), dtype.c_str(), pattern.c_str(), shape.str().c_str(), l.count,
      best >= 0 ? "true" : "false", best, static_cast<long long>(plans), built, json_escape(tag).c_str(), seconds,
      json_escape(error).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s resnet18|resnet50 BATCH fp16|bf16 [pattern,...]\n", argv[0]);
    return 2;
  }
  const std::string model = argv[1], dtype = argv[3];
  const int64_t batch = std::atoll(argv[2]);
  std::string list =
      argc > 4 ? argv[4] : "fprop,fprop_genstats,sbr_fprop_gen,dgrad,dgrad_drelu_dbn,wgrad,sbr_wgrad,dx_apply";
  std::vector<std::string> patterns;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) patterns.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  if (dtype == "list") {
    for (const auto& l : layers_of(model, batch)) {
      std::printf("%s %lldx%lldx%lldx%lld k%lld r%lld s%lld x%d\n", l.name.c_str(), (long long)l.n, (long long)l.c,
                  (long long)l.h, (long long)l.w, (long long)l.k, (long long)l.r, (long long)l.stride, l.count);
    }
    return 0;
  }
  Device d;
  if (cudnnCreate(&d.handle) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "cudnnCreate failed\n");
    return 2;
  }
  CHECK_CUDA(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  cudnnSetStream(d.handle, d.stream);
  CHECK_CUDA(cudaEventCreate(&d.start));
  CHECK_CUDA(cudaEventCreate(&d.stop));
  CHECK_CUDA(cudaMalloc(&d.workspace, WORKSPACE_BYTES));
  // Enough for the largest pattern's activations (x, dy, dx, y: four of 512x256x32x32 at 2 bytes) and a filter.
  d.arena_bytes = size_t(4) * batch * 256 * 32 * 32 * 2 + (size_t(64) << 20);
  CHECK_CUDA(cudaMalloc(&d.arena, d.arena_bytes));
  CHECK_CUDA(cudaMalloc(&d.channels, size_t(1) << 20));
  {
    // Random finite values (the same bits read as fp16 or bf16 stay in [-1, 1)), never zeros: zeros can run faster.
    std::mt19937 rng(1234);
    std::vector<uint16_t> host(size_t(1) << 24);
    for (auto& v : host) v = static_cast<uint16_t>((rng() & 0x80FF) | (dtype == "bf16" ? 0x3E00 : 0x3000));
    for (size_t at = 0; at < d.arena_bytes; at += host.size() * 2) {
      CHECK_CUDA(
          cudaMemcpy(d.arena + at, host.data(), std::min(host.size() * 2, d.arena_bytes - at), cudaMemcpyHostToDevice));
    }
    std::vector<float> ones((size_t(1) << 20) / 4, 0.5f);
    CHECK_CUDA(cudaMemcpy(d.channels, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  }
  for (const auto& l : layers_of(model, batch)) {
    for (const auto& pattern : patterns) run_one(d, model, l, dtype, pattern);
  }
  return 0;
}
