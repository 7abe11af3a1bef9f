// int8 3x3 convolution of 64 channels to 64 on halo windows, RequantizeResidual epilogue (see halo_conv_sm90.cuh):
// one warpgroup a CTA (several CTAs an SM), 4 windows in flight.
#include "halo_conv_sm90.cuh"

RN_OWNCONV_SM90_HALO(s8_halo_res_c64, RequantizeResidual, 64, 1, 4)
