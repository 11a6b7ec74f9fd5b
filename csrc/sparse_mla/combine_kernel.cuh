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
// lse values itself, each lane holding its share in registers, so the first round of partial
// loads is issued before that reduction and nothing waits on a barrier until the end.
// G = 4 when the (token, head) rows leave SMs idle (decode), each row spread over kColumnSlices
// blocks so that more SMs share its loads (one block per row is bound by what one SM loads);
// G = 1, one small block per row, when the rows alone fill the GPU. The planner picks G
// (planner.cpp combine_split_groups; measurements in bench/HISTORY.md v12).
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
  static __shared__ float4 s_acc[kSplitGroups > 1 ? kSplitGroups - 1 : 1][Config::kColumnThreads];
  const int row = blockIdx.x;
  const int t = row / p.num_heads;
  const int h = row - t * p.num_heads;
  const int num_splits = p.num_splits;
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int slice_col = tid % Config::kColumnThreads;
  const int slice = Config::kColumnSlices > 1 ? static_cast<int>(blockIdx.y) : 0;
  const int col = slice * Config::kColumnThreads + slice_col;  // float4 column of the row
  const int group = tid / Config::kColumnThreads;
  // The row's splits are adjacent (params.h), so each load below is one base and an immediate
  // offset: a decode combine runs one warp per scheduler, where every instruction after the wait
  // is latency (bench/HISTORY.md v20).
  const float* lse_of = p.partial_lse + static_cast<int64_t>(row) * num_splits;  // [split]
  const float4* out_of = reinterpret_cast<const float4*>(p.partial_out) +
                         static_cast<int64_t>(row) * num_splits * kFloat4PerRow + col;  // [split][128]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent (launch_template.cuh): wait for the forward kernel's
  // completion and the visibility of its partial results.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  float4 v[kLoads];
  auto load_round = [&](int first) {
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int s = first + k * kSplitGroups;
      v[k] = s < num_splits ? out_of[s * kFloat4PerRow] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load_round(group);

  // The row's lse = log sum_s exp(lse_s): lane l holds splits l, l + 32, ... in registers, loaded
  // once, unrolled (no loop over the split count).
  constexpr int kLsePerLane = (kMaxSplits + 31) / 32;
  float lse_lane[kLsePerLane];
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i) {
    const int s = lane + 32 * i;
    lse_lane[i] = s < num_splits ? lse_of[s] : -INFINITY;
  }
  float lse_max = lse_lane[0];
#pragma unroll
  for (int i = 1; i < kLsePerLane; ++i) lse_max = fmaxf(lse_max, lse_lane[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) lse_max = fmaxf(lse_max, __shfl_xor_sync(~0u, lse_max, o));
  float sum = 0.f;
  if (lse_max != -INFINITY) {
#pragma unroll
    for (int i = 0; i < kLsePerLane; ++i) sum += expf(lse_lane[i] - lse_max);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
  const float lse = lse_max == -INFINITY ? -INFINITY : lse_max + logf(sum);
  if (tid == 0 && slice == 0) p.lse[static_cast<int64_t>(t) * p.lse_stride_t + static_cast<int64_t>(h) * p.lse_stride_h] = lse;

  // Split weights exp(lse_s - lse), computed where the lse values are: lane l's for its splits.
  // An empty split's partial is finite (zeros) with lse -inf: weight 0; so are all of them when
  // the row's lse is -inf (then taken as 0: no branch per split).
  const float lse_w = lse == -INFINITY ? 0.f : lse;
  float w_lane[kLsePerLane];
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i) w_lane[i] = expf(lse_lane[i] - lse_w);
  // In the first round, this warp's split s = group + G k is held by lane s % 32 in slot s / 32 =
  // G k / 32 (G divides 32 and group < G, kernel-constant); later rounds (more than G x kLoads
  // splits) read their lse values again.
  static_assert(32 % kSplitGroups == 0 && Config::kColumnThreads % 32 == 0, "a warp is in one group");
  static_assert(kSplitGroups * kLoads <= 32 * kLsePerLane, "the first round's weights are in registers");
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto accumulate = [&](float w, const float4& x) {
    acc.x += w * x.x;
    acc.y += w * x.y;
    acc.z += w * x.z;
    acc.w += w * x.w;
  };
#pragma unroll
  for (int k = 0; k < kLoads; ++k)
    accumulate(__shfl_sync(~0u, w_lane[k * kSplitGroups / 32], group + k * kSplitGroups % 32), v[k]);
  for (int first = group + kSplitGroups * kLoads; first < num_splits; first += kSplitGroups * kLoads) {
    load_round(first);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int s = first + k * kSplitGroups;
      accumulate(s < num_splits ? expf(lse_of[s] - lse_w) : 0.f, v[k]);
    }
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

// fn(kernel, grid, block) with the combine kernel of a split launch and its grid and block: the
// layout the planner chose (params.h combine_split_groups; at decode four thread groups over the
// splits and each (token, head) row in four blocks, else one block per row) and, at decode, the
// loads per round (combine_decode_loads).
template <typename Element, typename Fn>
auto with_combine_kernel(const SparseMlaFwdParams& p, Fn&& fn) {
  constexpr int kWide = kCombineDecodeSplitGroups;
  const unsigned rows = static_cast<unsigned>(static_cast<int64_t>(p.num_tokens) * p.num_heads);
  if (p.combine_split_groups != kWide)
    return fn(sparse_mla_combine_kernel<Element, 1>, dim3(rows, CombineConfig<1>::kColumnSlices),
              dim3(CombineConfig<1>::kThreads));
  // Both load counts share CombineConfig<kWide>'s grid and block.
  static_assert(CombineConfig<kWide, kCombineDecodeMoreLoads>::kThreads == CombineConfig<kWide>::kThreads &&
                CombineConfig<kWide, kCombineDecodeMoreLoads>::kColumnSlices == CombineConfig<kWide>::kColumnSlices);
  const dim3 grid(rows, CombineConfig<kWide>::kColumnSlices), block(CombineConfig<kWide>::kThreads);
  return combine_decode_loads(p.num_splits) == kCombineDecodeMoreLoads
             ? fn(sparse_mla_combine_kernel<Element, kWide, kCombineDecodeMoreLoads>, grid, block)
             : fn(sparse_mla_combine_kernel<Element, kWide>, grid, block);
}

}  // namespace sparse_mla
