// A 1x1 int8 convolution (stride 1, no padding) of C channels to K, C and K fixed per instance, for the layers
// whose bytes, not their multiply-adds, set the time: ResNet-50's expansions (64 to 256, 128 to 512) with the
// block's residual add. There each 64-pixel tile multiplies 4 KiB of input by the layer's whole filter matrix and
// then reads and writes 16 KiB of residual and output per 128 output channels: the kernel is a stream, and what
// matters is how many bytes are in flight.
//
// The filters (C x K bytes) and the epilogue's coefficients stay in shared memory for the CTA's life. One warpgroup
// a CTA, several CTAs an SM; each walks its tiles with a ring of input tiles in flight (TMA, one 16-byte channel
// chunk of 64 pixels a load, zeros past the last pixel). A tile's K output channels are computed 128 at a time
// (m64n128k32 wgmmas), and each 128-channel slice's residual rows are loaded before the previous slice is stored,
// so the loads overlap the epilogue and the next wgmmas. The epilogue is wgmma_int8.cuh's.
//
// Adding a kernel: a new .cu file here with one RN_OWNCONV_SM90_STREAM1X1(...) line (see the existing ones).
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

namespace rn::ownconv::sm90::stream1x1 {

using wgmma_int8::interleaved_desc;
using wgmma_int8::kEvictNormal;
using wgmma_int8::store_group;
using wgmma_int8::wgmma;
using wgmma_int8::wgmma_batch;

constexpr int kRows = 64;                // output pixels per tile: the wgmma's M
constexpr int kChunkBytes = kRows * 16;  // one 16-byte channel chunk of a tile: [pixel][16 bytes]
constexpr int kSlice = 128;              // output channels per wgmma pass (the accumulator: 64 registers a thread)

template <int kC_, int kK_, int kStages_>
struct Config {
  static constexpr int kC = kC_;
  static constexpr int kK = kK_;
  static constexpr int kStages = kStages_;
  static constexpr int kChunks = kC / 16;
  static constexpr int kTileBytes = kChunks * kChunkBytes;
  static constexpr int kFilterBytes = kC * kK;
  static constexpr int kSlices = kK / kSlice;
  static constexpr int kThreads = 128;
  // CTAs an SM that shared memory allows (227 KiB, 1 KiB reserved per CTA), at most 3: the register budget asked of
  // the compiler (65536 / (3 * 128) = 170 a thread), which the residual form meets without spilling.
  static constexpr int kSharedBytes = kStages * kTileBytes + kFilterBytes + 8 * kK + 8 * kStages;
  static constexpr int kMinCtas = std::min(3, 227 * 1024 / (kSharedBytes + 1024));
  static_assert(kC % 32 == 0 && kK % kSlice == 0, "C a multiple of 32 (the wgmma's k), K of 128");
  static_assert(kMinCtas >= 1, "the filters and the tile ring must fit in shared memory");
};

struct Params {
  const int8_t* w;         // K x C (KRSC with R = S = 1)
  int8_t* y;               // pixels x K
  const int8_t* residual;  // pixels x K (RequantizeResidual)
  const float* alpha;
  const float* bias;
  float beta, lower;
  int pixels, tiles;
};

template <class Cfg>
struct alignas(128) SharedStorage {
  int8_t tiles[Cfg::kStages][Cfg::kTileBytes];  // [chunk][pixel][16 bytes]
  int8_t filters[Cfg::kFilterBytes];            // [chunk][k][16 bytes]
  float alpha[Cfg::kK];
  float bias[Cfg::kK];
  uint64_t full[Cfg::kStages];  // a tile has landed
};

// Where this thread's output row `half` of tile `t` lies: thread t of the warpgroup holds rows 16 * warp + t / 4
// and that + 8 of the wgmma's M.
struct RowPlace {
  int64_t pixel;  // y's offset of the pixel's first channel
  bool inside;
};
template <class Cfg>
__device__ inline RowPlace row_place(const Params& p, int tile, int warp, int lane, int half) {
  const int pixel = tile * kRows + 16 * warp + 8 * half + lane / 4;
  return {static_cast<int64_t>(pixel) * Cfg::kK, pixel < p.pixels};
}

// One 128-channel slice's residual rows for this thread (its two pixels, two 64-channel groups each).
struct SliceResidual {
  int4 v[2][2];
};
template <class Cfg, bool kResidual>
__device__ inline void load_residual(const Params& p, int tile, int slice, int warp, int lane, SliceResidual& r) {
  if constexpr (kResidual) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const RowPlace place = row_place<Cfg>(p, tile, warp, lane, half);
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        const int64_t offset = place.pixel + kSlice * slice + 64 * g + 16 * (lane & 3);
        r.v[half][g] = place.inside ? __ldg(reinterpret_cast<const int4*>(p.residual + offset)) : make_int4(0, 0, 0, 0);
      }
    }
  }
}

template <class Cfg, bool kResidual>
__device__ inline void store_slice(const Params& p, const SharedStorage<Cfg>& s, int tile, int slice,
                                   const uint32_t* acc, const SliceResidual& res, int warp, int lane) {
  const int q = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowPlace place = row_place<Cfg>(p, tile, warp, lane, half);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int first = kSlice * slice + 64 * g + 2 * q;  // the thread's channels: first + 8 * j + b
      const auto coefficients = [&](int j, int b) {
        return make_float2(s.alpha[first + 8 * j + b], s.bias[first + 8 * j + b]);
      };
      store_group<kResidual>(p.y + place.pixel + kSlice * slice + 64 * g + 16 * q, place.inside, res.v[half][g],
                             acc + 32 * g, half, coefficients, p.beta, p.lower, q);
    }
  }
}

template <class Cfg, bool kResidual>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinCtas)
    stream1x1_s8(const __grid_constant__ CUtensorMap x_map, Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int C = Cfg::kC, K = Cfg::kK, kStages = Cfg::kStages;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  SharedStorage<Cfg>& s = *reinterpret_cast<SharedStorage<Cfg>*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const bool producer = tid == 0;
  const int first = static_cast<int>(blockIdx.x), step = static_cast<int>(gridDim.x);
  const int count = p.tiles > first ? (p.tiles - 1 - first) / step + 1 : 0;

  auto load_tile = [&](int i) {  // this CTA's i-th tile into ring slot i % kStages (one thread)
    uint64_t* full = &s.full[i % kStages];
    Barrier::arrive_and_expect_tx(full, Cfg::kTileBytes);
    for (int c = 0; c < Cfg::kChunks; ++c) {
      cute::SM90_TMA_LOAD_2D::copy(&x_map, full, kEvictNormal, s.tiles[i % kStages] + c * kChunkBytes, 16 * c,
                                   (first + i * step) * kRows);
    }
  };
  if (producer) {
    cute::prefetch_tma_descriptor(&x_map);
    for (int i = 0; i < kStages; ++i) Barrier::init(&s.full[i], 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (producer) {
    for (int i = 0; i < kStages && i < count; ++i) load_tile(i);
  }
  // The filters, K x C in memory, to [chunk][k][16 bytes]: consecutive threads on consecutive k (conflict-free).
  for (int v = tid; v < Cfg::kFilterBytes / 16; v += Cfg::kThreads) {
    const int k = v % K, chunk = v / K;
    *reinterpret_cast<int4*>(s.filters + v * 16) = __ldg(reinterpret_cast<const int4*>(p.w) + k * Cfg::kChunks + chunk);
  }
  for (int k = tid; k < K; k += Cfg::kThreads) {
    s.alpha[k] = __ldg(p.alpha + k);
    s.bias[k] = __ldg(p.bias + k);
  }
  cutlass::arch::fence_view_async_shared();  // the filters' generic stores, before wgmma reads them
  __syncthreads();

  const uint32_t filters = cute::cast_smem_ptr_to_uint(s.filters);
  uint32_t acc[kSlice / 2];
#pragma unroll
  for (int a = 0; a < kSlice / 2; ++a) acc[a] = 0;
  SliceResidual next;  // the residual of the next (tile, slice) to compute, loaded ahead
  if (count > 0) load_residual<Cfg, kResidual>(p, first, 0, warp, lane, next);
  for (int i = 0; i < count; ++i) {
    const int slot = i % kStages, tile = first + i * step;
    Barrier::wait(&s.full[slot], (i / kStages) & 1);
    const uint32_t a_tile = cute::cast_smem_ptr_to_uint(s.tiles[slot]);
#pragma unroll
    for (int slice = 0; slice < Cfg::kSlices; ++slice) {
      const SliceResidual residual = next;
      wgmma_batch<kSlice / 2>(acc, [&] {
#pragma unroll
        for (int ks = 0; ks < C / 32; ++ks) {  // 32 input channels: two 16-byte chunks
          const uint64_t da = interleaved_desc(a_tile + 2 * ks * kChunkBytes, kChunkBytes, 8 * 16);
          const uint64_t db = interleaved_desc(filters + (2 * ks * K + kSlice * slice) * 16, K * 16, 8 * 16);
          wgmma<kSlice>(da, db, acc, ks != 0, std::make_index_sequence<kSlice / 2>{});
        }
      });
      if (slice + 1 < Cfg::kSlices) {
        load_residual<Cfg, kResidual>(p, tile, slice + 1, warp, lane, next);
      } else {
        if (i + 1 < count) load_residual<Cfg, kResidual>(p, tile + step, 0, warp, lane, next);
        __syncthreads();  // every warp is done with the slot: refill it
        if (producer && i + kStages < count) load_tile(i + kStages);
      }
      store_slice<Cfg, kResidual>(p, s, tile, slice, acc, residual, warp, lane);
    }
  }
#endif
}

// The kernel behind ConvKernel: 1x1 filters, stride 1, no padding, C = Cfg::kC and K = Cfg::kK, int8 in and out.
template <class Cfg, Epilogue E>
class Stream1x1 final : public ConvKernel {
 public:
  static constexpr bool kResidual = E == Epilogue::RequantizeResidual;
  static constexpr auto kKernel = stream1x1_s8<Cfg, kResidual>;
  static constexpr int kSharedBytes = static_cast<int>(sizeof(SharedStorage<Cfg>));

  explicit Stream1x1(const char* name)
      : info_(hand_written_int8_info(name, E, kRows, Cfg::kK, Cfg::kC, Cfg::kStages, kSharedBytes, Cfg::kThreads,
                                     true)) {}

  const KernelInfo& info() const override { return info_; }

  std::string unsupported(const ConvProblem& p) const override {
    if (p.r != 1 || p.s != 1 || p.stride_h != 1 || p.stride_w != 1 || p.pad_h != 0 || p.pad_w != 0) {
      return "a streaming 1x1 kernel: takes 1x1 filters at stride 1 without padding only";
    }
    if (p.c != Cfg::kC || p.k != Cfg::kK) {
      return "a streaming 1x1 kernel: takes C = " + std::to_string(Cfg::kC) + " and K = " + std::to_string(Cfg::kK) +
             " only";
    }
    if (int64_t{p.n} * p.h * p.w > INT32_MAX - kRows) return "N*H*W over 2^31 - 65 (pixel indices are ints)";
    return "";
  }

  size_t workspace_bytes(const ConvProblem&) const override { return 0; }

  void launch(const ConvProblem& p, const ConvOperands& operands, const EpilogueArgs& epilogue, void*,
              cudaStream_t stream) const override {
    const std::string why = unsupported(p);
    if (!why.empty()) throw ValueError(info_.name + ": " + p.describe() + ": " + why);
    const int pixels = static_cast<int>(int64_t{p.n} * p.h * p.w);
    Params params{static_cast<const int8_t*>(operands.w),
                  static_cast<int8_t*>(operands.y),
                  static_cast<const int8_t*>(epilogue.residual),
                  epilogue.alpha,
                  epilogue.bias,
                  epilogue.beta,
                  epilogue.lower,
                  pixels,
                  (pixels + kRows - 1) / kRows};
    launch_persistent<kKernel, Cfg::kThreads, kSharedBytes>(params.tiles, stream, input_map(pixels, operands.x),
                                                            params);
  }

 private:
  // x as a 2-D TMA tensor (C, pixels), boxes of 16 channels x 64 pixels; rows past the last pixel read zeros.
  CUtensorMap input_map(int pixels, const void* x) const {
    return int8_tma_map<2>(info_.name, x, {static_cast<cuuint64_t>(Cfg::kC), static_cast<cuuint64_t>(pixels)},
                           {static_cast<cuuint64_t>(Cfg::kC)}, {16, kRows});
  }

  KernelInfo info_;
};

}  // namespace rn::ownconv::sm90::stream1x1

// One registered kernel: NAME (an identifier, the kernel's name in Python) with EPILOGUE (own_conv.h's Epilogue),
// C input and K output channels, STAGES input tiles in flight per CTA.
#define RN_OWNCONV_SM90_STREAM1X1(NAME, EPILOGUE, C, K, STAGES)                                                        \
  RN_OWNCONV_REGISTER(NAME,                                                                                            \
                      ::rn::ownconv::sm90::stream1x1::Stream1x1< ::rn::ownconv::sm90::stream1x1::Config<C, K, STAGES>, \
                                                                 ::rn::ownconv::Epilogue::EPILOGUE>)
