// One instantiation (its own translation unit, so build.sh compiles and measures each alone).
#include "../conv_instance.cuh"
PROBE_INSTANCE(s8_res_128x128x128_1x1, int8_t, true, 128, 128, 128, 1, 1, 0)
