// int8 1x1 convolution of 64 channels to 256 as a stream (see stream1x1_sm90.cuh), Requantize epilogue: ResNet-50's
// layer1 downsample. Filters resident, 4 input tiles in flight per CTA.
#include "stream1x1_sm90.cuh"

RN_OWNCONV_SM90_STREAM1X1(s8_1x1_stream_c64_k256, Requantize, 64, 256, 4)
