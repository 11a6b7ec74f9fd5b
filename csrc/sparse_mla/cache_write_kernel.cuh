// The cache writer's kernel (cache_write.h), included by its launch (cache_write.cu) and by the
// kernel emulation (tests/emulation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "cache_write.h"
#include "formats.h"

namespace sparse_mla {

__device__ __forceinline__ uint8_t to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// One block per token, one warp per 128-value tile of the latent.
constexpr int kConcatAndCacheThreads = 128;

template <typename Element, KvFormat kFormat>
__global__ void __launch_bounds__(kConcatAndCacheThreads) concat_and_cache_kernel(const ConcatAndCacheParams p) {
  const int t = blockIdx.x;
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0 || slot >= p.num_rows) return;  // -1 = padding; never write outside the cache
  const int tid = threadIdx.x;
  uint8_t* row = p.kv_cache + (slot / p.block_size) * p.kv_block_stride + (slot % p.block_size) * p.kv_row_stride;
  const Element* kv_c = static_cast<const Element*>(p.kv_c) + t * p.kv_c_stride;
  const Element* k_pe = p.k_pe == nullptr ? nullptr : static_cast<const Element*>(p.k_pe) + t * p.k_pe_stride;

  // Thread tid holds latent values 4 tid .. 4 tid + 3 (one warp = one 128-value tile).
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = static_cast<float>(kv_c[4 * tid + i]);

  if constexpr (kFormat == KvFormat::kBFloat16 || kFormat == KvFormat::kFloat16) {
    using Cache = std::conditional_t<kFormat == KvFormat::kBFloat16, __nv_bfloat16, __half>;
    Cache* dst = reinterpret_cast<Cache*>(row);
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[4 * tid + i] = static_cast<Cache>(v[i]);
    if (k_pe != nullptr && tid < kQkRopeHeadDim)
      dst[kKvLoraRank + tid] = static_cast<Cache>(static_cast<float>(k_pe[tid]));
  } else if constexpr (kFormat == KvFormat::kFp8E4m3) {
    const float scale = p.k_scale == nullptr ? 1.f : *p.k_scale;
#pragma unroll
    for (int i = 0; i < 4; ++i) row[4 * tid + i] = to_e4m3(v[i] / scale);
    if (k_pe != nullptr && tid < kQkRopeHeadDim)
      row[kKvLoraRank + tid] = to_e4m3(static_cast<float>(k_pe[tid]) / scale);
  } else {  // fp8_ds_mla
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
    const float scale = fmaxf(amax / kFp8E4m3Max, FLT_MIN);
#pragma unroll
    for (int i = 0; i < 4; ++i) row[4 * tid + i] = to_e4m3(v[i] / scale);
    if (tid % 32 == 0) reinterpret_cast<float*>(row + kDsMlaScaleOffset)[tid / 32] = scale;
    if (tid < kQkRopeHeadDim) {
      __nv_bfloat16* rope = reinterpret_cast<__nv_bfloat16*>(row + kDsMlaRopeOffset);
      rope[tid] = k_pe == nullptr ? __float2bfloat16(0.f) : __float2bfloat16(static_cast<float>(k_pe[tid]));
    }
  }
}

}  // namespace sparse_mla
