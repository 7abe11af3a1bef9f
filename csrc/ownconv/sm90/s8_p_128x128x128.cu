// int8 persistent cooperative convolution, Requantize epilogue, tile 128x128x128 (see persistent_conv_sm90.cuh).
#include "persistent_conv_sm90.cuh"

RN_OWNCONV_SM90_PERSISTENT(s8_p_128x128x128, Requantize, Cooperative, 128, 128, 128)
