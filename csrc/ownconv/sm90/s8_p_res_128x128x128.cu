// int8 persistent cooperative convolution, RequantizeResidual epilogue, tile 128x128x128
// (see persistent_conv_sm90.cuh).
#include "persistent_conv_sm90.cuh"

RN_OWNCONV_SM90_PERSISTENT(s8_p_res_128x128x128, RequantizeResidual, Cooperative, 128, 128, 128)
