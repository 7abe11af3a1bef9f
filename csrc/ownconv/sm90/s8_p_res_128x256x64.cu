// int8 persistent cooperative convolution, RequantizeResidual epilogue, tile 128x256x64
// (see persistent_conv_sm90.cuh).
#include "persistent_conv_sm90.cuh"

RN_OWNCONV_SM90_PERSISTENT(s8_p_res_128x256x64, RequantizeResidual, Cooperative, 128, 256, 64)
