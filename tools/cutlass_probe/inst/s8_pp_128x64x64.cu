// A persistent ping-pong conv (persistent_conv.cuh): each consumer warp group takes every other tile.
#include "../persistent_conv.cuh"
PROBE_PERSISTENT_INSTANCE(s8_pp_128x64x64, int8_t, false, Pingpong, 128, 64, 64, 0)
