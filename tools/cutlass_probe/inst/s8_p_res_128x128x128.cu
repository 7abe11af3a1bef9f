// A persistent cooperative conv (persistent_conv.cuh): two consumer warp groups share a 128x128 tile.
#include "../persistent_conv.cuh"
PROBE_PERSISTENT_INSTANCE(s8_p_res_128x128x128, int8_t, true, Cooperative, 128, 128, 128, 4)
