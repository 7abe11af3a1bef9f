// A persistent cooperative fp16 conv (persistent_conv.cuh): a 64-channel tile.
#include "../persistent_conv.cuh"
PROBE_PERSISTENT_INSTANCE(f16_p_128x64x64, cutlass::half_t, false, Cooperative, 128, 64, 64, 0)
