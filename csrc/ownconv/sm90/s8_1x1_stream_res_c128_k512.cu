// int8 1x1 convolution of 128 channels to 512 as a stream (see stream1x1_sm90.cuh), RequantizeResidual epilogue:
// ResNet-50's layer2 conv3 with the block's residual add. Filters resident (64 KiB), 4 input tiles in flight.
#include "stream1x1_sm90.cuh"

RN_OWNCONV_SM90_STREAM1X1(s8_1x1_stream_res_c128_k512, RequantizeResidual, 128, 512, 4)
