// A persistent cooperative conv (persistent_conv.cuh): a 64-channel tile for the 64-channel layers.
#include "../persistent_conv.cuh"
PROBE_PERSISTENT_INSTANCE(s8_p_128x64x64, int8_t, false, Cooperative, 128, 64, 64, 0)
