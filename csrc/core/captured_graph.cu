#include "captured_graph.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "error.h"

namespace rn {
namespace {

// A memset node's bytes: `height` rows of `width` elements of `elem` bytes (1, 2 or 4), rows `pitch` bytes apart,
// each element the low `elem` bytes of `value`. 16-byte stores where every row allows them (vec16), else one
// element per store.
__global__ void fill_kernel(unsigned char* dst, size_t pitch, uint32_t value, uint32_t elem, size_t width,
                            size_t height, bool vec16) {
  const size_t row_bytes = width * elem;
  const size_t per_row = vec16 ? row_bytes / 16 : width;
  const size_t total = per_row * height;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = first; i < total; i += stride) {
    unsigned char* row = dst + (i / per_row) * pitch;
    const size_t k = i % per_row;
    if (vec16) {
      reinterpret_cast<uint4*>(row)[k] = make_uint4(value, value, value, value);  // value: the 4-byte pattern
    } else if (elem == 4) {
      reinterpret_cast<uint32_t*>(row)[k] = value;
    } else if (elem == 2) {
      reinterpret_cast<uint16_t*>(row)[k] = static_cast<uint16_t>(value);
    } else {
      row[k] = static_cast<unsigned char>(value);
    }
  }
}

constexpr unsigned kFillThreads = 256;
constexpr size_t kMaxFillBlocks = 1024;  // grid-stride beyond: the buffers cuDNN zeroes are small

// The element value repeated over 4 bytes (what a 16-byte store writes four times).
uint32_t pattern(uint32_t value, uint32_t elem) {
  if (elem == 1) return (value & 0xffu) * 0x01010101u;
  if (elem == 2) return (value & 0xffffu) * 0x00010001u;
  return value;
}

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t graph) {
  size_t n = 0;
  RN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) RN_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  nodes.resize(n);
  return nodes;
}

// A node's dependencies (upstream) or dependents over plain edges: false (and nothing changed) when an edge
// carries data (a programmatic dependency), which a query without edge data refuses and a rewrite would lose.
bool neighbours(cudaGraphNode_t node, bool upstream, std::vector<cudaGraphNode_t>* out) {
  const auto query = [node, upstream](cudaGraphNode_t* nodes, size_t* n) {
#if CUDART_VERSION >= 13000
    return upstream ? cudaGraphNodeGetDependencies(node, nodes, nullptr, n)
                    : cudaGraphNodeGetDependentNodes(node, nodes, nullptr, n);
#else
    return upstream ? cudaGraphNodeGetDependencies(node, nodes, n) : cudaGraphNodeGetDependentNodes(node, nodes, n);
#endif
  };
  size_t n = 0;
  cudaError_t status = query(nullptr, &n);
  if (status == cudaSuccess && n) {
    out->resize(n);
    status = query(out->data(), &n);
  }
#if CUDART_VERSION >= 12030
  if (status == cudaErrorLossyQuery) {
    cudaGetLastError();  // clears it: the node is left as it is
    return false;
  }
#endif
  RN_CUDA_CHECK(status);
  out->resize(n);
  return true;
}

void add_edge(cudaGraph_t graph, cudaGraphNode_t from, cudaGraphNode_t to) {
#if CUDART_VERSION >= 13000
  RN_CUDA_CHECK(cudaGraphAddDependencies(graph, &from, &to, nullptr, 1));
#else
  RN_CUDA_CHECK(cudaGraphAddDependencies(graph, &from, &to, 1));
#endif
}

// The kernel node that writes what memset node `node` writes, in its place; false when the node is kept.
bool replace_memset(cudaGraph_t graph, cudaGraphNode_t node) {
  std::vector<cudaGraphNode_t> before, after;
  if (!neighbours(node, true, &before) || !neighbours(node, false, &after)) return false;
  cudaMemsetParams m{};
  RN_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m));
  auto* dst = static_cast<unsigned char*>(m.dst);
  size_t pitch = m.height > 1 ? m.pitch : m.width * m.elementSize;
  uint32_t elem = m.elementSize;
  size_t width = m.width, height = m.height;
  const auto aligned = [](size_t v) { return v % 16 == 0; };
  bool vec16 = aligned(reinterpret_cast<uintptr_t>(dst)) && aligned(pitch) && aligned(width * elem);
  uint32_t value = vec16 ? pattern(m.value, elem) : m.value;
  const size_t items = (vec16 ? width * elem / 16 : width) * height;
  cudaKernelNodeParams k{};
  k.func = reinterpret_cast<void*>(&fill_kernel);
  k.gridDim =
      dim3(static_cast<unsigned>(std::clamp<size_t>((items + kFillThreads - 1) / kFillThreads, 1, kMaxFillBlocks)));
  k.blockDim = dim3(kFillThreads);
  void* args[] = {&dst, &pitch, &value, &elem, &width, &height, &vec16};
  k.kernelParams = args;
  cudaGraphNode_t fill = nullptr;
  RN_CUDA_CHECK(cudaGraphAddKernelNode(&fill, graph, before.data(), before.size(), &k));
  for (cudaGraphNode_t next : after) add_edge(graph, fill, next);
  RN_CUDA_CHECK(cudaGraphDestroyNode(node));  // and its edges
  return true;
}

// Replaces every memset node of `graph` (whose edges are plain) by a kernel node writing the same values, with
// the same dependencies and dependents. Returns the number replaced.
int memsets_to_kernels(cudaGraph_t graph) {
  int replaced = 0;
  for (cudaGraphNode_t node : nodes_of(graph)) {
    cudaGraphNodeType type;
    RN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeMemset && replace_memset(graph, node)) ++replaced;
  }
  return replaced;
}

}  // namespace

void CapturedGraph::GraphDeleter::operator()(cudaGraph_t g) const {
  cudaGraphDestroy(g);  // a destructor: nothing to report a failure to
}

void CapturedGraph::ExecDeleter::operator()(cudaGraphExec_t e) const {
  cudaGraphExecDestroy(e);
}

CapturedGraph::CapturedGraph(cudaStream_t stream, bool memsets_as_kernels) {
  cudaGraph_t graph = nullptr;
  RN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  graph_.reset(graph);
  if (memsets_as_kernels) memset_kernels_ = memsets_to_kernels(graph);
  cudaGraphExec_t exec = nullptr;
  RN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_.reset(exec);
}

void CapturedGraph::upload(cudaStream_t stream) {
  RN_CUDA_CHECK(cudaGraphUpload(exec_.get(), stream));
}

void CapturedGraph::launch(cudaStream_t stream) {
  RN_CUDA_CHECK(cudaGraphLaunch(exec_.get(), stream));
}

}  // namespace rn
