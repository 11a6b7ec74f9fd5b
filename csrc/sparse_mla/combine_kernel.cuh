// Merge of the per-split partial results of a split top-k launch (flash-decoding):
//   lse = log sum_s exp(lse_s),  out = sum_s exp(lse_s - lse) * out_s
// One warp per (token, head); each lane owns 16 of the 512 output columns.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "formats.h"
#include "mma_utils.cuh"
#include "params.h"

namespace sparse_mla {

constexpr int kCombineWarps = 4;

template <typename Element>
__global__ void __launch_bounds__(kCombineWarps * 32)
    sparse_mla_combine_kernel(const SparseMlaFwdParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.num_heads;
  if (row >= rows) return;
  const int t = static_cast<int>(row / p.num_heads);
  const int h = static_cast<int>(row % p.num_heads);

  float lse_max = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) lse_max = fmaxf(lse_max, p.partial_lse[s * rows + row]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) lse_max = fmaxf(lse_max, __shfl_xor_sync(~0u, lse_max, o));

  float lse = -INFINITY;
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.f;
  if (lse_max != -INFINITY) {
    float sum = 0.f;
    for (int s = lane; s < p.num_splits; s += 32) sum += expf(p.partial_lse[s * rows + row] - lse_max);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
    lse = lse_max + logf(sum);
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = expf(p.partial_lse[s * rows + row] - lse);
      if (w == 0.f) continue;  // an empty split (lse_s = -inf)
      const float4* src = reinterpret_cast<const float4*>(p.partial_out + (s * rows + row) * kHeadSizeV);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = src[lane + 32 * i];
        acc[4 * i] += w * v.x;
        acc[4 * i + 1] += w * v.y;
        acc[4 * i + 2] += w * v.z;
        acc[4 * i + 3] += w * v.w;
      }
    }
  }
  Element* out = static_cast<Element*>(p.out) + static_cast<int64_t>(t) * p.out_stride_t +
                 static_cast<int64_t>(h) * p.out_stride_h;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint2 v = make_uint2(pack2<Element>(acc[4 * i], acc[4 * i + 1]),
                         pack2<Element>(acc[4 * i + 2], acc[4 * i + 3]));
    *reinterpret_cast<uint2*>(out + 4 * (lane + 32 * i)) = v;
  }
  if (lane == 0) p.lse[static_cast<int64_t>(t) * p.lse_stride_t + static_cast<int64_t>(h) * p.lse_stride_h] = lse;
}

}  // namespace sparse_mla
