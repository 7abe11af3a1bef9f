// Conversion between the storage dtypes (fp32, fp16, bf16 held in uint16 arrays): through fp32, rounding to
// nearest even once, so fp32 -> fp16 matches numpy's astype bit for bit and bf16 is rounded, not truncated.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"

namespace rn::kernels {

// out[i] = in[i] converted to out's dtype, or with `accumulate` out[i] += in[i] (the sum in fp32, rounded once to
// out's dtype: a low-precision gradient added into its fp32 master in one pass). Same element count (checked by
// the caller); no overlap unless `in` and `out` are the same array of one dtype.
void cast(const TensorView& in, const TensorView& out, bool accumulate, cudaStream_t stream);

}  // namespace rn::kernels
