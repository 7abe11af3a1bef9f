#include "select.h"

#include <stdexcept>
#include <tuple>
#include <vector>

#include "../core/error.h"
#include "registry.h"

namespace rn::ownconv {
namespace {

// A kernel marked preferred first (written for exactly this shape family, and measured faster), then persistent
// kernels (their epilogue overlaps the next tile's loads), then a plain GEMM where one can run the problem (a 1x1
// layer needs no im2col), then tiles without partly empty ones, then the larger (fewer CTAs, more reuse per load),
// then fewer mainloop stages (more CTAs per SM, one's epilogue overlapping another's mainloop).
auto preference(const ConvKernel& kernel, const ConvProblem& p) {
  const KernelInfo& i = kernel.info();
  const bool whole_tiles = p.k % i.tile_n == 0 && p.c % i.tile_k == 0;
  const int size = whole_tiles ? i.tile_m * i.tile_n * i.tile_k : -(i.tile_m * i.tile_n * i.tile_k);
  return std::make_tuple(i.preferred, i.persistent, i.gemm_1x1, whole_tiles, size, -i.stages);
}

std::string names_of(const std::vector<const ConvKernel*>& list) {
  std::string text;
  for (const ConvKernel* k : list) text += (text.empty() ? "" : ", ") + k->info().name;
  return text;
}

}  // namespace

std::string why_not(const ConvKernel& kernel, const ConvProblem& problem, DType dtype, Epilogue epilogue) {
  const KernelInfo& info = kernel.info();
  if (info.in != dtype) return std::string("takes ") + dtype_name(info.in) + " inputs";
  if (info.epilogue != epilogue) {
    return has_residual(info.epilogue) ? "needs a residual" : "takes no residual";
  }
  return kernel.unsupported(problem);
}

const ConvKernel& select_kernel(const ConvProblem& problem, DType dtype, Epilogue epilogue, const std::string& name,
                                const char* what) {
  const std::vector<const ConvKernel*>& all = kernels();
  if (all.empty()) {
    throw std::runtime_error("the own convolution kernels are not in this build (" + build_status().reason +
                             "): use the cuDNN path");
  }
  if (name != "auto") {
    const ConvKernel* kernel = find_kernel(name);
    if (kernel == nullptr) {
      throw ValueError(std::string(what) + ": expected 'auto' or one of " + names_of(all) + ", got '" + name + "'");
    }
    const std::string why = why_not(*kernel, problem, dtype, epilogue);
    if (!why.empty())
      throw ValueError(std::string(what) + ": '" + name + "' cannot run " + problem.describe() + ": " + why);
    return *kernel;
  }
  const ConvKernel* best = nullptr;
  std::string reasons;
  for (const ConvKernel* kernel : all) {
    const std::string why = why_not(*kernel, problem, dtype, epilogue);
    if (!why.empty()) {
      reasons += "; " + kernel->info().name + ": " + why;
      continue;
    }
    if (best == nullptr || preference(*kernel, problem) > preference(*best, problem)) best = kernel;
  }
  if (best == nullptr) {
    throw ValueError(std::string(what) + ": no compiled kernel can run " + problem.describe() + " (" +
                     epilogue_name(epilogue) + ")" + reasons);
  }
  return *best;
}

}  // namespace rn::ownconv
