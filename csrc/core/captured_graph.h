// A stream capture ended into an instantiated CUDA graph, owned (the graph and its executable are destroyed with
// it), launched and uploaded on the caller's streams.
//
// Before instantiation each memset node may be replaced by a kernel node that writes the same bytes. cuDNN zeroes
// small buffers with cudaMemsetAsync inside its calls (batch norm's NHWC kernels, some convolution engines), and
// in a captured training step those become memset nodes, dozens per step between kernels. A memset node is
// scheduled apart from the kernels around it, which leaves the GPU idle for microseconds on each side; a kernel
// node follows its predecessor like any other kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

namespace rn {

class CapturedGraph {
 public:
  // Ends the capture in progress on `stream` (begun by the caller) and instantiates the graph; with
  // memsets_as_kernels, each memset node is first replaced by a kernel node with the same dependencies.
  CapturedGraph(cudaStream_t stream, bool memsets_as_kernels);

  void upload(cudaStream_t stream);
  void launch(cudaStream_t stream);
  int memset_kernels() const { return memset_kernels_; }  // memset nodes replaced by kernel nodes

 private:
  struct GraphDeleter {
    void operator()(cudaGraph_t g) const;
  };
  struct ExecDeleter {
    void operator()(cudaGraphExec_t e) const;
  };
  std::unique_ptr<CUgraph_st, GraphDeleter> graph_;
  std::unique_ptr<CUgraphExec_st, ExecDeleter> exec_;
  int memset_kernels_ = 0;
};

}  // namespace rn
