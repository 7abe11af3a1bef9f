// The MLPerf ResNet fusion graphs as cudnn-frontend's own samples build them, the forms cuDNN's "specialized
// pre-compiled engines" are documented for (ConvBNfprop, DBARCS, ConvBNwgrad, DgradDreluBNBwdWeight). Each graph
// copies its sample's data types (graph io / intermediate / compute, per tensor where the sample sets one), its
// NHWC activations and KRSC filters, its virtual intermediates (every tensor not marked as an output) and its
// attribute calls; only the shapes are the ResNet layer's, and bf16 replaces HALF in a bf16 run.
// Samples read: NVIDIA/cudnn-frontend samples/cpp/convolution/{fprop,wgrads,dgrads}.cpp (the repository at
// frontend 1.23), and for the dual prologue samples/legacy_samples/fusion_sample.cpp run_dsbar (removed after 1.10).
#include "probe_fusions.h"

namespace probe {
namespace {

using PW = fe::PointwiseMode_t;

fe::graph::Conv_fprop_attributes fprop_options(const Layer& l) {
  return fe::graph::Conv_fprop_attributes()
      .set_padding({l.pad(), l.pad()})
      .set_stride({l.stride, l.stride})
      .set_dilation({1, 1});
}

// The statistics of Y, as the SBRCS sample: outputs SUM and SQ_SUM set to FLOAT, Y itself in the io type.
void genstats(Probe& pr, const TensorPtr& y) {
  pr.output(y);
  auto [sum, sq_sum] = pr.graph.genstats(y, fe::graph::Genstats_attributes());
  pr.output(sum, DataType::FLOAT);
  pr.output(sq_sum, DataType::FLOAT);
}

// x * scale + bias, scale and bias {1, c, 1, 1} in the io type (the samples leave their type unset).
TensorPtr scale_bias(Probe& pr, const TensorPtr& x, int64_t c, const std::string& tag) {
  auto s = pr.channel("scale" + tag, c), b = pr.channel("bias" + tag, c);
  return pr.pw(pr.pw(x, s, PW::MUL), b, PW::ADD);
}

}  // namespace

bool build_specialized(Probe& pr, const std::string& pattern, const Layer& l, DataType io) {
  const int64_t p = l.p(), q = l.q();
  if (pattern == "sbrcs" || pattern == "conv_genstats") {
    // fprop.cpp TEST_CASE("SBRCS"): io HALF, intermediate FLOAT, compute FLOAT; relu(X * S + B) -> conv -> Y,
    // genstats(Y). ConvBNfprop; on compute capability 9.0 only this full form and conv + genstats are documented,
    // and conv_genstats is the sample without its prologue.
    pr.graph.set_io_data_type(io).set_intermediate_data_type(DataType::FLOAT).set_compute_data_type(DataType::FLOAT);
    TensorPtr x = pr.act("image", l.n, l.c, l.h, l.w);
    if (pattern == "sbrcs") x = pr.pw(scale_bias(pr, x, l.c, ""), PW::RELU_FWD);
    genstats(pr, pr.graph.conv_fprop(x, pr.filter(l), fprop_options(l)));
  } else if (pattern == "dbarcs" || pattern == "dbarcs_relu") {
    // DBARCS, dual scale-bias-add-ReLU + conv + genstats: the residual block's end, relu(X * S0 + B0 + Z * S1 + B1)
    // (bn3 of the block and the shortcut's batch norm) feeding the next block's 1x1 convolution. No graph-API
    // sample has it: the prologue is legacy run_dsbar's two scale-bias branches, add and ReLU (virtual FLOAT
    // intermediates), with the SBRCS sample's types for the rest (scale and bias in the io type, where run_dsbar
    // had FLOAT), and the SBRCS tail. dbarcs_relu also writes the ReLU output, which the next shortcut reads.
    pr.graph.set_io_data_type(io).set_intermediate_data_type(DataType::FLOAT).set_compute_data_type(DataType::FLOAT);
    auto x = pr.act("image", l.n, l.c, l.h, l.w), z = pr.act("residual", l.n, l.c, l.h, l.w);
    auto x_bn = scale_bias(pr, x, l.c, "0");
    auto z_bn = scale_bias(pr, z, l.c, "1");
    auto relu = pr.pw(pr.pw(x_bn, z_bn, PW::ADD), PW::RELU_FWD);
    if (pattern == "dbarcs_relu") pr.output(relu, io);
    genstats(pr, pr.graph.conv_fprop(relu, pr.filter(l), fprop_options(l)));
  } else if (pattern == "convbn_wgrad") {
    // wgrads.cpp TEST_CASE("scale-bias-relu-wgrad Graph") (ConvBNwgrad): io HALF, intermediate HALF, compute FLOAT;
    // DW = wgrad(DY, relu(X * S + B)), DW given its dims only (the frontend infers KRSC strides).
    pr.graph.set_io_data_type(io).set_intermediate_data_type(io).set_compute_data_type(DataType::FLOAT);
    auto x = pr.act("image", l.n, l.c, l.h, l.w);
    auto relu = pr.pw(scale_bias(pr, x, l.c, ""), PW::RELU_FWD);
    auto dy = pr.act("grad", l.n, l.k, p, q);
    auto dw = pr.graph.conv_wgrad(dy, relu,
                                  fe::graph::Conv_wgrad_attributes()
                                      .set_padding({l.pad(), l.pad()})
                                      .set_stride({l.stride, l.stride})
                                      .set_dilation({1, 1}));
    dw->set_dim({l.k, l.c, l.r, l.r});
    pr.output(dw);
  } else if (pattern == "dgrad_drelu_bnbwdw") {
    // dgrads.cpp TEST_CASE("Dgrad Drelu DBNweight Graph") (DgradDreluBNBwdWeight): io HALF, intermediate FLOAT,
    // compute FLOAT; dgrad(DY, W), ReLU backward against (X - M) * V * S + B with M, V, S, B FLOAT, the ReLU
    // backward written, dbn_weight's five outputs marked as outputs with no type set, so in the io type (the
    // sample's buffers are float; the first-set dgrad_drelu_dbn sets FLOAT, this one keeps the sample's graph).
    pr.graph.set_io_data_type(io).set_intermediate_data_type(DataType::FLOAT).set_compute_data_type(DataType::FLOAT);
    auto dy = pr.act("grad", l.n, l.k, p, q);
    auto dgrad = pr.graph.conv_dgrad(dy, pr.filter(l),
                                     fe::graph::Conv_dgrad_attributes()
                                         .set_padding({l.pad(), l.pad()})
                                         .set_stride({l.stride, l.stride})
                                         .set_dilation({1, 1}));
    dgrad->set_dim({l.n, l.c, l.h, l.w});
    auto x = pr.act("image", l.n, l.c, l.h, l.w);
    auto m = pr.channel("mean", l.c, DataType::FLOAT), v = pr.channel("inv_var", l.c, DataType::FLOAT);
    auto s = pr.channel("scale", l.c, DataType::FLOAT), b = pr.channel("bias", l.c, DataType::FLOAT);
    auto bn = pr.pw(pr.pw(pr.pw(pr.pw(x, m, PW::SUB), v, PW::MUL), s, PW::MUL), b, PW::ADD);
    auto drelu = pr.pw(dgrad, bn, PW::RELU_BWD);
    pr.output(drelu);
    auto [dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias] =
        pr.graph.dbn_weight(drelu, x, m, v, s, fe::graph::DBN_weight_attributes());
    for (const auto& t : {dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias}) pr.output(t);
  } else {
    return false;
  }
  return true;
}

}  // namespace probe
