// Decoding of cache rows that are not already the MMA operand type: the other 16-bit type
// (converted in shared memory), fp8 e4m3 with a per-tensor scale and vLLM's 656-byte
// fp8_ds_mla record (loaded into registers, dequantised on the way into shared memory).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "formats.h"
#include "mma_utils.cuh"

namespace sparse_mla {

template <typename Element>
__device__ __forceinline__ float2 to_float2(uint32_t v) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
  } else {
    return __half22float2(*reinterpret_cast<__half2*>(&v));
  }
}

// 8 values of the other 16-bit type (Src) -> 8 Element.
template <typename Element, typename Src>
__device__ __forceinline__ uint4 convert_16bit_chunk(uint4 raw) {
  if constexpr (std::is_same_v<Element, Src>) {
    return raw;
  } else {
    uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = to_float2<Src>(in[i]);
      o[i] = pack2<Element>(f.x, f.y);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// 16 e4m3 values times `scale` -> 16 Element (two 16-byte chunks). The e4m3x2 -> f16x2 step is
// one hardware instruction on sm_89+ and a short integer sequence before that (cuda_fp8.h).
template <typename Element>
__device__ __forceinline__ void convert_fp8_chunk(uint4 raw, float scale, uint4& lo, uint4& hi) {
  uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((in[i] >> (16 * h)) & 0xffffu), __NV_E4M3);
      float2 f = __half22float2(*reinterpret_cast<__half2*>(&h2));
      o[2 * i + h] = pack2<Element>(f.x * scale, f.y * scale);
    }
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// Raw bytes of one KV row held by one thread between the global load and the shared store.
// Thread `sub` of the kThreadsPerRow threads of a row takes chunks sub, sub + kThreadsPerRow, ...
template <typename Traits>
struct KvRowLoader {
  using Element = typename Traits::Element;
  static constexpr KvFormat kFormat = Traits::kFormat;
  static constexpr int kD = Traits::kHeadDim;
  static constexpr int kTpr = Traits::kThreadsPerRow;
  static_assert(kFormat == KvFormat::kFp8E4m3 || kFormat == KvFormat::kFp8DsMla);
  // Raw 16-byte chunks (16 e4m3 values) of the latent (fp8_ds_mla) or of the whole row.
  static constexpr int kMainChunks = kFormat == KvFormat::kFp8DsMla ? kKvLoraRank / 16 : kD / 16;
  static constexpr int kMainPerThread = kMainChunks / kTpr;
  static_assert(kMainPerThread * kTpr == kMainChunks);
  // fp8_ds_mla with D = 576: 64 bf16 rope values = 8 chunks of 8.
  static constexpr bool kDsRope = kFormat == KvFormat::kFp8DsMla && kD == kHeadSizeRoPE;
  static constexpr int kRopePerThread = kDsRope ? (kQkRopeHeadDim / 8) / kTpr : 0;
  static constexpr int kRopeStore = kRopePerThread > 0 ? kRopePerThread : 1;

  uint4 main[kMainPerThread];
  uint4 rope[kRopeStore];
  float4 scales;  // fp8_ds_mla per-128 scales of this row

  __device__ __forceinline__ void load(const uint8_t* row, bool valid, int sub) {
#pragma unroll
    for (int i = 0; i < kMainPerThread; ++i)
      main[i] = valid ? __ldg(reinterpret_cast<const uint4*>(row) + sub + i * kTpr)
                      : make_uint4(0, 0, 0, 0);
    if constexpr (kFormat == KvFormat::kFp8DsMla) {
      scales = valid ? __ldg(reinterpret_cast<const float4*>(row + kDsMlaScaleOffset))
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if constexpr (kDsRope) {
#pragma unroll
      for (int i = 0; i < kRopePerThread; ++i)
        rope[i] = valid ? __ldg(reinterpret_cast<const uint4*>(row + kDsMlaRopeOffset) + sub +
                                i * kTpr)
                        : make_uint4(0, 0, 0, 0);
    }
  }

  // Convert and write into the shared-memory row `dst` (kD Element values).
  __device__ __forceinline__ void store(Element* dst, int sub, float tensor_scale) const {
#pragma unroll
    for (int i = 0; i < kMainPerThread; ++i) {
      const int c = sub + i * kTpr;
      float s = tensor_scale;
      if constexpr (kFormat == KvFormat::kFp8DsMla) {
        const int tile = (c * 16) / kDsMlaTile;
        s = tile == 0 ? scales.x : tile == 1 ? scales.y : tile == 2 ? scales.z : scales.w;
      }
      uint4 lo, hi;
      convert_fp8_chunk<Element>(main[i], s, lo, hi);
      reinterpret_cast<uint4*>(dst)[2 * c] = lo;
      reinterpret_cast<uint4*>(dst)[2 * c + 1] = hi;
    }
    if constexpr (kDsRope) {
#pragma unroll
      for (int i = 0; i < kRopePerThread; ++i) {
        const int c = sub + i * kTpr;
        reinterpret_cast<uint4*>(dst + kKvLoraRank)[c] =
            convert_16bit_chunk<Element, __nv_bfloat16>(rope[i]);
      }
    }
  }
};

}  // namespace sparse_mla
