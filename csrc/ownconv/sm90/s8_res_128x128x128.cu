// int8, RequantizeResidual epilogue, tile 128x128x128, as many stages as fit (see conv_sm90.cuh).
#include "conv_sm90.cuh"

RN_OWNCONV_SM90(s8_res_128x128x128, int8_t, RequantizeResidual, 128, 128, 128, 0)
