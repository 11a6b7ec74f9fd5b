// Merge of the per-split partial results of a split top-k launch (flash-decoding):
//   lse = log sum_s exp(lse_s),  out = sum_s exp(lse_s - lse) * out_s
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "formats.h"
#include "mma_utils.cuh"
#include "params.h"

namespace sparse_mla {

constexpr int kCombineThreads = kHeadSizeV / 4;  // one float4 of out per thread

// One block per (token, head). The split weights are computed once into shared memory; each
// thread then sums its 4 columns over the splits with the loads unrolled, so that many reads of
// the (L2-resident) partials are in flight instead of one chain of dependent ones.
template <typename Element>
__global__ void __launch_bounds__(kCombineThreads)
    sparse_mla_combine_kernel(const SparseMlaFwdParams p) {
  extern __shared__ float s_weight[];  // [num_splits]
  const int64_t row = blockIdx.x;
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.num_heads;
  const int t = static_cast<int>(row / p.num_heads);
  const int h = static_cast<int>(row % p.num_heads);
  const int tid = threadIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent (launch_template.cuh): wait for the forward kernel's
  // completion and the visibility of its partial results.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (tid < 32) {
    float lse_max = -INFINITY;
    for (int s = tid; s < p.num_splits; s += 32) lse_max = fmaxf(lse_max, p.partial_lse[s * rows + row]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) lse_max = fmaxf(lse_max, __shfl_xor_sync(~0u, lse_max, o));
    float sum = 0.f;
    if (lse_max != -INFINITY)
      for (int s = tid; s < p.num_splits; s += 32) sum += expf(p.partial_lse[s * rows + row] - lse_max);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
    const float lse = lse_max == -INFINITY ? -INFINITY : lse_max + logf(sum);
    for (int s = tid; s < p.num_splits; s += 32)
      s_weight[s] = lse == -INFINITY ? 0.f : expf(p.partial_lse[s * rows + row] - lse);  // 0 for an empty split
    if (tid == 0) p.lse[static_cast<int64_t>(t) * p.lse_stride_t + static_cast<int64_t>(h) * p.lse_stride_h] = lse;
  }
  __syncthreads();
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  // An empty split's partial is finite (zeros), so it can be read and weighted by 0.
  const float4* src = reinterpret_cast<const float4*>(p.partial_out + row * kHeadSizeV) + tid;
#pragma unroll 16
  for (int s = 0; s < p.num_splits; ++s) {
    const float w = s_weight[s];
    const float4 v = src[s * rows * (kHeadSizeV / 4)];
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  Element* out = static_cast<Element*>(p.out) + static_cast<int64_t>(t) * p.out_stride_t +
                 static_cast<int64_t>(h) * p.out_stride_h;
  *reinterpret_cast<uint2*>(out + 4 * tid) = make_uint2(pack2<Element>(acc.x, acc.y), pack2<Element>(acc.z, acc.w));
}

}  // namespace sparse_mla
