// The operation graph of one convolution problem: its tensors, the convolution descriptor, the operations
// (forward / backward-data / backward-filter, and for forward the fused epilogue
// y = relu(alpha1 * [scale *] conv(x, w) + alpha2 * z + bias), the per-channel scale being the quantised
// forward's) and the finalized CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR.
//
// Building the operations needs no GPU (tests exercise it on CPU-only machines); finalizing the graph needs a
// cuDNN handle. Everything is owned through rn::BackendDescriptor, so a build that throws half-way leaks nothing.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../../core/descriptor.h"
#include "../conv_params.h"

namespace rn::graph {

// Unique ids of the graph's tensors. The non-virtual ones are what a variant pack binds to data pointers.
enum TensorUid : int64_t {
  kUidX = 1,  // x (Forward, BackwardFilter) or dx (BackwardData)
  kUidW = 2,  // w (Forward, BackwardData) or dw (BackwardFilter)
  kUidY = 3,  // y (Forward) or dy (BackwardData, BackwardFilter)
  kUidZ = 4,
  kUidBias = 5,
  kUidScale = 6,      // the per-channel fp32 multiplier (kEpilogueScale)
  kUidConvOut = 101,  // virtual intermediates of the forward epilogue (fp32; int32 out of an int8 convolution)
  kUidAfterResidual = 102,
  kUidAfterBias = 103,
  kUidAfterScale = 104,
};

// Values the graph API bakes into a graph at build time (the legacy API takes them per call). They are part of
// the plan cache key (plan_cache.h).
struct GraphConstants {
  float alpha1 = 1.0f;  // scale of the convolution result
  float alpha2 = 1.0f;  // scale of the residual z (Forward with kEpilogueResidual)
  float beta = 0.0f;    // out = conv + beta * out (no epilogue only)
  // Byte alignment (1..16) of each operand's data pointer, indexed by TensorUid (1..6).
  uint8_t alignment[7] = {16, 16, 16, 16, 16, 16, 16};
};

struct ConvOpGraph {
  // Tensors, convolution and pointwise descriptors and operations, with their types (for tests and counts).
  std::vector<BackendDescriptor> parts;
  std::vector<cudnnBackendDescriptorType_t> part_types;
  std::vector<cudnnBackendDescriptor_t> operations;  // in execution order
  std::vector<int64_t> io_uids;                      // non-virtual tensors, in variant-pack order
  std::optional<BackendDescriptor> graph;            // set by finalize_op_graph()
};

// Checks that `params` describes a well-formed problem the graph engine can express; throws rn::ValueError
// naming the shape otherwise.
void validate_problem(const ConvParams& params, const GraphConstants& constants);

// Builds (and finalizes) every tensor, the convolution descriptor and every operation of `params`.
// Throws rn::ValueError for a malformed problem (naming its shape) and CudnnError when cuDNN rejects a part.
// Test hooks: `validate=false` skips validate_problem (so cuDNN's own checks are reached); `fail_after_parts`
// >= 0 throws a CudnnError once that many parts exist (to prove a half-built graph is released).
ConvOpGraph build_conv_operations(const ConvParams& params, const GraphConstants& constants, bool validate = true,
                                  int fail_after_parts = -1);

// Creates and finalizes the operation graph over `g.operations` (needs a cuDNN handle, hence a GPU).
void finalize_op_graph(ConvOpGraph& g, cudnnHandle_t handle);

// "graph conv forward fp16 NHWC x=(N,C,H,W) w=(K,C/g,R,S) y=(N,K,P,Q) pad=(1,1) stride=(1,1) dilation=(1,1)
// groups=1 epilogue=bias+residual+relu": names the problem in errors.
std::string describe_problem(const ConvParams& params);

}  // namespace rn::graph
