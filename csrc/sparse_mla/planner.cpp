// The launch planner (see planner.h).
#include "planner.h"

#include <algorithm>
#include <cmath>

#include "kernel_traits.h"

namespace sparse_mla {

namespace {

constexpr int kBlockN = 32;  // KV rows per tile, SparseMlaFwdTraits::kBlockN for every config
static_assert(SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, kHeadSizeRoPE, 1>::kBlockN == kBlockN);
static_assert(kMaxBlockH == 16 * kMaxHeadGroups);

// Blocks of an unsplit launch: one per token and head block of 16 x head_groups heads.
int64_t unsplit_blocks(int num_tokens, int num_heads, int head_groups) {
  const int bh = 16 * head_groups;
  return static_cast<int64_t>(num_tokens) * ((num_heads + bh - 1) / bh);
}

// Whether a launch's (token, head) rows are at most one per SM: the decode combine's layout
// (combine_split_groups), whose one round covers up to 68 splits (params.h kCombineDecodeOneRound).
bool rows_fit_one_per_sm(int num_tokens, int num_heads, int num_sms) {
  return num_sms > 0 && static_cast<int64_t>(num_tokens) * num_heads <= num_sms;
}

}  // namespace

double co_resident_tile_time(KvFormat format, int num_tokens, int num_heads, int num_sms, int64_t blocks,
                             int tiles_per_split) {
  if (blocks < 2) return 1.0;
  if (blocks >= 3 && tiles_per_split >= kCoResidentThreeMinTiles) return kCoResidentTileTimeThree;
  if (tiles_per_split >= kCoResidentMinTiles) return kCoResidentTileTime;
  const bool short_blocks = format == KvFormat::kBFloat16 || rows_fit_one_per_sm(num_tokens, num_heads, num_sms);
  return short_blocks && tiles_per_split >= kCoResidentShortMinTiles ? kCoResidentShortTileTime : 1.0;
}

SplitPlan plan_splits(int num_tokens, int num_heads, int head_groups, KvFormat format, int topk, int num_sms,
                      int64_t workspace_bytes, int blocks_per_sm) {
  // Outside the domain plan_sparse_mla_fwd admits (H 1..128, 1 or 2 head groups, topk 1..2^30):
  // no split.
  if (num_tokens <= 0 || num_heads <= 0 || num_heads > kMaxNumHeads || head_groups < 1 ||
      head_groups > kMaxHeadGroups || topk <= 0 || topk > (1 << 30))
    return SplitPlan{1, topk > 0 ? static_cast<int>((static_cast<int64_t>(topk) + kBlockN - 1) / kBlockN) : 1};
  const int num_tiles = (topk + kBlockN - 1) / kBlockN;
  const int64_t base_blocks = unsplit_blocks(num_tokens, num_heads, head_groups);
  SplitPlan best{1, num_tiles};
  if (num_sms <= 0 || num_tiles < 2) return best;
  // Partial results per split: [T, H, 512] + [T, H] fp32.
  const int64_t per_split = static_cast<int64_t>(num_tokens) * num_heads * (kHeadSizeV + 1) * 4;
  // Time in tile-times of a lone block: the most blocks an SM gets x tiles per block, each tile
  // shortened where the SM holds several of those blocks at once (they hide each other's
  // latencies; co_resident_tile_time), plus for a split launch the combine pass
  // (kCombineFixedTiles, and its partial-result traffic at kCombineBytesPerTile per SM per
  // tile-time). Ties go to fewer splits.
  auto cost = [&](int tiles_per_split, int splits) {
    const int64_t per_sm = (base_blocks * splits + num_sms - 1) / num_sms;
    double c = static_cast<double>(per_sm * tiles_per_split);
    c *= co_resident_tile_time(format, num_tokens, num_heads, num_sms, std::min<int64_t>(blocks_per_sm, per_sm),
                               tiles_per_split);
    if (splits > 1)
      c += kCombineFixedTiles + static_cast<double>(per_split) * splits / num_sms / kCombineBytesPerTile;
    return c;
  };
  double best_cost = cost(best.tiles_per_split, 1);
  // Splits of one tile only for few rows, within one round of the decode combine (planner.h).
  const bool one_tile_splits = static_cast<int64_t>(num_tokens) * num_heads <= kOneTileSplitMaxRows &&
                               num_tiles <= kCombineDecodeOneRound;
  const int max_splits = std::min(kMaxSplits, num_tiles / (one_tile_splits ? 1 : kMinTilesPerSplit));
  for (int s = 2; s <= max_splits; ++s) {
    const int tiles_per_split = (num_tiles + s - 1) / s;
    const int splits = (num_tiles + tiles_per_split - 1) / tiles_per_split;  // no empty split
    if (base_blocks * splits > static_cast<int64_t>(kMaxSplitBlocksPerSm) * num_sms) break;
    if (per_split * splits > workspace_bytes) break;
    const double c = cost(tiles_per_split, splits);
    if (c < best_cost - 1e-9) {
      best_cost = c;
      best = SplitPlan{splits, tiles_per_split};
    }
  }
  return best;
}

int combine_split_groups(int num_tokens, int num_heads, int num_splits, int num_sms) {
  if (num_splits <= 1) return 1;
  return rows_fit_one_per_sm(num_tokens, num_heads, num_sms) ? kCombineDecodeSplitGroups : 1;
}

bool one_stage_plan(int num_tokens, int num_heads, int head_groups, const SplitPlan& plan, int num_sms) {
  const int64_t blocks = unsplit_blocks(num_tokens, num_heads, head_groups) * plan.num_splits;
  if (num_sms <= 0 || blocks <= num_sms) return false;
  return plan.tiles_per_split >= kOneStageMinTiles || (plan.num_splits == 1 && blocks >= 2 * int64_t{num_sms});
}

bool decoded_fp8_plan(int num_tokens, int num_heads, int head_groups, const SplitPlan& plan, int num_sms,
                      int sm_version) {
  if (software_fp8_convert(sm_version)) return true;
  return num_sms > 0 && unsplit_blocks(num_tokens, num_heads, head_groups) * plan.num_splits <= num_sms;
}

SplitPlan plan_fwd_splits(int num_tokens, int num_heads, int head_groups, KvFormat format, int topk, int num_sms,
                          int64_t workspace_bytes, int blocks_per_sm, int one_stage_blocks_per_sm,
                          int decoded_fp8_blocks_per_sm, int paired_scores_blocks_per_sm) {
  const auto plan_at = [&](int occupancy) {
    return plan_splits(num_tokens, num_heads, head_groups, format, topk, num_sms, workspace_bytes, occupancy);
  };
  if (variant_raises_occupancy(blocks_per_sm, one_stage_blocks_per_sm)) {
    SplitPlan plan = plan_at(one_stage_blocks_per_sm);
    if (one_stage_plan(num_tokens, num_heads, head_groups, plan, num_sms)) {
      plan.variant = FwdVariant::kOneStage;
      return plan;
    }
  }
  if (variant_raises_occupancy(blocks_per_sm, paired_scores_blocks_per_sm)) {
    SplitPlan plan = plan_at(paired_scores_blocks_per_sm);
    plan.variant = FwdVariant::kPairedScores;
    return plan;
  }
  if (variant_raises_occupancy(blocks_per_sm, decoded_fp8_blocks_per_sm)) {
    SplitPlan plan = plan_at(decoded_fp8_blocks_per_sm);
    plan.variant = FwdVariant::kDecodedFp8;
    return plan;
  }
  return plan_at(blocks_per_sm);
}

int plan_head_groups(int num_tokens, int num_heads, KvFormat format, int topk, int num_sms, int64_t workspace_bytes,
                     int sixteen_head_blocks_per_sm, int thirty_two_head_blocks_per_sm, int sm_version) {
  if (num_heads <= 16) return 1;
  const bool wide_fp8 = !software_fp8_convert(sm_version) && unsplit_blocks(num_tokens, num_heads, kMaxHeadGroups) > num_sms;
  if (sixteen_head_blocks_per_sm >= 2 && is_fp8(format) && !wide_fp8) return 1;
  const SplitPlan wide = plan_splits(num_tokens, num_heads, kMaxHeadGroups, format, topk, num_sms, workspace_bytes,
                                     thirty_two_head_blocks_per_sm);
  return wide.num_splits > 1 && wide.tiles_per_split < kCoResidentMinTiles ? 1 : kMaxHeadGroups;
}

int64_t workspace_size(int num_sms) {
  // A split launch has at most kMaxSplitBlocksPerSm * num_sms blocks of at most kMaxBlockH heads.
  return static_cast<int64_t>(kMaxSplitBlocksPerSm) * num_sms * kMaxBlockH * (kHeadSizeV + 1) * 4;
}

FwdPlan plan_fwd(DType dtype, KvFormat format, int head_size, int num_tokens, int num_heads, int topk, int num_sms,
                 int64_t workspace_bytes, int block_heads, BlocksPerSmFn blocks_per_sm, int sm_version) {
  // Occupancies are CUDA queries (cached per device): asked only for a launch.
  const bool ask = blocks_per_sm != nullptr && num_tokens > 0;
  const auto occupancy = [&](int head_groups, FwdVariant variant) {
    return ask ? blocks_per_sm(dtype, format, head_size, head_groups, variant) : variant == FwdVariant::kMain ? 1 : 0;
  };
  // The main kernels' occupancies of 16- and 32-head blocks, asked once each.
  const int main_blocks[kMaxHeadGroups] = {occupancy(1, FwdVariant::kMain),
                                           occupancy(kMaxHeadGroups, FwdVariant::kMain)};
  const int head_groups = block_heads != 0
                              ? block_heads / 16
                              : plan_head_groups(num_tokens, num_heads, format, topk, num_sms, workspace_bytes,
                                                 main_blocks[0], main_blocks[1], sm_version);
  const int decoded_fp8_blocks = is_fp8(format) ? occupancy(head_groups, FwdVariant::kDecodedFp8) : 0;
  // Before sm_89 every fp8 launch decodes once (decoded_fp8_plan): planned at that occupancy, and
  // the paired-scores variant of raw tiles never runs.
  const bool software_fp8 = software_fp8_convert(sm_version);
  const SplitPlan split = plan_fwd_splits(
      num_tokens, num_heads, head_groups, format, topk, num_sms, workspace_bytes,
      software_fp8 && decoded_fp8_blocks > 0 ? decoded_fp8_blocks : main_blocks[head_groups - 1],
      occupancy(head_groups, FwdVariant::kOneStage), decoded_fp8_blocks,
      software_fp8 ? 0 : occupancy(head_groups, FwdVariant::kPairedScores));
  FwdPlan plan{};
  plan.head_groups = head_groups;
  plan.num_splits = split.num_splits;
  plan.tiles_per_split = split.tiles_per_split;
  const bool decoded_fp8 = is_fp8(format) && decoded_fp8_plan(num_tokens, num_heads, head_groups, split, num_sms,
                                                               sm_version);
  plan.variant = decoded_fp8 ? FwdVariant::kDecodedFp8 : split.variant;
  plan.combine_split_groups = combine_split_groups(num_tokens, num_heads, plan.num_splits, num_sms);
  return plan;
}

}  // namespace sparse_mla
