// One instantiation (its own translation unit, so build.sh compiles and measures each alone).
#include "../conv_instance.cuh"
PROBE_INSTANCE(f16_res_128x128x64_1x1, cutlass::half_t, true, 128, 128, 64, 1, 1, 0)
