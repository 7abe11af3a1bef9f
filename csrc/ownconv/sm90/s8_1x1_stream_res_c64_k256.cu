// int8 1x1 convolution of 64 channels to 256 as a stream (see stream1x1_sm90.cuh), RequantizeResidual epilogue:
// ResNet-50's layer1 conv3 with the block's residual add. Filters resident, 4 input tiles in flight per CTA.
#include "stream1x1_sm90.cuh"

RN_OWNCONV_SM90_STREAM1X1(s8_1x1_stream_res_c64_k256, RequantizeResidual, 64, 256, 4)
