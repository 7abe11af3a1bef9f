// Shared declarations of the fusion probe (tools/probe_fusions*.cpp); probe_fusions.cpp says what it measures.
// Split in three translation units to keep each file short: probe_fusions.cpp (layers, the first patterns, device
// setup, main), probe_fusions_specialized.cpp (the graphs of cudnn-frontend's samples), probe_fusions_run.cpp (a
// graph's memory, its plans, checks, timing, the JSON lines).
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cudnn_frontend.h>

#define CHECK_CUDA(e)                                                                                  \
  do {                                                                                                 \
    cudaError_t s_ = (e);                                                                              \
    if (s_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #e, cudaGetErrorString(s_), __FILE__, __LINE__); \
      std::exit(2);                                                                                    \
    }                                                                                                  \
  } while (0)

namespace probe {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using DataType = fe::DataType_t;

struct Layer {
  std::string name;
  int64_t n, c, k, h, w, r, stride;
  int count;  // how many convolutions of the model have this shape
  int64_t p() const { return (h + 2 * (r / 2) - r) / stride + 1; }
  int64_t q() const { return (w + 2 * (r / 2) - r) / stride + 1; }
  int64_t pad() const { return r / 2; }
};

// The distinct convolutions of torchvision's ResNet-18 / ResNet-50 with the CIFAR stem, with their counts.
std::vector<Layer> layers_of(const std::string& model, int64_t n);

// What a tensor is to the runner, which decides where its memory comes from: activations and filters read random
// values, per-channel parameters a constant 0.5 (never written: one block per data type serves them all), outputs
// get their own memory, poisoned before a plan's first run and checked after it.
enum class Role { Input, Param, Output };

struct Probe {
  fe::graph::Graph graph;
  std::vector<std::pair<TensorPtr, Role>> tensors;

  static std::vector<int64_t> nhwc(int64_t c, int64_t h, int64_t w) { return {c * h * w, 1, w * c, c}; }
  TensorPtr input(const std::string& name, std::vector<int64_t> dim, std::vector<int64_t> stride) {
    auto t = graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(dim).set_stride(stride));
    tensors.push_back({t, Role::Input});
    return t;
  }
  // An NHWC activation, as every sample declares its images and gradients.
  TensorPtr act(const std::string& name, int64_t n, int64_t c, int64_t h, int64_t w) {
    return input(name, {n, c, h, w}, nhwc(c, h, w));
  }
  // A KRSC filter, the samples' {c * r * s, 1, c * s, c} strides.
  TensorPtr filter(const Layer& l) { return input("w", {l.k, l.c, l.r, l.r}, {l.c * l.r * l.r, 1, l.r * l.c, l.c}); }
  // A {1, c, 1, 1} per-channel tensor; NOT_SET leaves the type to the graph's io type, as the samples do.
  TensorPtr channel(const std::string& name, int64_t c, DataType type = DataType::NOT_SET) {
    auto a = fe::graph::Tensor_attributes().set_name(name).set_dim({1, c, 1, 1}).set_stride({c, 1, c, c});
    if (type != DataType::NOT_SET) a.set_data_type(type);
    auto t = graph.tensor(a);
    tensors.push_back({t, Role::Param});
    return t;
  }
  void output(const TensorPtr& t, DataType type = DataType::NOT_SET) {
    t->set_output(true);
    if (type != DataType::NOT_SET) t->set_data_type(type);
    tensors.push_back({t, Role::Output});
  }
  TensorPtr pw(const TensorPtr& a, fe::PointwiseMode_t mode) {
    return graph.pointwise(a, fe::graph::Pointwise_attributes().set_mode(mode));
  }
  TensorPtr pw(const TensorPtr& a, const TensorPtr& b, fe::PointwiseMode_t mode) {
    return graph.pointwise(a, b, fe::graph::Pointwise_attributes().set_mode(mode));
  }
};

// Each builder sets the graph's data types and adds the pattern's tensors and operations; false when the pattern is
// not one of its own. IO is HALF or BFLOAT16.
bool build_first_patterns(Probe& pr, const std::string& pattern, const Layer& l, DataType io);
bool build_specialized(Probe& pr, const std::string& pattern, const Layer& l, DataType io);

// The runner (probe_fusions_run.cpp).
struct Options {
  bool enumerate = false;     // every heuristics mode and every engine, not only heuristics A + FALLBACK
  bool dry = false;           // build and validate the graphs only: no GPU, no cuDNN handle
  int max_plans = 8;          // plans built and timed per graph
  int max_rtc = 1 << 20;      // of which runtime-compiled (each such build may compile kernels)
  double graph_s = 1e9;       // no new plan of a graph is built after this many seconds on it
  double deadline_s = 1e9;    // for the process: past 3/4 of it plans are capped at 4, past it graphs are skipped
  std::FILE* plans = stdout;  // where the enumeration's per-plan lines go (FUSIONS_PLANS names a file)
  int warmup = 3, repeats = 15, batch = 1;  // timing: trials (the first `warmup` not counted) of `batch` runs
};

struct Device {
  cudnnHandle_t handle{};
  cudaStream_t stream{};
  cudaEvent_t start{}, stop{};
  void* workspace{};
  size_t workspace_bytes{};
  char* inputs{};  // random activations and filters, never written
  size_t input_bytes{};
  char* outputs{};  // every output, poisoned before a plan's first run
  size_t output_bytes{};
  void* params[3]{};  // constant 0.5 per-channel values as HALF, BFLOAT16, FLOAT
};

// Allocates and fills the device memory (nothing in dry mode).
void init_device(Device& d, int64_t batch, const std::string& dtype, const Options& o);
// One JSON line per graph (and in enumerate mode one per plan and one listing the engines).
void run_graph(Device& d, const Options& o, const std::string& model, const Layer& l, const std::string& dtype,
               const std::string& pattern);

std::string json_escape(const std::string& s);

}  // namespace probe
