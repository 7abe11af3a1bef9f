// A persistent cooperative fp16 conv (persistent_conv.cuh): each consumer warp group a 128x128 half.
#include "../persistent_conv.cuh"
PROBE_PERSISTENT_INSTANCE(f16_p_256x128x64, cutlass::half_t, false, Cooperative, 256, 128, 64, 0)
