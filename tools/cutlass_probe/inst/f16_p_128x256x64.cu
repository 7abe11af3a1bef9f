// A persistent cooperative conv (persistent_conv.cuh): two consumer warp groups share a 128x256 tile.
#include "../persistent_conv.cuh"
PROBE_PERSISTENT_INSTANCE(f16_p_128x256x64, cutlass::half_t, false, Cooperative, 128, 256, 64, 3)
