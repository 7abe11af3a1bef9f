#include "conv_op_graph.h"

#include <string>
#include <utility>

#include "../../core/error.h"
#include "../conv_geometry.h"
#include "backend_attr.h"
#include "backend_tensor.h"

namespace rn::graph {
namespace {

std::string tuple4(const int32_t* v) {
  return "(" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) + ", " +
         std::to_string(v[3]) + ")";
}

std::string pair(const int32_t* v) {
  return "(" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ")";
}

std::array<int64_t, 4> dims_of(const int32_t* v) {
  return {v[0], v[1], v[2], v[3]};
}

// Accumulates the parts of a graph in `g` as they are built; a part is owned by `g` from the moment it exists.
class GraphBuilder {
 public:
  GraphBuilder(ConvOpGraph& g, const ConvParams& p, int fail_after_parts)
      : g_(g), p_(p), fail_after_(fail_after_parts) {
    maybe_fail();
  }

  cudnnBackendDescriptor_t keep(BackendDescriptor d, cudnnBackendDescriptorType_t type) {
    const cudnnBackendDescriptor_t raw = d.get();
    g_.parts.push_back(std::move(d));
    g_.part_types.push_back(type);
    maybe_fail();
    return raw;
  }

  cudnnBackendDescriptor_t tensor(const TensorSpec& spec) {
    return keep(make_tensor(spec), CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  }

  cudnnBackendDescriptor_t operation(BackendDescriptor op, cudnnBackendDescriptorType_t type) {
    const cudnnBackendDescriptor_t raw = keep(std::move(op), type);
    g_.operations.push_back(raw);
    return raw;
  }

 private:
  void maybe_fail() {
    if (fail_after_ >= 0 && static_cast<int>(g_.parts.size()) >= fail_after_) {
      throw CudnnError(CUDNN_STATUS_INTERNAL_ERROR, "graph builder: injected failure after " +
                                                        std::to_string(g_.parts.size()) + " parts while building " +
                                                        describe_problem(p_));
    }
  }

  ConvOpGraph& g_;
  const ConvParams& p_;
  int fail_after_;
};

// The accumulator's type: int32 for int8 data (exact), else fp32 (TF32 vs strict fp32 is decided by engine
// filtering).
cudnnDataType_t accumulator_type(const ConvParams& p) {
  return static_cast<Precision>(p.precision) == Precision::INT8 ? CUDNN_DATA_INT32 : CUDNN_DATA_FLOAT;
}

BackendDescriptor make_convolution(const ConvParams& p) {
  BackendDescriptor c = make_backend(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  set_data_type(c.get(), CUDNN_ATTR_CONVOLUTION_COMP_TYPE, accumulator_type(p));
  set_enum(c.get(), CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, CUDNN_CROSS_CORRELATION);
  set_int64(c.get(), CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2);
  set_int64s(c.get(), CUDNN_ATTR_CONVOLUTION_DILATIONS, {p.dilation[0], p.dilation[1]});
  set_int64s(c.get(), CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {p.stride[0], p.stride[1]});
  set_int64s(c.get(), CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {p.pad[0], p.pad[1]});
  set_int64s(c.get(), CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {p.pad[0], p.pad[1]});
  finalize(c.get());
  return c;
}

BackendDescriptor make_pointwise(cudnnPointwiseMode_t mode) {
  BackendDescriptor d = make_backend(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  set_enum(d.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode);
  set_data_type(d.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
  finalize(d.get());
  return d;
}

// A pointwise operation y = op(alpha1 * x, alpha2 * b); `b` is null for unary modes (ReLU).
BackendDescriptor make_pointwise_op(cudnnBackendDescriptor_t pw, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                    cudnnBackendDescriptor_t y, const float* alpha1, const float* alpha2) {
  BackendDescriptor op = make_backend(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b) set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
  set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  if (alpha1) set_float(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, *alpha1);
  if (alpha2) set_float(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, *alpha2);
  finalize(op.get());
  return op;
}

struct ConvOpAttrs {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

ConvOpAttrs conv_op_attrs(ConvDirection direction) {
  switch (direction) {
    case ConvDirection::Forward:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case ConvDirection::BackwardData:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case ConvDirection::BackwardFilter:
      break;
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

BackendDescriptor make_conv_op(const ConvOpAttrs& a, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                               cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t conv, float alpha, float beta) {
  BackendDescriptor op = make_backend(a.type);
  set_descriptor(op.get(), a.x, x);
  set_descriptor(op.get(), a.w, w);
  set_descriptor(op.get(), a.y, y);
  set_descriptor(op.get(), a.conv, conv);
  set_float(op.get(), a.alpha, alpha);
  set_float(op.get(), a.beta, beta);
  finalize(op.get());
  return op;
}

}  // namespace

std::string describe_problem(const ConvParams& p) {
  const auto precision = static_cast<Precision>(p.precision);
  const auto layout = static_cast<Layout>(p.layout);
  std::string s = std::string("graph conv ") + direction_label(static_cast<ConvDirection>(p.direction)) + " " +
                  (p.precision <= 5 ? precision_name(precision) : "?") + " " +
                  (p.layout <= 1 ? layout_name(layout) : "?") + " x=" + tuple4(p.x) + " w=" + tuple4(p.w) +
                  " y=" + tuple4(p.y) + " pad=" + pair(p.pad) + " stride=" + pair(p.stride) +
                  " dilation=" + pair(p.dilation) + " groups=" + std::to_string(p.groups);
  if (p.direction == static_cast<uint8_t>(ConvDirection::Forward)) s += " epilogue=" + epilogue_name(p.epilogue);
  if (p.out_dtype != 0) s += std::string(" out=") + dtype_short_name(p.y_dtype());
  if (p.deterministic) s += " deterministic";
  return s;
}

void validate_problem(const ConvParams& p, const GraphConstants& c) {
  auto fail = [&](const std::string& why) { throw ValueError(why + " in " + describe_problem(p)); };
  if (p.direction > 2) fail("invalid direction " + std::to_string(p.direction));
  if (p.precision > 5) fail("invalid precision " + std::to_string(p.precision));
  if (p.layout > 1) fail("invalid layout " + std::to_string(p.layout));
  for (int i = 0; i < 4; ++i) {
    if (p.x[i] <= 0 || p.w[i] <= 0 || p.y[i] <= 0) fail("every dimension must be positive");
  }
  for (int i = 0; i < 2; ++i) {
    if (p.pad[i] < 0 || p.stride[i] < 1 || p.dilation[i] < 1) fail("pad must be >= 0, stride and dilation >= 1");
  }
  if (p.groups < 1) fail("groups must be >= 1");
  // Groups are implicit in the graph API: the filter's channel dimension is C / groups.
  if (int64_t(p.w[1]) * p.groups != p.x[1]) fail("input channels must equal filter channels * groups");
  if (p.w[0] % p.groups != 0) fail("output channels must be divisible by groups");
  if (p.y[0] != p.x[0] || p.y[1] != p.w[0]) fail("output must have shape (N, K, P, Q)");
  for (int i = 0; i < 2; ++i) {
    const int64_t out = conv_output_extent(p.x[2 + i], p.w[2 + i], p.pad[i], p.stride[i], p.dilation[i]);
    if (out != p.y[2 + i]) {
      fail("output spatial size " + std::to_string(p.y[2 + i]) + " does not match the convolution (expected " +
           std::to_string(out) + ")");
    }
  }
  const bool forward = p.direction == static_cast<uint8_t>(ConvDirection::Forward);
  if (!forward && p.epilogue != kEpilogueNone) fail("epilogues exist only for the forward direction");
  if (p.epilogue & ~kEpilogueAll) fail("unknown epilogue flags");
  if (p.epilogue != kEpilogueNone && c.beta != 0.0f) fail("beta must be 0 with a fused epilogue");
  const auto precision = static_cast<Precision>(p.precision);
  if (!is_quantized(precision)) {
    if (p.epilogue & kEpilogueScale) fail("the per-channel scale exists only for int8 / fp8");
    if (p.out_dtype != 0) fail("y's dtype is the storage dtype outside int8 / fp8");
    return;
  }
  if (!forward) fail("int8 / fp8 convolutions are forward only (inference)");
  if (static_cast<Layout>(p.layout) != Layout::NHWC) fail("int8 / fp8 convolutions need the NHWC layout");
  if (!(p.epilogue & kEpilogueScale)) fail("an int8 / fp8 convolution needs its per-channel scale");
  if (c.alpha1 != 1.0f) fail("alpha1 must be 1 with a per-channel scale");
  const DType y = p.y_dtype();
  if (y != storage_dtype(precision) && y != DType::F16 && y != DType::F32) {
    fail(std::string("y's dtype must be ") + dtype_short_name(storage_dtype(precision)) + ", fp16 or fp32");
  }
}

ConvOpGraph build_conv_operations(const ConvParams& p, const GraphConstants& c, bool validate, int fail_after_parts) {
  if (validate) validate_problem(p, c);
  ConvOpGraph g;
  GraphBuilder b(g, p, fail_after_parts);

  const auto layout = static_cast<Layout>(p.layout);
  const bool quantized = is_quantized(static_cast<Precision>(p.precision));
  const cudnnDataType_t storage = cudnn_dtype(storage_dtype(static_cast<Precision>(p.precision)));
  const auto direction = static_cast<ConvDirection>(p.direction);

  // x, w and z are in the storage dtype; y in its own (quantised forward: int8 / fp8, or fp16 / fp32 out of the
  // last quantised layer); the quantised forward's bias and scale are fp32.
  auto io_dtype = [&](TensorUid uid) {
    if (uid == kUidY) return cudnn_dtype(p.y_dtype());
    if (uid == kUidScale || (uid == kUidBias && quantized)) return CUDNN_DATA_FLOAT;
    return storage;
  };
  auto io_tensor = [&](TensorUid uid, const std::array<int64_t, 4>& dims) {
    TensorSpec spec;
    spec.dims = dims;
    spec.strides = layout_strides(dims, layout);
    spec.dtype = io_dtype(uid);
    spec.uid = uid;
    spec.alignment = c.alignment[uid];
    g.io_uids.push_back(uid);
    return b.tensor(spec);
  };
  auto virtual_tensor = [&](TensorUid uid) {
    TensorSpec spec;
    spec.dims = dims_of(p.y);
    spec.strides = layout_strides(spec.dims, layout);
    spec.dtype = uid == kUidConvOut ? accumulator_type(p) : CUDNN_DATA_FLOAT;
    spec.uid = uid;
    spec.is_virtual = true;
    return b.tensor(spec);
  };

  const cudnnBackendDescriptor_t x = io_tensor(kUidX, dims_of(p.x));
  const cudnnBackendDescriptor_t w = io_tensor(kUidW, dims_of(p.w));
  const cudnnBackendDescriptor_t conv = b.keep(make_convolution(p), CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const ConvOpAttrs attrs = conv_op_attrs(direction);

  const bool has_scale = p.epilogue & kEpilogueScale;
  const bool has_bias = p.epilogue & kEpilogueBias;
  const bool has_residual = p.epilogue & kEpilogueResidual;
  const bool has_relu = p.epilogue & kEpilogueRelu;
  if (direction != ConvDirection::Forward || p.epilogue == kEpilogueNone) {
    const cudnnBackendDescriptor_t y = io_tensor(kUidY, dims_of(p.y));
    b.operation(make_conv_op(attrs, x, w, y, conv, c.alpha1, c.beta), attrs.type);
    return g;
  }

  // Fused forward: conv -> [* scale] -> [alpha1 * . + alpha2 * z] -> [+ bias] -> [relu], fp32 virtual tensors in
  // between; the last operation writes y. With a residual, alpha1 is applied by the add (as cuDNN's fused
  // engines expect); otherwise by the convolution.
  const cudnnBackendDescriptor_t y = io_tensor(kUidY, dims_of(p.y));
  const cudnnBackendDescriptor_t z = has_residual ? io_tensor(kUidZ, dims_of(p.y)) : nullptr;
  const cudnnBackendDescriptor_t bias =
      has_bias ? io_tensor(kUidBias, {1, p.y[1], 1, 1}) : static_cast<cudnnBackendDescriptor_t>(nullptr);
  const cudnnBackendDescriptor_t scale =
      has_scale ? io_tensor(kUidScale, {1, p.y[1], 1, 1}) : static_cast<cudnnBackendDescriptor_t>(nullptr);

  const int remaining = int(has_scale) + int(has_residual) + int(has_bias) + int(has_relu);
  int emitted = 0;
  // The output of the next operation: y for the last one, else a fresh virtual tensor.
  auto next_output = [&](TensorUid virtual_uid) { return ++emitted == remaining ? y : virtual_tensor(virtual_uid); };

  cudnnBackendDescriptor_t current = virtual_tensor(kUidConvOut);
  b.operation(make_conv_op(attrs, x, w, current, conv, has_residual ? 1.0f : c.alpha1, 0.0f), attrs.type);

  if (has_scale) {
    const cudnnBackendDescriptor_t mul =
        b.keep(make_pointwise(CUDNN_POINTWISE_MUL), CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnBackendDescriptor_t out = next_output(kUidAfterScale);
    b.operation(make_pointwise_op(mul, current, scale, out, nullptr, nullptr),
                CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    current = out;
  }
  if (has_residual || has_bias) {
    const cudnnBackendDescriptor_t add =
        b.keep(make_pointwise(CUDNN_POINTWISE_ADD), CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    if (has_residual) {
      const cudnnBackendDescriptor_t out = next_output(kUidAfterResidual);
      b.operation(make_pointwise_op(add, current, z, out, &c.alpha1, &c.alpha2),
                  CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
      current = out;
    }
    if (has_bias) {
      const cudnnBackendDescriptor_t out = next_output(kUidAfterBias);
      b.operation(make_pointwise_op(add, current, bias, out, nullptr, nullptr),
                  CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
      current = out;
    }
  }
  if (has_relu) {
    const cudnnBackendDescriptor_t relu =
        b.keep(make_pointwise(CUDNN_POINTWISE_RELU_FWD), CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnBackendDescriptor_t out = next_output(kUidAfterBias);  // always y: relu is last
    b.operation(make_pointwise_op(relu, current, nullptr, out, nullptr, nullptr),
                CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  }
  return g;
}

void finalize_op_graph(ConvOpGraph& g, cudnnHandle_t handle) {
  BackendDescriptor graph = make_backend(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set_handle(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle);
  set_descriptors(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, g.operations);
  finalize(graph.get());
  g.graph = std::move(graph);
}

}  // namespace rn::graph
