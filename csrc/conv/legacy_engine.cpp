#include "legacy_engine.h"

#include <algorithm>
#include <memory>

#include "../core/error.h"
#include "../core/workspace.h"
#include "legacy_algo_names.h"
#include "legacy_descriptors.h"

namespace rn::legacy {
namespace {

// One row of cudnnFind*/cudnnGet*_v7 results, whatever the direction.
struct Candidate {
  int algo = -1;
  cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
  float time_ms = -1.0f;
  cudnnDeterminism_t determinism = CUDNN_NON_DETERMINISTIC;
  cudnnMathType_t math_type = CUDNN_DEFAULT_MATH;
};

// A candidate that passed the filters, with the workspace it needs under the math type it will run with.
struct Picked {
  int algo;
  cudnnMathType_t math_type;
  size_t workspace;
  float time_ms;
};

ConvDirection direction_of(const ConvParams& p) {
  return static_cast<ConvDirection>(p.direction);
}
Precision precision_of(const ConvParams& p) {
  return static_cast<Precision>(p.precision);
}
int algo_count(ConvDirection d) {
  return static_cast<int>(algo_names(d).size());
}

template <class Perf>
std::vector<Candidate> to_candidates(const std::vector<Perf>& perf, int count) {
  std::vector<Candidate> out;
  for (int i = 0; i < count && i < static_cast<int>(perf.size()); ++i) {
    Candidate c;
    c.algo = static_cast<int>(perf[i].algo);
    c.status = perf[i].status;
    c.time_ms = perf[i].time;
    c.determinism = perf[i].determinism;
    c.math_type = perf[i].mathType;
    out.push_back(c);
  }
  return out;
}

// The math type a candidate runs with under the precision, or nullopt when the precision forbids it. Strict
// fp32 runs every algorithm with FMA math whatever the search reported; TF32 and bf16 data must not be
// down-converted to fp16.
std::optional<cudnnMathType_t> run_math_type(Precision precision, cudnnMathType_t reported) {
  switch (precision) {
    case Precision::FP32:
      return CUDNN_FMA_MATH;
    case Precision::FP16:
      return reported;
    case Precision::TF32:
    case Precision::BF16:
      if (reported == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return std::nullopt;
      return reported;
  }
  return std::nullopt;
}

cudnnStatus_t workspace_size(ConvDirection dir, cudnnHandle_t h, const ConvDescriptors& d, int algo, size_t* bytes) {
  switch (dir) {
    case ConvDirection::Forward:
      return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
    case ConvDirection::BackwardData:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
    case ConvDirection::BackwardFilter:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

std::vector<Candidate> heuristic_candidates(ConvDirection dir, cudnnHandle_t h, const ConvDescriptors& d) {
  int max_count = 0, returned = 0;
  switch (dir) {
    case ConvDirection::Forward: {
      RN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max_count, 1));
      RN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                            static_cast<int>(perf.size()), &returned, perf.data()));
      return to_candidates(perf, returned);
    }
    case ConvDirection::BackwardData: {
      RN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(std::max(max_count, 1));
      RN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), static_cast<int>(perf.size()), &returned, perf.data()));
      return to_candidates(perf, returned);
    }
    case ConvDirection::BackwardFilter: {
      RN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(std::max(max_count, 1));
      RN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), static_cast<int>(perf.size()), &returned, perf.data()));
      return to_candidates(perf, returned);
    }
  }
  return {};
}

// Times every algorithm on the given buffers (`out` receives the results of each run).
std::vector<Candidate> find_candidates(ConvDirection dir, cudnnHandle_t h, const ConvDescriptors& d,
                                       const ConvOperands& ops, void* out, void* ws, size_t ws_size) {
  int max_count = 0, returned = 0;
  switch (dir) {
    case ConvDirection::Forward: {
      RN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max_count, 1));
      RN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x.get(), ops.x.data, d.w.get(), ops.w.data,
                                                            d.conv.get(), d.y.get(), out, static_cast<int>(perf.size()),
                                                            &returned, perf.data(), ws, ws_size));
      return to_candidates(perf, returned);
    }
    case ConvDirection::BackwardData: {
      RN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(std::max(max_count, 1));
      RN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, d.w.get(), ops.w.data, d.y.get(), ops.y.data, d.conv.get(), d.x.get(), out, static_cast<int>(perf.size()),
          &returned, perf.data(), ws, ws_size));
      return to_candidates(perf, returned);
    }
    case ConvDirection::BackwardFilter: {
      RN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(std::max(max_count, 1));
      RN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          h, d.x.get(), ops.x.data, d.y.get(), ops.y.data, d.conv.get(), d.w.get(), out, static_cast<int>(perf.size()),
          &returned, perf.data(), ws, ws_size));
      return to_candidates(perf, returned);
    }
  }
  return {};
}

void execute(ConvDirection dir, cudnnHandle_t h, const ConvDescriptors& d, int algo, const ConvOperands& ops, void* ws,
             size_t ws_size) {
  const float alpha = ops.alpha1;
  const float beta = ops.beta;
  switch (dir) {
    case ConvDirection::Forward:
      RN_CUDNN_CHECK(cudnnConvolutionForward(h, &alpha, d.x.get(), ops.x.data, d.w.get(), ops.w.data, d.conv.get(),
                                             static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, ws_size, &beta,
                                             d.y.get(), ops.y.data));
      return;
    case ConvDirection::BackwardData:
      RN_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &alpha, d.w.get(), ops.w.data, d.y.get(), ops.y.data, d.conv.get(),
                                                  static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, ws_size, &beta,
                                                  d.x.get(), ops.x.data));
      return;
    case ConvDirection::BackwardFilter:
      RN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &alpha, d.x.get(), ops.x.data, d.y.get(), ops.y.data,
                                                    d.conv.get(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo),
                                                    ws, ws_size, &beta, d.w.get(), ops.w.data));
      return;
  }
}

// The first candidate, in the given order, that succeeded, passes the determinism and math filters, needs at
// most `max_workspace` bytes (and at most the cap) and whose workspace the pool can give now.
std::optional<Picked> first_fitting(const ConvParams& params, DescriptorGroups& groups,
                                    const std::vector<Candidate>& candidates, size_t max_workspace, cudnnHandle_t h,
                                    cudaStream_t stream) {
  const ConvDirection dir = direction_of(params);
  WorkspacePool& pool = WorkspacePool::current();
  for (const Candidate& c : candidates) {
    if (c.status != CUDNN_STATUS_SUCCESS || c.algo < 0 || c.algo >= algo_count(dir)) continue;
    if (params.deterministic && c.determinism != CUDNN_DETERMINISTIC) continue;
    const std::optional<cudnnMathType_t> math = run_math_type(precision_of(params), c.math_type);
    if (!math) continue;
    // The workspace of the algorithm under the math type it will really run with.
    size_t bytes = 0;
    if (workspace_size(dir, h, groups.get(*math), c.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    if (bytes > max_workspace || bytes > params.workspace_cap) continue;
    if (bytes > 0 && pool.try_get_for_choice(bytes, stream) == nullptr) continue;
    return Picked{c.algo, *math, bytes, c.time_ms};
  }
  return std::nullopt;
}

size_t round_up(size_t bytes, size_t to) {
  return (bytes + to - 1) / to * to;
}

// Find mode. Returns nullopt, without searching, when not even the scratch output of an accumulating
// backward-filter call fits in the workspace pool.
std::optional<Picked> find_fastest(const ConvParams& params, const ConvOperands& ops, DescriptorGroups& groups,
                                   cudnnHandle_t h, cudaStream_t stream, bool* searched) {
  const ConvDirection dir = direction_of(params);
  const ConvDescriptors& d = groups.get(cudnn_math_type(precision_of(params)));
  WorkspacePool& pool = WorkspacePool::current();
  // Largest first: every algorithm's workspace (within the cap), so that Find can try them all when memory allows.
  std::vector<size_t> sizes{0};
  for (int algo = 0; algo < algo_count(dir); ++algo) {
    size_t bytes = 0;
    if (workspace_size(dir, h, d, algo, &bytes) == CUDNN_STATUS_SUCCESS && bytes <= params.workspace_cap) {
      sizes.push_back(bytes);
    }
  }
  std::sort(sizes.begin(), sizes.end(), [](size_t a, size_t b) { return a > b; });
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

  // Find writes every candidate's result into the output. An accumulating call (beta != 0) must keep what its
  // output holds, so its search writes into scratch space at the start of the pool buffer instead.
  const TensorView& result = dir == ConvDirection::Forward ? ops.y : dir == ConvDirection::BackwardData ? ops.x : ops.w;
  void* out = result.data;
  const bool scratch_output = ops.beta != 0.0f;
  const size_t scratch = scratch_output ? round_up(result.nbytes(), 256) : 0;
  void* base = nullptr;
  size_t ws_size = 0;
  bool have = false;
  for (size_t bytes : sizes) {
    const size_t total = scratch + bytes;
    if (total > params.workspace_cap) continue;
    base = pool.try_get_for_search(total, stream);
    if (base != nullptr || total == 0) {
      ws_size = bytes;
      have = true;
      break;
    }
  }
  if (!have) return std::nullopt;
  if (scratch_output) out = base;
  void* ws = ws_size > 0 ? static_cast<char*>(base) + scratch : nullptr;
  const std::vector<Candidate> timed = find_candidates(dir, h, d, ops, out, ws, ws_size);
  *searched = true;
  // cuDNN returns the results fastest first.
  return first_fitting(params, groups, timed, ws_size, h, stream);
}

// The first heuristic candidate that fits (any workspace up to `max_workspace`).
std::optional<Picked> first_heuristic_fitting(const ConvParams& params, DescriptorGroups& groups, size_t max_workspace,
                                              cudnnHandle_t h, cudaStream_t stream) {
  const ConvDescriptors& d = groups.get(cudnn_math_type(precision_of(params)));
  return first_fitting(params, groups, heuristic_candidates(direction_of(params), h, d), max_workspace, h, stream);
}

// The plain convolution of params.direction with the descriptor groups of the call.
void run_plain(const ConvParams& params, const AlgoChoice& choice, const ConvOperands& ops, DescriptorGroups& groups,
               cudnnHandle_t handle, cudaStream_t stream) {
  const ConvDirection dir = direction_of(params);
  WorkspacePool& pool = WorkspacePool::current();
  void* ws = pool.try_get_for_choice(choice.workspace, stream);
  if (ws != nullptr || choice.workspace == 0) {
    execute(dir, handle, groups.get(static_cast<cudnnMathType_t>(choice.math_type)), choice.algo, ops, ws,
            choice.workspace);
    return;
  }
  // The chosen algorithm's workspace cannot be had now: the best candidate that needs less.
  const std::optional<Picked> alt = first_heuristic_fitting(params, groups, choice.workspace - 1, handle, stream);
  if (!alt) {
    throw CudaError(cudaErrorMemoryAllocation,
                    "no convolution algorithm fits in the workspace that can be allocated (" +
                        algo_name(dir, choice.algo) + " needs " + std::to_string(choice.workspace) +
                        " bytes): " + params.to_string());
  }
  execute(dir, handle, groups.get(alt->math_type), alt->algo, ops, pool.try_get(alt->workspace, stream),
          alt->workspace);
}

// Forward with the epilogue in one cudnnConvolutionBiasActivationForward call; std::nullopt when it ran, else why
// not (the caller then recomputes all of y unfused).
std::optional<FusionRefusal> try_fused(const ConvParams& params, const AlgoChoice& choice, const ConvOperands& ops,
                                       const ConvDescriptors& d, cudnnHandle_t handle, cudaStream_t stream) {
  if (!(params.epilogue & kEpilogueBias)) {
    return FusionRefusal{"unfused: cudnnConvolutionBiasActivationForward needs a bias", true};
  }
  const bool relu = params.epilogue & kEpilogueRelu;
  if (!relu && choice.algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) {
    return FusionRefusal{"unfused: identity activation needs IMPLICIT_PRECOMP_GEMM, the algorithm is " +
                             algo_name(ConvDirection::Forward, choice.algo),
                         true};
  }
  void* ws = WorkspacePool::current().try_get_for_choice(choice.workspace, stream);
  if (ws == nullptr && choice.workspace > 0) return FusionRefusal{"unfused: workspace unavailable", false};

  const void* z = ops.z.data;
  float alpha2 = ops.alpha2;
  if (!(params.epilogue & kEpilogueResidual)) {
    // The call always reads z. Without a residual, z is y with alpha2 = 0; y is zeroed first because 0 * NaN
    // (whatever the output held) would still be NaN.
    RN_CUDA_CHECK(cudaMemsetAsync(ops.y.data, 0, ops.y.nbytes(), stream));
    z = ops.y.data;
    alpha2 = 0.0f;
  }
  const float alpha1 = ops.alpha1;
  const cudnnStatus_t status = cudnnConvolutionBiasActivationForward(
      handle, &alpha1, d.x.get(), ops.x.data, d.w.get(), ops.w.data, d.conv.get(),
      static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo), ws, choice.workspace, &alpha2, d.y.get(), z, d.bias.get(),
      ops.bias.data, relu ? d.relu.get() : d.identity.get(), d.y.get(), ops.y.data);
  if (status == CUDNN_STATUS_SUCCESS) return std::nullopt;
  const int category = CUDNN_STATUS_CATEGORY(status);
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM ||
      category == CUDNN_STATUS_INTERNAL_ERROR) {
    // cuDNN refused this combination (or could not build its kernel, e.g. a runtime-fusion compile failure).
    // Falling back is safe whatever ran: the unfused path recomputes all of y from inputs y does not overlap.
    return FusionRefusal{"unfused: cudnnConvolutionBiasActivationForward returned " + cudnn_status_name(status), true};
  }
  throw_cudnn_error(status, "cudnnConvolutionBiasActivationForward", __FILE__, __LINE__);
}

// The epilogue as separate calls: convolution, cudnnAddTensor (bias), cudnnAddTensor (alpha2 * z),
// cudnnActivationForward (ReLU), the last three in place on y. `d`: the group of the choice's math type.
void run_unfused(const ConvParams& params, const AlgoChoice& choice, const ConvOperands& ops, DescriptorGroups& groups,
                 const ConvDescriptors& d, cudnnHandle_t handle, cudaStream_t stream) {
  ConvOperands conv_ops = ops;
  conv_ops.beta = 0.0f;
  run_plain(params, choice, conv_ops, groups, handle, stream);
  const float one = 1.0f, zero = 0.0f, alpha2 = ops.alpha2;
  if (params.epilogue & kEpilogueBias) {
    RN_CUDNN_CHECK(cudnnAddTensor(handle, &one, d.bias.get(), ops.bias.data, &one, d.y.get(), ops.y.data));
  }
  if (params.epilogue & kEpilogueResidual) {
    RN_CUDNN_CHECK(cudnnAddTensor(handle, &alpha2, d.y.get(), ops.z.data, &one, d.y.get(), ops.y.data));
  }
  if (params.epilogue & kEpilogueRelu) {
    RN_CUDNN_CHECK(
        cudnnActivationForward(handle, d.relu.get(), &one, d.y.get(), ops.y.data, &zero, d.y.get(), ops.y.data));
  }
}

[[noreturn]] void throw_no_algorithm(const ConvParams& params) {
  std::string why = "no cuDNN legacy convolution algorithm supports " + params.to_string();
  if (params.deterministic) why += " (deterministic algorithms only)";
  if (params.workspace_cap != UINT64_MAX) {
    why += " within the workspace limit of " + std::to_string(params.workspace_cap) + " bytes";
  }
  throw CudnnError(CUDNN_STATUS_NOT_SUPPORTED, why);
}

}  // namespace

AlgoChoice choose(const ConvParams& params, const ConvOperands& ops, cudnnHandle_t handle, cudaStream_t stream) {
  const ConvDirection dir = direction_of(params);
  const AlgoMode mode = static_cast<AlgoMode>(params.algo_mode);
  const int fixed_algo = params.fixed_algo;
  const cudnnMathType_t search_math = cudnn_math_type(precision_of(params));
  DescriptorGroups groups(params);

  AlgoChoice choice;
  choice.engine = static_cast<uint8_t>(ConvEngineKind::Legacy);
  choice.mode = static_cast<uint8_t>(mode);
  std::optional<Picked> picked;
  if (mode == AlgoMode::Fixed) {
    if (fixed_algo < 0 || fixed_algo >= algo_count(dir)) {
      throw ValueError("algo: " + std::to_string(fixed_algo) + " is not a " + direction_key(dir) +
                       " algorithm of the legacy engine");
    }
    if (params.deterministic && !algo_is_deterministic(dir, fixed_algo)) {
      throw ValueError("algo: " + algo_name(dir, fixed_algo) + " is non-deterministic, but deterministic=True");
    }
    const cudnnMathType_t math = *run_math_type(precision_of(params), search_math);
    size_t bytes = 0;
    const cudnnStatus_t status = workspace_size(dir, handle, groups.get(math), fixed_algo, &bytes);
    if (status != CUDNN_STATUS_SUCCESS) {
      throw ValueError("algo: " + algo_name(dir, fixed_algo) + " does not support this convolution (" +
                       cudnn_status_name(status) + "): " + params.to_string());
    }
    if (bytes <= params.workspace_cap && (bytes == 0 || WorkspacePool::current().try_get_for_choice(bytes, stream))) {
      picked = Picked{fixed_algo, math, bytes, -1.0f};
    } else {
      // Its workspace cannot be had (cap or out of memory): the best candidate that fits instead.
      picked = first_heuristic_fitting(params, groups, SIZE_MAX, handle, stream);
      choice.mode = static_cast<uint8_t>(AlgoMode::Heuristic);
    }
  } else if (mode == AlgoMode::Find) {
    bool searched = false;
    picked = find_fastest(params, ops, groups, handle, stream, &searched);
    if (!searched) {
      picked = first_heuristic_fitting(params, groups, SIZE_MAX, handle, stream);
      choice.mode = static_cast<uint8_t>(AlgoMode::Heuristic);
    }
  } else {
    picked = first_heuristic_fitting(params, groups, SIZE_MAX, handle, stream);
  }
  if (!picked) throw_no_algorithm(params);
  choice.algo = picked->algo;
  choice.math_type = static_cast<int32_t>(picked->math_type);
  choice.workspace = picked->workspace;
  choice.time_ms = picked->time_ms;
  return choice;
}

void run(const ConvParams& params, const AlgoChoice& choice, const ConvOperands& ops, cudnnHandle_t handle,
         cudaStream_t stream) {
  DescriptorGroups groups(params);
  run_plain(params, choice, ops, groups, handle, stream);
}

std::optional<FusionRefusal> run_forward_epilogue(const ConvParams& params, const AlgoChoice& choice,
                                                  const ConvOperands& ops, bool try_fusion, cudnnHandle_t handle,
                                                  cudaStream_t stream) {
  DescriptorGroups groups(params);
  const ConvDescriptors& d = groups.get(static_cast<cudnnMathType_t>(choice.math_type));
  std::optional<FusionRefusal> refusal;
  if (try_fusion) {
    refusal = try_fused(params, choice, ops, d, handle, stream);
    if (!refusal) return std::nullopt;
  }
  run_unfused(params, choice, ops, groups, d, handle, stream);
  return refusal;
}

}  // namespace rn::legacy
