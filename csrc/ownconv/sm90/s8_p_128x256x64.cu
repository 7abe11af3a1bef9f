// int8 persistent cooperative convolution, Requantize epilogue, tile 128x256x64
// (see persistent_conv_sm90.cuh).
#include "persistent_conv_sm90.cuh"

RN_OWNCONV_SM90_PERSISTENT(s8_p_128x256x64, Requantize, Cooperative, 128, 256, 64)
