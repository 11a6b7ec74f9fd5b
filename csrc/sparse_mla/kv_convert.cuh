// fp8 cache values in fp16, the MMA type of every fp8 configuration (kernel_traits.h). e4m3
// values are exactly representable in fp16, so decoding is exact; the kernel applies the scales
// in fp32. Raw fp8 tiles are decoded per MMA fragment (e4m3x2_to_half2, bf16x2_to_half2); in the
// decode-once variant fp8 rows are loaded into registers one tile ahead and decoded into shared
// memory (Fp8RowLoader).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "formats.h"
#include "mma_utils.cuh"

namespace sparse_mla {

// The two e4m3 values in the low 16 bits of `pair` (first in the low byte) -> fp16x2, exactly.
// One hardware instruction on sm_89+, a short integer sequence before that (cuda_fp8.h).
__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t pair) {
  const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return *reinterpret_cast<const uint32_t*>(&h2);
}

// The two e4m3 values in the high 16 bits of `r` -> fp16x2. On sm_89+ the conversion reads the
// high half itself (F2FP's .H1 operand); through `r >> 16` sm_90's ptxas adds a shift.
__device__ __forceinline__ uint32_t e4m3x2_hi_to_half2(uint32_t r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t d;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(d) : "r"(r));
  return d;
#else
  return e4m3x2_to_half2(r >> 16);
#endif
}

// Four fp32 values (>= 0, below 448) as e4m3 bytes in order x0..x3: hi = e4m3(x), rounded, and
// lo = e4m3(x - hi), at the same scale (E4m3Pv in kernel_traits.h).
__device__ __forceinline__ void e4m3x4_hi_lo(float x0, float x1, float x2, float x3, uint32_t& hi, uint32_t& lo) {
  const uint32_t h01 = __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t h23 = __nv_cvt_float2_to_fp8x2(make_float2(x2, x3), __NV_SATFINITE, __NV_E4M3);
  const uint32_t b01 = e4m3x2_to_half2(h01), b23 = e4m3x2_to_half2(h23);
  const float2 f01 = __half22float2(*reinterpret_cast<const __half2*>(&b01));
  const float2 f23 = __half22float2(*reinterpret_cast<const __half2*>(&b23));
  const uint32_t l01 = __nv_cvt_float2_to_fp8x2(make_float2(x0 - f01.x, x1 - f01.y), __NV_SATFINITE, __NV_E4M3);
  const uint32_t l23 = __nv_cvt_float2_to_fp8x2(make_float2(x2 - f23.x, x3 - f23.y), __NV_SATFINITE, __NV_E4M3);
  hi = h01 | (h23 << 16);
  lo = l01 | (l23 << 16);
}

// Raw fp8 V through ldmatrix .trans as b16: r holds bytes (2n, 2n + 1) of keys 2j and 2j + 1;
// bytes (odd, 2 + odd) are column 2n + odd of those two keys, a B fragment register, as fp16x2.
__device__ __forceinline__ uint32_t e4m3_trans_column_to_half2(uint32_t r, int odd) {
  return e4m3x2_to_half2(__byte_perm(r, 0u, odd ? 0x31u : 0x20u));
}

// Two bf16 values -> fp16x2 (fp8_ds_mla's rope), exact within fp16's range.
__device__ __forceinline__ uint32_t bf16x2_to_half2(uint32_t pair) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
  return pack2<__half>(f.x, f.y);
}

// 16 e4m3 values -> 16 fp16 (two 16-byte chunks).
__device__ __forceinline__ void e4m3x16_decode(uint4 raw, uint4& lo, uint4& hi) {
  const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = e4m3x2_to_half2(in[i]);
    o[2 * i + 1] = e4m3x2_hi_to_half2(in[i]);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// Raw bytes of one KV row held by one thread between the global load and the shared store.
// Thread `sub` of the kThreadsPerRow threads of a row takes chunks sub, sub + kThreadsPerRow, ...
template <typename Traits>
struct Fp8RowLoader {
  static constexpr KvFormat kFormat = Traits::kFormat;
  static_assert(!Traits::kRawFp8 && is_fp8(kFormat));
  using Element = typename Traits::Element;
  static_assert(std::is_same_v<Element, __half>, "fp8 rows are decoded into fp16 (kernel_traits.h)");
  static constexpr int kD = Traits::kHeadDim;
  static constexpr int kTpr = Traits::kThreadsPerRow;
  // Raw 16-byte chunks (16 e4m3 values) of the latent (fp8_ds_mla) or of the whole row.
  static constexpr int kMainChunks = Traits::kDsMla ? kKvLoraRank / 16 : kD / 16;
  static constexpr int kMainPerThread = (kMainChunks + kTpr - 1) / kTpr;  // last one predicated
  // fp8_ds_mla with D = 576: 64 bf16 rope values = 8 chunks of 8, converted to fp16.
  static constexpr bool kDsRope = Traits::kDsMla && kD == kHeadSizeRoPE;
  static constexpr int kRopePerThread = kDsRope ? (kQkRopeHeadDim / 8) / kTpr : 0;
  static_assert(!kDsRope || kRopePerThread * kTpr == kQkRopeHeadDim / 8);

  uint4 main[kMainPerThread];
  uint4 rope[kRopePerThread > 0 ? kRopePerThread : 1];
  float4 scales;  // fp8_ds_mla per-128 scales of this row
  bool valid;

  __device__ __forceinline__ void load(const uint8_t* row, bool row_valid, int sub) {
    valid = row_valid;
#pragma unroll
    for (int i = 0; i < kMainPerThread; ++i) {
      const int c = sub + i * kTpr;
      main[i] = valid && c < kMainChunks ? __ldg(reinterpret_cast<const uint4*>(row) + c) : make_uint4(0, 0, 0, 0);
    }
    if constexpr (Traits::kDsMla) {
      scales = valid ? __ldg(reinterpret_cast<const float4*>(row + kDsMlaScaleOffset))
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if constexpr (kDsRope) {
#pragma unroll
      for (int i = 0; i < kRopePerThread; ++i)
        rope[i] = valid ? __ldg(reinterpret_cast<const uint4*>(row + kDsMlaRopeOffset) + sub + i * kTpr)
                        : make_uint4(0, 0, 0, 0);
    }
  }

  // Decode into the shared-memory row `dst` (kD values); the row's scales to `scale_dst`.
  __device__ __forceinline__ void store(Element* dst, float* scale_dst, int sub) const {
#pragma unroll
    for (int i = 0; i < kMainPerThread; ++i) {
      const int c = sub + i * kTpr;
      if (c >= kMainChunks) break;
      uint4 lo, hi;
      e4m3x16_decode(main[i], lo, hi);
      reinterpret_cast<uint4*>(dst)[2 * c] = lo;
      reinterpret_cast<uint4*>(dst)[2 * c + 1] = hi;
    }
    if constexpr (kDsRope) {
#pragma unroll
      for (int i = 0; i < kRopePerThread; ++i) {
        const uint4 v = rope[i];
        reinterpret_cast<uint4*>(dst + kKvLoraRank)[sub + i * kTpr] =
            make_uint4(bf16x2_to_half2(v.x), bf16x2_to_half2(v.y), bf16x2_to_half2(v.z), bf16x2_to_half2(v.w));
      }
    }
    if constexpr (Traits::kDsMla) {
      if (sub == 0) *reinterpret_cast<float4*>(scale_dst) = scales;
    }
  }
};

}  // namespace sparse_mla
