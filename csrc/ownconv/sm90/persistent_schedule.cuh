// The two persistent schedules of CUTLASS's sm90 GEMM kernels, and the mainloop and epilogue tags that select them:
//   cooperative: two consumer warp groups share each tile (tiles of 128 rows or more);
//   ping-pong:   each consumer warp group takes every other tile, so one's epilogue overlaps the other's mainloop
//                (small tiles, few k-steps a tile, heavy epilogues).
// Only CUTLASS types here (the probe in tools/cutlass_probe builds on it too).
#pragma once

#include <type_traits>

#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

namespace rn::ownconv::sm90 {

enum class PersistentSchedule { Cooperative, Pingpong };

template <PersistentSchedule S>
using GemmKernelSchedule =
    std::conditional_t<S == PersistentSchedule::Cooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                       cutlass::gemm::KernelTmaWarpSpecializedPingpong>;

template <PersistentSchedule S>
using EpilogueSchedule =
    std::conditional_t<S == PersistentSchedule::Cooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                       cutlass::epilogue::TmaWarpSpecialized>;

}  // namespace rn::ownconv::sm90
