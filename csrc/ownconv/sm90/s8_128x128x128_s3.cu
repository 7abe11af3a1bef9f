// int8, Requantize epilogue, tile 128x128x128, 3 mainloop stages (see conv_sm90.cuh).
#include "conv_sm90.cuh"

RN_OWNCONV_SM90(s8_128x128x128_s3, int8_t, Requantize, 128, 128, 128, 3)
