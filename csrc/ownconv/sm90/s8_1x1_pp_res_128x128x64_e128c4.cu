// int8 1x1 convolution as a persistent ping-pong GEMM, RequantizeResidual epilogue, tile 128x128x64, the residual
// loaded through four 64x128 buffers (see gemm1x1_sm90.cuh).
#include "gemm1x1_sm90.cuh"

RN_OWNCONV_SM90_GEMM1X1_EPI(s8_1x1_pp_res_128x128x64_e128c4, RequantizeResidual, Pingpong, 128, 128, 64, 128, 4)
