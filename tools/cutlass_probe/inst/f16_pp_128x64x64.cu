// A persistent ping-pong fp16 conv (persistent_conv.cuh).
#include "../persistent_conv.cuh"
PROBE_PERSISTENT_INSTANCE(f16_pp_128x64x64, cutlass::half_t, false, Pingpong, 128, 64, 64, 0)
