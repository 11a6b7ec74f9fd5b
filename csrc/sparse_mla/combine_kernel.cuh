// Merge of the per-split partial results of a split top-k launch (flash-decoding):
//   lse = log sum_s exp(lse_s),  out = sum_s exp(lse_s - lse) * out_s
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "formats.h"
#include "mma_utils.cuh"
#include "params.h"

namespace sparse_mla {

// Thread (group g, column chunk c) sums float4 c of out over the splits g, g + G, ...
// (G = kSplitGroups), and the G partial sums meet in shared memory. Every warp reduces the split
// lse values itself (L1 serves the repeated reads), so the first round of partial loads is
// issued before that reduction and nothing waits on a barrier until the end.
// G = 4 when the (token, head) rows leave SMs idle (decode), with each row's 128 float4 columns
// spread over kColumnSlices blocks so that more SMs share its loads (one block per row was bound
// by what one SM loads: T = 1 took the same ~3.7 us at 8 and 128 heads; four blocks, 1.07-1.10x
// at T = 1 and 4 with <= 32 heads, eight no more; bench/NOTES.md v12); G = 1, one block per row,
// small blocks with few registers, when the rows alone fill the GPU (T = 64, H = 16: 1024 rows,
// where one 512-thread block per SM ran 1.4x slower). The planner picks G (api.cpp
// combine_split_groups).
constexpr int kFloat4PerRow = kHeadSizeV / 4;

template <int kSplitGroups, int kDecodeLoads = kCombineDecodeLoads>
struct CombineConfig {
  static constexpr int kColumnSlices = kSplitGroups > 1 ? 4 : 1;  // blocks per (token, head) row
  static constexpr int kColumnThreads = kFloat4PerRow / kColumnSlices;
  static constexpr int kThreads = kColumnThreads * kSplitGroups;
  static constexpr int kLoadsInFlight = kSplitGroups > 1 ? kDecodeLoads : 8;  // splits per thread per round
  // G = 1: at least 8 blocks per SM (64 registers), so that a T = 64, H = 16 launch (1024 rows)
  // is one wave on 128+ SMs. G = 4: the four blocks of a row per SM (128 registers; sm_120a
  // took 138 and three blocks without the bound), so that up to num_sms rows are one wave.
  static constexpr int kMinBlocksPerSm = kSplitGroups > 1 ? kColumnSlices : 8;
  // Every warp reduces the lse values with full-warp shuffles: whole warps, over whole rows.
  static_assert(kFloat4PerRow % kColumnSlices == 0 && kThreads % 32 == 0);
};

template <typename Element, int kSplitGroups, int kDecodeLoads = kCombineDecodeLoads>
__global__ void __launch_bounds__(CombineConfig<kSplitGroups, kDecodeLoads>::kThreads,
                                  CombineConfig<kSplitGroups, kDecodeLoads>::kMinBlocksPerSm)
    sparse_mla_combine_kernel(const SparseMlaFwdParams p) {
  using Config = CombineConfig<kSplitGroups, kDecodeLoads>;
  constexpr int kLoads = Config::kLoadsInFlight;
  __shared__ float4 s_acc[kSplitGroups > 1 ? kSplitGroups - 1 : 1][Config::kColumnThreads];
  const int64_t row = blockIdx.x;
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.num_heads;
  const int t = static_cast<int>(row / p.num_heads);
  const int h = static_cast<int>(row % p.num_heads);
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int slice_col = tid % Config::kColumnThreads;
  const int slice = Config::kColumnSlices > 1 ? static_cast<int>(blockIdx.y) : 0;
  const int col = slice * Config::kColumnThreads + slice_col;  // float4 column of the row
  const int group = tid / Config::kColumnThreads;
  const float* lse_of = p.partial_lse + row;  // split s: lse_of[s * rows]
  const float4* out_of = reinterpret_cast<const float4*>(p.partial_out + row * kHeadSizeV) + col;  // [s * rows * 128]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent (launch_template.cuh): wait for the forward kernel's
  // completion and the visibility of its partial results.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  // The narrow layout (64 registers) re-reads each split's lse from L1 (this warp's reduction
  // below read it) instead of holding it while the partials are in flight: with it held, eight
  // loads in flight spilled.
  constexpr bool kHoldLse = kSplitGroups > 1;
  float4 v[kLoads];
  float v_lse[kHoldLse ? kLoads : 1];
  auto load_round = [&](int first) {
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int s = first + k * kSplitGroups;
      const bool in = s < p.num_splits;
      v[k] = in ? out_of[s * rows * kFloat4PerRow] : make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (kHoldLse) v_lse[k] = in ? lse_of[s * rows] : -INFINITY;
    }
  };
  load_round(group);

  float lse_max = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) lse_max = fmaxf(lse_max, lse_of[s * rows]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) lse_max = fmaxf(lse_max, __shfl_xor_sync(~0u, lse_max, o));
  float sum = 0.f;
  if (lse_max != -INFINITY)
    for (int s = lane; s < p.num_splits; s += 32) sum += expf(lse_of[s * rows] - lse_max);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
  const float lse = lse_max == -INFINITY ? -INFINITY : lse_max + logf(sum);
  if (tid == 0 && slice == 0) p.lse[static_cast<int64_t>(t) * p.lse_stride_t + static_cast<int64_t>(h) * p.lse_stride_h] = lse;

  // An empty split's partial is finite (zeros) with lse -inf: weight 0.
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int first = group;;) {
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int s = first + k * kSplitGroups;
      float lse_s = -INFINITY;
      if constexpr (kHoldLse) lse_s = v_lse[k];
      else if (s < p.num_splits) lse_s = lse_of[s * rows];
      const float w = lse == -INFINITY ? 0.f : expf(lse_s - lse);
      acc.x += w * v[k].x;
      acc.y += w * v[k].y;
      acc.z += w * v[k].z;
      acc.w += w * v[k].w;
    }
    first += kSplitGroups * kLoads;
    if (first >= p.num_splits) break;
    load_round(first);
  }
  if constexpr (kSplitGroups > 1) {
    if (group > 0) s_acc[group - 1][slice_col] = acc;
    __syncthreads();
    if (group > 0) return;
#pragma unroll
    for (int g = 0; g < kSplitGroups - 1; ++g) {
      const float4 a = s_acc[g][slice_col];
      acc.x += a.x;
      acc.y += a.y;
      acc.z += a.z;
      acc.w += a.w;
    }
  }
  Element* out = static_cast<Element*>(p.out) + static_cast<int64_t>(t) * p.out_stride_t +
                 static_cast<int64_t>(h) * p.out_stride_h;
  *reinterpret_cast<uint2*>(out + 4 * col) = make_uint2(pack2<Element>(acc.x, acc.y), pack2<Element>(acc.z, acc.w));
}

}  // namespace sparse_mla
