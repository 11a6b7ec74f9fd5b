// The launch planner of the sparse-MLA forward: heads per block, the split of the top-k axis,
// the kernel variant and the combine layout, from the launch's shape, the cache format, the GPU's
// SM count and the kernels' occupancies, with its tuning constants. Framework-free and free of
// CUDA calls (occupancies come in through BlocksPerSmFn), so GoogleTest drives it on a CPU.
// api.cpp checks the arguments and calls plan_fwd; the measurements behind each rule are in
// bench/HISTORY.md and the rules in words in docs/kernel.md.
#pragma once

#include <cstdint>

#include "formats.h"
#include "params.h"

namespace sparse_mla {

// Blocks of the kernel for (dtype, format, head_size, head_groups of 16 heads per block) one SM
// holds at once, or those of its `variant`, 0 where it has none (fwd_blocks_per_sm in launch.h).
using BlocksPerSmFn = int (*)(DType dtype, KvFormat format, int head_size, int head_groups, FwdVariant variant);

// Heads in the largest block (16 x kernel_traits.h kMaxHeadGroups; planner.cpp checks).
constexpr int kMaxBlockH = 32;

// What a launch runs: 16 x head_groups heads per block, num_splits splits of the top-k axis of
// tiles_per_split tiles of 32 rows, the kernel variant and the combine kernel's layout.
struct FwdPlan {
  int head_groups;
  int num_splits;
  int tiles_per_split;
  FwdVariant variant;
  int combine_split_groups;
};
// block_heads: 0 (planned), 16 or 32, as checked by plan_sparse_mla_fwd; blocks_per_sm: null
// for one block per SM and no variants; sm_version: 10 x major + minor, 0 unknown.
FwdPlan plan_fwd(DType dtype, KvFormat format, int head_size, int num_tokens, int num_heads, int topk, int num_sms,
                 int64_t workspace_bytes, int block_heads, BlocksPerSmFn blocks_per_sm, int sm_version);

// Split of the top-k axis across blocks for a launch of num_tokens x num_heads in blocks of
// 16 x head_groups heads (flash-decoding): the split count that minimises a simple cost model
// (tiles per SM plus the combine pass, see planner.cpp), with >= kMinTilesPerSplit tiles per split
// (one for few rows, below), at most kMaxSplitBlocksPerSm blocks per SM, and never more workspace
// than `workspace_bytes`.
// format: the cache's (co_resident_tile_time); blocks_per_sm: the kernel's occupancy.
struct SplitPlan {
  int num_splits;
  int tiles_per_split;
  bool one_stage = false;    // run the one-stage 16-head 16-bit kernel (plan_fwd_splits)
  bool decoded_fp8 = false;  // run the fp8 kernel that decodes each tile once (plan_fwd_splits)
  bool paired_scores = false;  // run the paired-scores variant of raw fp8 tiles (plan_fwd_splits)
};
SplitPlan plan_splits(int num_tokens, int num_heads, int head_groups, KvFormat format, int topk, int num_sms,
                      int64_t workspace_bytes, int blocks_per_sm = 1);
// Two (a block of one tile has no second gather in flight behind its first), but one for launches
// of at most kOneTileSplitMaxRows (token, head) rows whose top-k has no more tiles than one round
// of the decode combine covers (params.h kCombineDecodeOneRound = 68; a second round cost
// 1.4-1.6 us at T = 1). On the H200 one-tile splits ran 1.04-1.13x at 8-16 rows (T = 1 at 8 and
// 16 heads, DeepSeek's T = 2 at 8; fp16 1.04-1.05x, the others 1.07-1.13x), but 0.95-1.005x at 32
// rows, whose partial results are twice as large (bench/HISTORY.md v19).
constexpr int kMinTilesPerSplit = 2;
constexpr int kOneTileSplitMaxRows = 16;
constexpr int kMaxSplitBlocksPerSm = 3;
// Combine-pass cost in tile-times (one block's time for one KV tile; ~2 us on the H200): a fixed
// part for its launch, and the write + read of the partial results (bytes per SM per tile-time).
constexpr double kCombineFixedTiles = 1.0;
constexpr double kCombineBytesPerTile = 64.0 * 1024;
// Tile time of a block that shares its SM with `blocks` - 1 others, relative to a lone block's
// (1 for blocks <= 1; plan_splits' cost model), for blocks of tiles_per_split tiles:
// - kCoResidentTileTime for blocks of at least kCoResidentMinTiles tiles (H200, 16-head kernels at
//   two blocks per SM: 0.73 for bf16, 0.57 for fp8_e4m3 caches);
// - kCoResidentTileTimeThree with three or more blocks of at least kCoResidentThreeMinTiles (the
//   H200's 16-head fp8_e4m3 kernel at D = 512, three per SM: 3 splits of 23 tiles ran 1.06-1.08x
//   2 of 34 at T x H = 1024-2048; 9 splits of 8 tiles against 6 of 12, 0.96x);
// - kCoResidentShortTileTime for blocks of kCoResidentShortMinTiles to kCoResidentMinTiles - 1
//   tiles (measured at two per SM) with a bf16 cache, whose 16-head tile is the longest (1.6-1.8 us
//   on the H200 against 1.1-1.6 for the other formats': twice fp8's bytes and, unlike fp16's, two
//   P V passes, hi + lo), or with at most num_sms (token, head) rows, whose decode combine covers up
//   to 64 splits in one round. Above num_sms rows the other formats ran 0.85-0.96x with such blocks
//   (the one-block-per-row combine takes a second round past 8 splits). At kCoResidentTileTime
//   instead, 4-tile blocks also replaced 6-tile ones, 0.915-1.015x (7-tile ones, which this still
//   replaces: 0.988-1.105x); crediting blocks of 2-3 tiles picked plans of 0.86-0.97x but one.
// The plans this changed from v20's rule (blocks of 8 tiles or more, more than one per SM) ran
// 0.99-1.18x on the H200 (39 plans at T = 2-128, 35 of them 1.02-1.18x), 0.99-1.07x with sm_120's
// occupancy (6 plans; bench/HISTORY.md v21).
constexpr double kCoResidentTileTime = 0.7;
constexpr int kCoResidentMinTiles = 8;
constexpr double kCoResidentTileTimeThree = 0.65;
constexpr int kCoResidentThreeMinTiles = 16;
constexpr double kCoResidentShortTileTime = 0.75;
constexpr int kCoResidentShortMinTiles = 4;
double co_resident_tile_time(KvFormat format, int num_tokens, int num_heads, int num_sms, int64_t blocks,
                             int tiles_per_split);

// Heads per block, in groups of 16 (kernel_traits.h kHeadGroups), for a launch of num_tokens x
// num_heads from a cache of `format`: 1 up to 16 heads. Above that, 16-head blocks where an SM
// holds two or more of the 16-head main kernel (sixteen_head_blocks_per_sm: as many warps per SM
// as one 32-head block, in two blocks that wait on no common barrier), but for the fp16 cache;
// or where the 32-head plan splits the top-k axis into blocks of fewer than kCoResidentMinTiles
// tiles (decode: a block's time is its chain of dependent tiles, half as long with 16 heads);
// else 32-head blocks, which gather each row once for 32 heads (thirty_two_head_blocks_per_sm
// plans them). On the H200, which holds two 16-head blocks of every configuration, 16-head blocks
// ran 0.99-1.28x the 32-head ones at 32-128 heads (T = 1 1.07-1.28x, fp8 1.01-1.21x at T >= 64),
// but the fp16 cache's 0.89-0.97x at T >= 16 (GLM H32 T = 16: 1.03x; why is not known); with
// sm_120's occupancy (one 16-head 16-bit or fp8_ds_mla D576 block per SM) 0.79-0.99x at T >= 64
// for those, 1.06-1.28x where this rule picks them at decode (v18 in bench/HISTORY.md). The counts
// are the main kernels': the one-stage 16-bit variant's two 16-head blocks per sm_120 SM were part
// of that 0.91-0.99x (the launches there took it where plan_fwd_splits picks it).
int plan_head_groups(int num_tokens, int num_heads, KvFormat format, int topk, int num_sms, int64_t workspace_bytes,
                     int sixteen_head_blocks_per_sm, int thirty_two_head_blocks_per_sm);

// Layout of the combine pass of a split launch (params.h combine_split_groups):
// kCombineDecodeSplitGroups thread groups over the splits when the num_tokens x num_heads rows
// leave SMs idle (decode), else one group (combine_kernel.cuh; bench/HISTORY.md v10).
int combine_split_groups(int num_tokens, int num_heads, int num_splits, int num_sms);

// Whether an SM holds one block of a configuration's main kernel but two or more of its
// variant: the one-stage 16-head 16-bit kernels (kernel_traits.h OneStage) on sm_120 / sm_121
// and sm_86 / sm_89 (100 KB per SM), sm_80 (164 KB, unmeasured there); the paired-scores and
// decode-once 16-head fp8_ds_mla kernels at D = 576 (PairedScores, 47 KB, and DecodedFp8, 48 KB,
// against 53 KB of raw tiles) on those with 100 KB. Not on the H200, which holds two blocks of
// every 16-head main kernel.
constexpr bool variant_raises_occupancy(int blocks_per_sm, int variant_blocks_per_sm) {
  return blocks_per_sm < 2 && variant_blocks_per_sm >= 2;
}

// Whether `plan` (made at the one-stage occupancy) should run the one-stage kernel: some SM
// gets two blocks, which hide each other's gathers, and either the plan's tiles_per_split is at
// least kOneStageMinTiles (the last split, or a shorter topk_len, may have fewer) or the grid is
// unsplit with two blocks for every SM. With sm_120's occupancy on the H200
// (SPARSE_MLA_SM120_OCCUPANCY=1): T = 64 (4 splits of 16-17 tiles) 1.11-1.19x, T = 256 and 1024
// 1.20-1.25x (bench/HISTORY.md v11, v12); split plans of 2-8 tiles per block, which lose the tile a
// two-stage block prefetches, 0.85-0.96x (v11).
bool one_stage_plan(int num_tokens, int num_heads, int head_groups, const SplitPlan& plan, int num_sms);
constexpr int kOneStageMinTiles = 16;

// The launch's split plan and kernel variant: where variant_raises_occupancy holds for the
// one-stage variant and the plan at its occupancy passes one_stage_plan, that plan with
// one_stage set; else where it holds for the paired-scores variant of raw fp8 tiles
// (kernel_traits.h PairedScores; paired_scores_blocks_per_sm, 0: none), the plan at its
// occupancy with paired_scores set (with sm_120's occupancy on the H200, 16-head fp8_ds_mla at D
// = 576: 1.17-1.27x the decode-once variant at T >= 64, both two per SM; bench/HISTORY.md v22);
// else where it holds for the decode-once fp8 variant (DecodedFp8; decoded_fp8_blocks_per_sm),
// the plan at that variant's occupancy with decoded_fp8 set (with sm_120's occupancy, the 16-head
// fp8_ds_mla D576 kernel of raw tiles, one per SM, ran 0.90-0.99x the decode-once one, two per
// SM; v14); otherwise plan_splits at the main kernel's occupancy. Every plan is plan_splits' for
// the cache's `format`. (plan_sparse_mla_fwd then runs the decode-once kernel instead of the
// paired one where decoded_fp8_plan asks for it: one-wave grids.)
SplitPlan plan_fwd_splits(int num_tokens, int num_heads, int head_groups, KvFormat format, int topk, int num_sms,
                          int64_t workspace_bytes, int blocks_per_sm, int one_stage_blocks_per_sm,
                          int decoded_fp8_blocks_per_sm = 0, int paired_scores_blocks_per_sm = 0);

// Whether an fp8 launch of `plan` should run the kernel variant that decodes each tile once into
// shared memory (kernel_traits.h DecodedFp8) rather than per MMA fragment: the grid is one
// wave, at most one block per SM, where the raw tiles' extra conversions lengthen every tile
// and their smaller shared-memory traffic does not pay (T = 1, 4, 16: 0.81-0.95x with raw tiles;
// T >= 64 at 16 heads 1.07-1.30x; bench/HISTORY.md v13); or the device (sm_version, 10 x major +
// minor) predates sm_89's e4m3 -> f16x2 instruction, where each of the raw path's twice as many
// conversions is a software sequence (unmeasured there, so the decode-once kernel of v12 runs).
// The one-wave rule needs num_sms > 0; sm_version 0 is unknown. plan_sparse_mla_fwd plans
// launches before sm_89 at the decode-once kernel's occupancy (a one-wave grid's plan is the
// same at any occupancy).
bool decoded_fp8_plan(int num_tokens, int num_heads, int head_groups, const SplitPlan& plan, int num_sms,
                      int sm_version = 0);
constexpr int kFp8ConvertSmVersion = 89;
// Whether a device of `sm_version` (0: unknown) converts e4m3 in software.
constexpr bool software_fp8_convert(int sm_version) { return sm_version > 0 && sm_version < kFp8ConvertSmVersion; }

// Workspace bytes that cover every split plan on a device with num_sms SMs.
int64_t workspace_size(int num_sms);

}  // namespace sparse_mla
