// A 3x3 int8 convolution of C channels to C (64 or 128; stride 1, padding 1) that reads each input pixel once per
// tile.
//
// CUTLASS's implicit GEMM gathers the im2col matrix tap by tap: at 64 channels every input pixel crosses L2 and
// shared memory nine times, and the 32x32x64 layers run at a fraction of the int8 peak. Here one TMA load brings an
// 8x8 output tile's 10x10 input window (zeros outside the image: the padding) into shared memory, and each of the
// nine taps is the same window seen through a shifted wgmma descriptor: no-swizzle K-major core matrices are 8
// pixels of one window row, so a tap moves the start address and the 8-row stride is the window's row pitch. The
// filters stay in shared memory for the CTA's whole life; each warpgroup walks its own tiles with a ring of
// windows in flight, and one warpgroup's epilogue overlaps another's wgmma (several CTAs an SM at 64 channels,
// two warpgroups sharing the 144 KiB of filters at 128).
//
// The epilogue (wgmma_int8.cuh) is own_conv.h's requantisation, bit for bit the CUTLASS kernels'; the residual's
// rows are loaded before the tile's wgmma, so they are in flight while the tensor cores run.
//
// Adding a kernel: a new .cu file here with one RN_OWNCONV_SM90_HALO(...) line (see the existing ones).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cuda_host_adapter.hpp"

#include "../../core/device.h"
#include "../../core/error.h"
#include "../../core/launch_config.h"
#include "../registry.h"
#include "kernel_common.cuh"
#include "wgmma_int8.cuh"

namespace rn::ownconv::sm90::halo {

using wgmma_int8::interleaved_desc;
using wgmma_int8::kEvictNormal;
using wgmma_int8::store_group;
using wgmma_int8::warpgroup_sync;
using wgmma_int8::wgmma;
using wgmma_int8::wgmma_batch;

constexpr int kTile = 8;                                      // output tile kTile x kTile pixels: the wgmma's M = 64
constexpr int kWindow = kTile + 2;                            // the input window's side (one pixel of halo each way)
constexpr int kChunkBytes = kWindow * kWindow * 16;           // one 16-byte channel chunk of a window
constexpr int kChunkPitch = (kChunkBytes + 127) / 128 * 128;  // TMA writes to 128-byte aligned shared memory
constexpr int kTaps = 9;

// One instantiation's shape. kChannels = C = K. kWarpgroups consumers per CTA share the filters in shared memory,
// each walking its own tiles with its own ring of kStages windows.
template <int kChannels_, int kWarpgroups_, int kStages_>
struct Config {
  static constexpr int kChannels = kChannels_;
  static constexpr int kWarpgroups = kWarpgroups_;
  static constexpr int kStages = kStages_;
  static constexpr int kChunks = kChannels / 16;  // 16-byte channel chunks: a core matrix row each
  static constexpr int kWindowBytes = kChunks * kChunkPitch;
  static constexpr int kFilterBytes = kChannels * kTaps * kChannels;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kGroups = kChannels / 64;  // 64-channel groups of the accumulator
};

struct Params {
  const int8_t* w;         // KRSC
  int8_t* y;               // NHWC
  const int8_t* residual;  // NHWC, y's shape (RequantizeResidual)
  const float* alpha;
  const float* bias;
  float beta, lower;
  int h, w_, tiles_x, tiles_y, tiles;
};

template <class Cfg>
struct alignas(128) SharedStorage {
  int8_t windows[Cfg::kWarpgroups][Cfg::kStages][Cfg::kWindowBytes];  // [chunk][window pixel][16 bytes]
  int8_t filters[Cfg::kFilterBytes];                                  // [tap * kChunks + chunk][k][16 bytes]
  uint64_t full[Cfg::kWarpgroups][Cfg::kStages];                      // a window has landed
};

struct TileCoord {
  int n, y0, x0;
};
__device__ inline TileCoord tile_coord(const Params& p, int t) {
  const int tx = t % p.tiles_x;
  const int rest = t / p.tiles_x;
  return {rest / p.tiles_y, (rest % p.tiles_y) * kTile, tx * kTile};
}

// Where this thread's output row `half` of a tile lies: the element offset of its pixel's first channel in y (and
// the residual), and whether the pixel is inside the image. Thread t of the warpgroup holds rows 16 * warp + t / 4
// and that + 8 of the wgmma's M, that is tile pixel (2 * warp + half, lane / 4).
struct RowPlace {
  int64_t pixel;
  bool inside;
};
template <class Cfg>
__device__ inline RowPlace row_place(const Params& p, TileCoord tc, int warp, int lane, int half) {
  const int oy = tc.y0 + 2 * warp + half;
  const int ox = tc.x0 + lane / 4;
  return {((static_cast<int64_t>(tc.n) * p.h + oy) * p.w_ + ox) * Cfg::kChannels, oy < p.h && ox < p.w_};
}

// The residual this thread's epilogue needs, as the 16-byte rows it stores: issued before the tile's wgmma so the
// loads are in flight while the tensor cores run (an epilogue that loads them waits for them once per tile).
template <class Cfg>
struct ResidualRows {
  int4 v[2][Cfg::kGroups];
};
template <class Cfg, bool kResidual>
__device__ inline void load_residual(const Params& p, TileCoord tc, int warp, int lane, ResidualRows<Cfg>& r) {
  if constexpr (kResidual) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const RowPlace place = row_place<Cfg>(p, tc, warp, lane, half);
#pragma unroll
      for (int g = 0; g < Cfg::kGroups; ++g) {
        r.v[half][g] = place.inside
                           ? __ldg(reinterpret_cast<const int4*>(p.residual + place.pixel + 64 * g + 16 * (lane & 3)))
                           : make_int4(0, 0, 0, 0);
      }
    }
  }
}

// One 8x8 tile's epilogue: each 64-channel group of the thread's two pixels through wgmma_int8::store_group.
template <class Cfg, bool kResidual>
__device__ inline void store_tile(const Params& p, TileCoord tc, const uint32_t* acc, const ResidualRows<Cfg>& res,
                                  const float* alpha, const float* bias, int warp, int lane) {
  const int q = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowPlace place = row_place<Cfg>(p, tc, warp, lane, half);
#pragma unroll
    for (int g = 0; g < Cfg::kGroups; ++g) {
      // this thread's channel 64 * g + 8 * j + 2 * q + b sits at [16 * g + 2 * j + b] of alpha and bias
      const auto coefficients = [&](int j, int b) {
        return make_float2(alpha[16 * g + 2 * j + b], bias[16 * g + 2 * j + b]);
      };
      store_group<kResidual>(p.y + place.pixel + 64 * g + 16 * q, place.inside, res.v[half][g], acc + 32 * g, half,
                             coefficients, p.beta, p.lower, q);
    }
  }
}

template <class Cfg, bool kResidual>
__global__ void __launch_bounds__(Cfg::kThreads) halo_conv3x3_s8(const __grid_constant__ CUtensorMap x_map, Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int C = Cfg::kChannels, kStages = Cfg::kStages;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  SharedStorage<Cfg>& s = *reinterpret_cast<SharedStorage<Cfg>*>(smem_raw);
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const bool producer = tid % 128 == 0;
  // This warpgroup's tiles: first, first + step, ...
  const int first = static_cast<int>(blockIdx.x) * Cfg::kWarpgroups + wg;
  const int step = static_cast<int>(gridDim.x) * Cfg::kWarpgroups;
  const int count = p.tiles > first ? (p.tiles - 1 - first) / step + 1 : 0;

  auto load_window = [&](int i) {  // this warpgroup's i-th tile into its ring slot i % kStages (one thread)
    const TileCoord tc = tile_coord(p, first + i * step);
    uint64_t* full = &s.full[wg][i % kStages];
    Barrier::arrive_and_expect_tx(full, Cfg::kChunks * kChunkBytes);
    for (int c = 0; c < Cfg::kChunks; ++c) {
      cute::SM90_TMA_LOAD_4D::copy(&x_map, full, kEvictNormal, s.windows[wg][i % kStages] + c * kChunkPitch, 16 * c,
                                   tc.x0 - 1, tc.y0 - 1, tc.n);
    }
  };
  if (producer) {
    if (wg == 0) cute::prefetch_tma_descriptor(&x_map);
    for (int i = 0; i < kStages; ++i) Barrier::init(&s.full[wg][i], 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (producer) {
    for (int i = 0; i < kStages && i < count; ++i) load_window(i);
  }
  // The filters, KRSC in memory, to [tap * kChunks + chunk][k][16 bytes]: 16-byte vectors, consecutive threads on
  // consecutive k (conflict-free stores).
  for (int v = tid; v < Cfg::kFilterBytes / 16; v += Cfg::kThreads) {
    const int k = v % C, tap_chunk = v / C;
    const int4 value = __ldg(reinterpret_cast<const int4*>(p.w) + k * (kTaps * Cfg::kChunks) + tap_chunk);
    *reinterpret_cast<int4*>(s.filters + v * 16) = value;
  }
  float alpha[C / 4], bias[C / 4];  // this thread's channels: 8 * j + 2 * (lane % 4) + b at [2 * j + b]
#pragma unroll
  for (int j = 0; j < C / 8; ++j) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int k = 8 * j + 2 * (lane & 3) + b;
      alpha[2 * j + b] = __ldg(p.alpha + k);
      bias[2 * j + b] = __ldg(p.bias + k);
    }
  }
  cutlass::arch::fence_view_async_shared();  // the filters' generic stores, before wgmma reads them
  __syncthreads();

  const uint32_t filters = cute::cast_smem_ptr_to_uint(s.filters);
  uint32_t acc[C / 2];
#pragma unroll
  for (int i = 0; i < C / 2; ++i) acc[i] = 0;
  for (int i = 0; i < count; ++i) {
    const int slot = i % kStages;
    const TileCoord tc = tile_coord(p, first + i * step);
    ResidualRows<Cfg> residual;
    load_residual<Cfg, kResidual>(p, tc, warp, lane, residual);
    Barrier::wait(&s.full[wg][slot], (i / kStages) & 1);
    const uint32_t window = cute::cast_smem_ptr_to_uint(s.windows[wg][slot]);
    wgmma_batch<C / 2>(acc, [&] {
#pragma unroll
      for (int tap = 0; tap < kTaps; ++tap) {
#pragma unroll
        for (int ks = 0; ks < C / 32; ++ks) {  // 32 of the tap's channels: two 16-byte chunks
          const uint64_t da = interleaved_desc(window + ((tap / 3) * kWindow + tap % 3) * 16 + 2 * ks * kChunkPitch,
                                               kChunkPitch, kWindow * 16);
          const uint64_t db = interleaved_desc(filters + (tap * Cfg::kChunks + 2 * ks) * C * 16, C * 16, 8 * 16);
          wgmma<C>(da, db, acc, tap != 0 || ks != 0, std::make_index_sequence<C / 2>{});
        }
      }
    });
    warpgroup_sync<Cfg::kWarpgroups>(wg);  // every warp of the warpgroup is done with the slot: refill it
    if (producer && i + kStages < count) load_window(i + kStages);
    store_tile<Cfg, kResidual>(p, tc, acc, residual, alpha, bias, warp, lane);
  }
#endif
}

// The kernel behind ConvKernel: C = K = Cfg::kChannels, 3x3 filters, stride 1, padding 1, int8 in and out.
template <class Cfg, Epilogue E>
class HaloConv3x3 final : public ConvKernel {
 public:
  static constexpr bool kResidual = E == Epilogue::RequantizeResidual;
  static constexpr int kChannels = Cfg::kChannels;
  static constexpr auto kKernel = halo_conv3x3_s8<Cfg, kResidual>;

  explicit HaloConv3x3(const char* name)
      : info_(hand_written_int8_info(name, E, kTile * kTile, kChannels, kChannels, Cfg::kStages,
                                     static_cast<int>(sizeof(SharedStorage<Cfg>)), Cfg::kThreads)) {
    // At 64 channels the windows beat every CUTLASS kernel at each batch measured (lab notes); at 128 they tie or
    // lose, so there the engine's timing decides and 'auto' keeps the general rule.
    info_.preferred = kChannels == 64;
  }

  const KernelInfo& info() const override { return info_; }

  std::string unsupported(const ConvProblem& p) const override {
    if (p.c != kChannels || p.k != kChannels || p.r != 3 || p.s != 3 || p.stride_h != 1 || p.stride_w != 1 ||
        p.pad_h != 1 || p.pad_w != 1) {
      return "a halo-window kernel: takes C = K = " + std::to_string(kChannels) +
             ", 3x3 filters, stride 1 and padding 1 only";
    }
    if (tiles(p) > INT32_MAX) return "more than 2^31 - 1 tiles of 8x8 output pixels";
    return "";
  }

  size_t workspace_bytes(const ConvProblem&) const override { return 0; }

  void launch(const ConvProblem& p, const ConvOperands& operands, const EpilogueArgs& epilogue, void*,
              cudaStream_t stream) const override {
    const std::string why = unsupported(p);
    if (!why.empty()) throw ValueError(info_.name + ": " + p.describe() + ": " + why);
    Params params{static_cast<const int8_t*>(operands.w),
                  static_cast<int8_t*>(operands.y),
                  static_cast<const int8_t*>(epilogue.residual),
                  epilogue.alpha,
                  epilogue.bias,
                  epilogue.beta,
                  epilogue.lower,
                  p.h,
                  p.w,
                  (p.w + kTile - 1) / kTile,
                  (p.h + kTile - 1) / kTile,
                  static_cast<int>(tiles(p))};
    const int64_t ctas = (int64_t{params.tiles} + Cfg::kWarpgroups - 1) / Cfg::kWarpgroups;
    launch_persistent<kKernel, Cfg::kThreads, static_cast<int>(sizeof(SharedStorage<Cfg>))>(
        ctas, stream, window_map(p, operands.x), params);
  }

 private:
  static int64_t tiles(const ConvProblem& p) {
    return int64_t{p.n} * ((p.h + kTile - 1) / kTile) * ((p.w + kTile - 1) / kTile);
  }

  // x as a 4-D TMA tensor (C, W, H, N), boxes of 16 channels x a 10x10 window; out-of-image coordinates read zeros.
  CUtensorMap window_map(const ConvProblem& p, const void* x) const {
    const cuuint64_t c = static_cast<cuuint64_t>(p.c);
    return int8_tma_map<4>(
        info_.name, x, {c, static_cast<cuuint64_t>(p.w), static_cast<cuuint64_t>(p.h), static_cast<cuuint64_t>(p.n)},
        {c, c * p.w, c * p.w * p.h}, {16, kWindow, kWindow, 1});
  }

  KernelInfo info_;
};

}  // namespace rn::ownconv::sm90::halo

// One registered kernel: NAME (an identifier, the kernel's name in Python) with EPILOGUE (own_conv.h's Epilogue),
// CHANNELS = C = K, WARPGROUPS consumers per CTA sharing the filters, STAGES windows in flight per warpgroup.
#define RN_OWNCONV_SM90_HALO(NAME, EPILOGUE, CHANNELS, WARPGROUPS, STAGES)                                           \
  RN_OWNCONV_REGISTER(                                                                                               \
      NAME, ::rn::ownconv::sm90::halo::HaloConv3x3< ::rn::ownconv::sm90::halo::Config<CHANNELS, WARPGROUPS, STAGES>, \
                                                    ::rn::ownconv::Epilogue::EPILOGUE>)
