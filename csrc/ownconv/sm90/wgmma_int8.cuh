// What hand-written int8 wgmma kernels share (halo_conv_sm90.cuh): no-swizzle K-major
// shared-memory descriptors, the m64 int8 wgmma over an accumulator array, and the requantising epilogue of one
// accumulator fragment's 64 output channels of a pixel, written as 16-byte rows.
//
// The epilogue is own_conv.h's: the same fp32 fused multiply-adds, clamp and rounding as requantize_epilogue.cuh's
// CUTLASS trees, so every kernel gives the same bits. Each quad of lanes holds two output pixels' channels in the
// wgmma fragment's order; a 4x4 shuffle transpose per 64 channels turns them into 16-byte stores (and the
// residual's 16-byte loads back), so every access is a whole coalesced row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"

namespace rn::ownconv::sm90::wgmma_int8 {

constexpr uint64_t kEvictNormal = 0x1000000000000000ull;  // TMA's L2 cache hint (CUTLASS's CacheHintSm90)

// A wgmma shared-memory descriptor for a no-swizzle K-major operand: core matrices of 8 rows x 16 bytes, `lbo`
// bytes between core matrices along K, `sbo` bytes between 8-row groups.
__device__ inline uint64_t interleaved_desc(uint32_t address, uint32_t lbo, uint32_t sbo) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>(address >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<uint16_t>(lbo >> 4);
  d.bitfield.stride_byte_offset_ = static_cast<uint16_t>(sbo >> 4);
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = 0;
  return d.desc_;
}

// m64 x kN x k32 int8 wgmma, both operands in shared memory, acc (kN / 2 registers) accumulated or overwritten.
template <int kN>
struct Wgmma;
template <>
struct Wgmma<64> {
  using Op = cute::SM90::GMMA::MMA_64x64x32_S32S8S8_SS_TN;
};
template <>
struct Wgmma<128> {
  using Op = cute::SM90::GMMA::MMA_64x128x32_S32S8S8_SS_TN;
};
template <int kN, size_t... I>
__device__ inline void wgmma(uint64_t da, uint64_t db, uint32_t* acc, bool accumulate, std::index_sequence<I...>) {
  Wgmma<kN>::Op::fma(da, db, acc[I]...,
                     accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// Runs `issue` (the wgmmas of one accumulation into acc, kRegisters words) as one committed batch and waits for it.
// The accumulator registers are fenced on both sides, so the compiler keeps its own reads and writes of them out
// of the asynchronous wgmma's way.
template <int kRegisters, class Issue>
__device__ inline void wgmma_batch(uint32_t* acc, const Issue& issue) {
#pragma unroll
  for (int a = 0; a < kRegisters; ++a) asm volatile("" : "+r"(acc[a])::"memory");
  cute::warpgroup_arrive();
  issue();
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<0>();
#pragma unroll
  for (int a = 0; a < kRegisters; ++a) asm volatile("" : "+r"(acc[a])::"memory");
}

// 4 words, one per lane of a quad, selected by a lane-dependent index without local memory.
__device__ inline uint32_t pick(const uint32_t (&v)[4], int i) {
  return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3];
}

// The quad's 4x4 word transpose: lane q ends with out[s] = lane s's in[q].
__device__ inline void quad_transpose(const uint32_t (&in)[4], uint32_t (&out)[4], int q) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int from = (q + k) & 3;
    const uint32_t got = __shfl_sync(0xffffffffu, pick(in, (q - k) & 3), from, 4);
#pragma unroll
    for (int s = 0; s < 4; ++s) out[s] = s == from ? got : out[s];
  }
}

// The warpgroup's 128 threads meet (the whole CTA when it is one warpgroup). Immediate barrier ids: a register id
// would reserve all 16 of the CTA's barriers.
template <int kWarpgroups>
__device__ inline void warpgroup_sync(int wg) {
  static_assert(kWarpgroups == 1 || kWarpgroups == 2, "one or two warpgroups a CTA");
  if constexpr (kWarpgroups == 1) {
    __syncthreads();
  } else if (wg == 0) {
    asm volatile("bar.sync 1, 128;" ::: "memory");
  } else {
    asm volatile("bar.sync 2, 128;" ::: "memory");
  }
}

template <bool kResidual>
__device__ inline uint32_t requantize(int32_t acc, float alpha, float bias, float beta, int8_t r, float lower) {
  float v = __fmaf_rn(alpha, __int2float_rn(acc), bias);
  if constexpr (kResidual) v = __fmaf_rn(beta, static_cast<float>(r), v);
  v = fminf(fmaxf(v, lower), 127.f);
  return static_cast<uint32_t>(__float2int_rn(v)) & 0xffu;
}

// One 64-channel group of one output pixel from the accumulator fragment, requantised and stored as the quad's four
// 16-byte rows. The thread (quad lane q) holds the group's channels 8 * j + 2 * q + b (j < 8, b < 2) at
// acc[4 * j + 2 * half + b]; coefficients(j, b) gives their (alpha, bias) as a float2. `out` and `residual` are the
// pixel's 16 * q-th byte of the group in y; residual the 16 bytes there, loaded by the caller (zeros without one).
template <bool kResidual, class Coefficients>
__device__ inline void store_group(int8_t* out, bool inside, int4 residual, const uint32_t* acc, int half,
                                   const Coefficients& coefficients, float beta, float lower, int q) {
  uint32_t r[4] = {0, 0, 0, 0};  // the residual in the fragment's order: r[j / 2] byte 2 * (j % 2) + b
  if constexpr (kResidual) {
    const uint32_t w0 = residual.x, w1 = residual.y, w2 = residual.z, w3 = residual.w;
    const uint32_t send[4] = {__byte_perm(w0, w2, 0x5410), __byte_perm(w0, w2, 0x7632), __byte_perm(w1, w3, 0x5410),
                              __byte_perm(w1, w3, 0x7632)};
    quad_transpose(send, r, q);
  }
  uint32_t packed[4];  // packed[m]: blocks j = 2m (low half) and 2m + 1 (high half), 2 bytes each
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = 2 * m + e / 2, b = e % 2;
      const float2 ab = coefficients(j, b);
      const int8_t rv = static_cast<int8_t>(r[j / 2] >> (8 * (2 * (j % 2) + b)));
      word |= requantize<kResidual>(static_cast<int32_t>(acc[4 * j + 2 * half + b]), ab.x, ab.y, beta, rv, lower)
              << (8 * e);
    }
    packed[m] = word;
  }
  uint32_t row[4];
  quad_transpose(packed, row, q);
  if (inside) {
    *reinterpret_cast<int4*>(out) = make_int4(
        static_cast<int>(__byte_perm(row[0], row[1], 0x5410)), static_cast<int>(__byte_perm(row[2], row[3], 0x5410)),
        static_cast<int>(__byte_perm(row[0], row[1], 0x7632)), static_cast<int>(__byte_perm(row[2], row[3], 0x7632)));
  }
}

}  // namespace rn::ownconv::sm90::wgmma_int8
