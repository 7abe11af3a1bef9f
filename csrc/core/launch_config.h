// Launch shapes for the grid-stride kernels: enough blocks to fill the current GPU, never more than the work needs.
#pragma once

#include <cstdint>

namespace rn {

constexpr int kThreadsPerBlock = 256;

// Number of streaming multiprocessors of the current device (queried once per device).
int sm_count();

// Blocks for a grid-stride loop over `work_items` items handled one per thread per iteration: at most
// `blocks_per_sm` resident blocks per SM, at least 1.
int grid_size(int64_t work_items, int threads_per_block = kThreadsPerBlock, int blocks_per_sm = 8);

}  // namespace rn
