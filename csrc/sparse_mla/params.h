// Parameters of the sparse-MLA forward kernels: plain pointers, strides in elements, sizes.
// Nothing framework-specific: the torch binding fills this from tensors (api.cpp).
#pragma once

#include <cstdint>

namespace sparse_mla {

// A kernel of one configuration: its main kernel, or one of the variants the planner may pick
// (kernel_traits.h OneStage for 16-head 16-bit caches, DecodedFp8 for fp8 caches, PairedScores
// for 16-head fp8_ds_mla at D = 576, E4m3Pv for fp8_ds_mla's P V on e4m3 MMAs).
enum class FwdVariant : int { kMain = 0, kOneStage = 1, kDecodedFp8 = 2, kPairedScores = 3, kE4m3Pv = 4 };

struct SparseMlaFwdParams {
  // q = [q_nope | q_pe]: q_nope [T, H, 512 or D]; q_pe [T, H, R] or null (q_nope holds all of D).
  const void* q_nope;
  const void* q_pe;
  int64_t q_nope_stride_t, q_nope_stride_h;
  int64_t q_pe_stride_t, q_pe_stride_h;
  int q_nope_dim;  // columns taken from q_nope (512, or D when q_pe is null)

  // Cache rows, `kv_row_stride` bytes apart; row r at kv + r * kv_row_stride.
  const uint8_t* kv;
  int64_t kv_row_stride;  // bytes
  int64_t num_kv_rows;
  const float* k_scale;  // fp8_e4m3 per-tensor scale (device pointer), else null

  // indices [T, indices_stride_t] int32 physical rows; optional topk_len [T].
  const int32_t* indices;
  int64_t indices_stride_t;
  const int32_t* topk_len;
  int topk;

  // out [T, H, 512] (q's dtype), lse [T, H] fp32.
  void* out;
  int64_t out_stride_t, out_stride_h;
  float* lse;
  int64_t lse_stride_t, lse_stride_h;

  int num_tokens;
  int num_heads;
  int head_size;   // D: 512 or 576
  // Blocks of 16 x head_groups heads (1 or 2; kernel_traits.h kHeadGroups), planned by planner.h
  // plan_head_groups. Read by the launch, which picks the kernel.
  int head_groups;
  float sm_scale_log2;  // sm_scale * log2(e): the kernel works in base 2

  // Split of the top-k axis across blocks (flash-decoding). num_splits == 1 writes out/lse
  // directly; otherwise partial results go to the workspace and a combine kernel merges them.
  int num_splits;
  int tiles_per_split;     // KV tiles of kBlockN rows per split
  // A (token, head) row's splits are adjacent, so that the combine reads them at fixed offsets.
  float* partial_out;      // [T, H, num_splits, 512] fp32, normalised by the split's sum
  float* partial_lse;      // [T, H, num_splits] fp32, natural log; -inf for an empty split
  // Threads of a combine block that split the splits between them: kCombineDecodeSplitGroups
  // or 1 (planner.cpp combine_split_groups; combine_kernel.cuh). Read by the launch, not by the kernels.
  int combine_split_groups;
  // The kernel variant the planner chose (planner.h plan_fwd). Read by the launch only.
  FwdVariant variant;
};

// Splits of the top-k axis per launch, at most (planner.h plan_splits; the combine kernel's lse
// registers).
constexpr int kMaxSplits = 128;

constexpr int kCombineDecodeSplitGroups = 4;
// Partial results each thread of a decode combine block loads per round: one round covers
// kCombineDecodeSplitGroups x kCombineDecodeLoads splits; plans of up to kCombineDecodeOneRound
// splits beyond that run a variant of kCombineDecodeMoreLoads, whose one round covers GLM's
// 2176-row top-k in one-tile splits (68); more splits than that take rounds of the 16-load kernel.
// Loads in flight beyond need cost time, so 16 is the default (bench/HISTORY.md v19).
constexpr int kCombineDecodeLoads = 16;
constexpr int kCombineDecodeMoreLoads = 17;
constexpr int kCombineDecodeOneRound = kCombineDecodeSplitGroups * kCombineDecodeMoreLoads;
// Loads per thread of the decode combine for a plan of num_splits (the launch's choice).
constexpr int combine_decode_loads(int num_splits) {
  return num_splits > kCombineDecodeSplitGroups * kCombineDecodeLoads && num_splits <= kCombineDecodeOneRound
             ? kCombineDecodeMoreLoads
             : kCombineDecodeLoads;
}

}  // namespace sparse_mla
