// int8 1x1 convolution as a persistent cooperative GEMM, RequantizeResidual epilogue, tile 128x256x64, the residual
// loaded through four 128x128 buffers (see gemm1x1_sm90.cuh).
#include "gemm1x1_sm90.cuh"

RN_OWNCONV_SM90_GEMM1X1_EPI(s8_1x1_res_128x256x64_e128c4, RequantizeResidual, Cooperative, 128, 256, 64, 128, 4)
