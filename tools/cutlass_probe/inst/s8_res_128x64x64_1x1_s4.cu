// One instantiation (its own translation unit, so build.sh compiles and measures each alone). Four mainloop stages
// instead of all that fit: room for two CTAs per SM (registers allowing), so one CTA's epilogue overlaps another's
// mainloop.
#include "../conv_instance.cuh"
PROBE_INSTANCE(s8_res_128x64x64_1x1_s4, int8_t, true, 128, 64, 64, 1, 1, 4)
