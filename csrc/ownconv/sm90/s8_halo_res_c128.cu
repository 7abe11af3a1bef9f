// int8 3x3 convolution of 128 channels to 128 on halo windows, RequantizeResidual epilogue (see
// halo_conv_sm90.cuh): two warpgroups share the filters (144 KiB) in one CTA an SM, 2 windows in flight each.
#include "halo_conv_sm90.cuh"

RN_OWNCONV_SM90_HALO(s8_halo_res_c128, RequantizeResidual, 128, 2, 2)
