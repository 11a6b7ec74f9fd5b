// Device helpers shared by the forward kernel families (sparse_mla_fwd_kernel.cuh,
// sparse_mla_fwd_wide.cuh).
#pragma once

#include <cstdint>

#include "mma_utils.cuh"
#include "params.h"

namespace sparse_mla {

// Number of slots token t may use: topk, cut by topk_len[t] when given.
__device__ __forceinline__ int token_topk(const SparseMlaFwdParams& p, int t) {
  if (p.topk_len == nullptr) return p.topk;
  const int len = __ldg(p.topk_len + t);
  return len < 0 ? 0 : (len < p.topk ? len : p.topk);
}

// Thread sub of the kTpr threads that copy one row of kRowBytes, dst and src at the row's chunk
// sub: chunks sub, sub + kTpr, ... from those two addresses, so that sm_90's ptxas emits immediate
// offsets instead of an address per chunk (bench/HISTORY.md v32 and v39). valid = false zero-fills.
template <int kRowBytes, int kTpr>
__device__ __forceinline__ void cp_async_row(uint8_t* dst, const uint8_t* src, bool valid) {
  static_assert(kRowBytes % (16 * kTpr) == 0, "whole 16-byte chunks for every thread");
#pragma unroll
  for (int k = 0; k < kRowBytes / (16 * kTpr); ++k) cp_async_16(dst + k * 16 * kTpr, src + k * 16 * kTpr, valid);
}

// Column, within a k-step, of this lane's m16n8k16 A fragment register i: pairs (c, c + 8) with
// c = 2 (lane % 4); with raw fp8 tiles, whose B fragments hold columns (4j, 4j + 1) and (4j + 2,
// 4j + 3), j = lane % 4, pairs (c, c + 2) with c = 4 (lane % 4).
__device__ __forceinline__ int a_frag_col(int lane, int i, bool permuted) {
  return permuted ? (lane % 4) * 4 + (i >> 1) * 2 : (lane % 4) * 2 + (i >> 1) * 8;
}

// fp8_ds_mla in fp16: the P of column tile w (p x key scale) is divided by a power of two near
// the tile's largest scale of column tile w, 2^floor(log2 smax), which keeps p * scale / norm in
// [0, 2) (1 for subnormal or zero scales); under the WideWarps lazy rescale, p <= 2^8 and the
// norm may lag the largest scale by 2^3.
__device__ __forceinline__ float ds_scale_norm(float smax) {
  const float norm = __uint_as_float(__float_as_uint(smax) & 0x7f800000u);
  return norm > 0.f ? norm : 1.f;
}

// 1 / x for x = 2^e, e in [-126, 126], exactly and without a division: the exponent negated.
// fp8_ds_mla scales are amax / 448 <= 2^120, so their norms are in range.
__device__ __forceinline__ float pow2_reciprocal(float x) {
  return __uint_as_float((254u << 23) - (__float_as_uint(x) & 0x7f800000u));
}

}  // namespace sparse_mla
