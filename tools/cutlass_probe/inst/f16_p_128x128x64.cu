// A persistent cooperative conv (persistent_conv.cuh): two consumer warp groups share a 128x128 tile.
#include "../persistent_conv.cuh"
PROBE_PERSISTENT_INSTANCE(f16_p_128x128x64, cutlass::half_t, false, Cooperative, 128, 128, 64, 4)
