// The quantised engines' residual add: cuDNN's int8 / FP8 convolutions fuse a per-channel scale, a bias and a
// ReLU but no second tensor (sm_90, cuDNN 9: no engine for conv + add), so a block's last convolution writes its
// dequantised result v in fp16 and this kernel adds the shortcut and requantises:
//   out = encode(max(v + s_z * decode(z), 0) * inv_s_y)     (ReLU optional)
// z: int8 values or FP8 E4M3 codes (z_fp8); out: int8 (round to nearest even, saturated to [-127, 127], the
// symmetric range), FP8 E4M3 (nearest even, saturating), or fp32 (inv_s_y = 1: the last block's float output).
// Arithmetic in fp32. Same element count everywhere, validated by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/tensor.h"

namespace rn::kernels {

void residual_requantize(const TensorView& v, const TensorView& z, bool z_fp8, float s_z, float inv_s_y, bool relu,
                         const TensorView& out, cudaStream_t stream);

}  // namespace rn::kernels
