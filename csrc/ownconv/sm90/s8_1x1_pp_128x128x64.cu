// int8 1x1 convolution as a persistent ping-pong GEMM, Requantize epilogue, tile 128x128x64 (see
// gemm1x1_sm90.cuh).
#include "gemm1x1_sm90.cuh"

RN_OWNCONV_SM90_GEMM1X1(s8_1x1_pp_128x128x64, Requantize, Pingpong, 128, 128, 64)
