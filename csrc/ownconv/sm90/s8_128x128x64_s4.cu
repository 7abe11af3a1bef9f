// int8, Requantize epilogue, tile 128x128x64, 4 mainloop stages (see conv_sm90.cuh).
#include "conv_sm90.cuh"

RN_OWNCONV_SM90(s8_128x128x64_s4, int8_t, Requantize, 128, 128, 64, 4)
