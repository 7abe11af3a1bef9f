// int8 persistent ping-pong convolution, Requantize epilogue, tile 128x64x64 (see persistent_conv_sm90.cuh).
#include "persistent_conv_sm90.cuh"

RN_OWNCONV_SM90_PERSISTENT(s8_pp_128x64x64, Requantize, Pingpong, 128, 64, 64)
