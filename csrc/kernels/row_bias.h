// The fully connected layer's bias, forward and backward, on (N, C) float32 matrices (C-contiguous): the bias
// added to every row, and the bias gradient (the rows' sum), so that neither needs a runtime-compiled kernel.
// The views must already be validated by the caller (shapes, dtype, no overlap).
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"

namespace rn::kernels {

// y[n, c] += bias[c].
void add_row_bias(const TensorView& y, const TensorView& bias, cudaStream_t stream);
// out[c] = sum_n dy[n, c] (accumulate: out[c] += it), summed in float64 and rounded once. One block per 32
// columns: meant for a batch of logits, not for millions of rows.
void sum_rows(const TensorView& dy, const TensorView& out, bool accumulate, cudaStream_t stream);

}  // namespace rn::kernels
