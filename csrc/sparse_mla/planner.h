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

// Split of the top-k axis across blocks (flash-decoding) for num_tokens x num_heads in blocks of
// 16 x head_groups heads: the split count that minimises a cost model of tiles per SM plus the
// combine pass (planner.cpp), within kMinTilesPerSplit, kMaxSplitBlocksPerSm and workspace_bytes.
// blocks_per_sm: the kernel's occupancy; format: the cache's (co_resident_tile_time).
struct SplitPlan {
  int num_splits;
  int tiles_per_split;
  FwdVariant variant = FwdVariant::kMain;  // plan_fwd_splits' choice
};
SplitPlan plan_splits(int num_tokens, int num_heads, int head_groups, KvFormat format, int topk, int num_sms,
                      int64_t workspace_bytes, int blocks_per_sm = 1);
// Two tiles per split (one tile leaves no second gather in flight), but one for launches of at
// most kOneTileSplitMaxRows (token, head) rows within one round of the decode combine.
constexpr int kMinTilesPerSplit = 2;
constexpr int kOneTileSplitMaxRows = 16;
constexpr int kMaxSplitBlocksPerSm = 3;
// Combine-pass cost in tile-times (one block's time for one KV tile; ~2 us on the H200): a fixed
// part for its launch, and the write + read of the partial results (bytes per SM per tile-time).
constexpr double kCombineFixedTiles = 1.0;
constexpr double kCombineBytesPerTile = 64.0 * 1024;
// Tile time of a block that shares its SM with `blocks` - 1 others, relative to a lone block's:
// co-resident blocks hide each other's gathers, long blocks most (kCoResidentMinTiles, and three
// or more with kCoResidentThreeMinTiles); short ones only for the bf16 cache, whose tile is the
// longest, or at decode, where the combine takes all splits in one round. Fitted on the H200
// (bench/HISTORY.md v21).
constexpr double kCoResidentTileTime = 0.7;
constexpr int kCoResidentMinTiles = 8;
constexpr double kCoResidentTileTimeThree = 0.65;
constexpr int kCoResidentThreeMinTiles = 16;
constexpr double kCoResidentShortTileTime = 0.75;
constexpr int kCoResidentShortMinTiles = 4;
double co_resident_tile_time(KvFormat format, int num_tokens, int num_heads, int num_sms, int64_t blocks,
                             int tiles_per_split);

// Heads per block, in groups of 16: 1 up to 16 heads; above, 16-head blocks for fp8 caches where
// an SM holds two of them (two blocks wait on no common barrier; for 16-bit caches 32-head blocks
// were faster on the H200 but for bf16 at head_size 512, up to 1.5 % slower, bench/HISTORY.md v25),
// but where e4m3 converts in hardware and the 32-head grid has more blocks than SMs (their
// WideWarps kernel: fp8_e4m3 1.10-1.21x there on the H200 and 0.89-0.94x in one-wave grids, v42;
// fp8_ds_mla ~1.1-1.25x, v43-v44; its PingPong body 1.16-1.38x on an H100, v49), or where the
// 32-head plan would split into short blocks (decode: a block's time is its chain of tiles); else
// 32-head blocks, which gather each row once for 32 heads (v18). sm_version: as plan_fwd's.
int plan_head_groups(int num_tokens, int num_heads, KvFormat format, int topk, int num_sms, int64_t workspace_bytes,
                     int sixteen_head_blocks_per_sm, int thirty_two_head_blocks_per_sm, int sm_version = 0);

// Layout of the combine pass of a split launch (params.h combine_split_groups):
// kCombineDecodeSplitGroups thread groups over the splits when the num_tokens x num_heads rows
// leave SMs idle (decode), else one group (combine_kernel.cuh; bench/HISTORY.md v10).
int combine_split_groups(int num_tokens, int num_heads, int num_splits, int num_sms);

// Whether an SM holds one block of a configuration's main kernel but two or more of a variant's
// (OneStage, PairedScores, DecodedFp8 on SMs of 100 KB; never on the H200).
constexpr bool variant_raises_occupancy(int blocks_per_sm, int variant_blocks_per_sm) {
  return blocks_per_sm < 2 && variant_blocks_per_sm >= 2;
}

// Whether `plan` (made at the one-stage occupancy) should run the one-stage kernel: some SM gets
// two blocks to hide each other's gathers, and blocks are long (kOneStageMinTiles) or the grid
// unsplit with two blocks per SM; short split blocks lose the tile a two-stage block prefetches
// (bench/HISTORY.md v11, v12).
bool one_stage_plan(int num_tokens, int num_heads, int head_groups, const SplitPlan& plan, int num_sms);
constexpr int kOneStageMinTiles = 16;

// The split plan and kernel variant, in this order: the one-stage variant where it raises the
// occupancy and one_stage_plan agrees; the paired-scores variant of raw fp8 tiles where it raises
// the occupancy; the decode-once fp8 variant where it does; else the main kernel. Each plan is
// plan_splits' at that kernel's occupancy (bench/HISTORY.md v11-v14, v22). plan_fwd then runs
// the decode-once kernel instead where decoded_fp8_plan asks for it.
SplitPlan plan_fwd_splits(int num_tokens, int num_heads, int head_groups, KvFormat format, int topk, int num_sms,
                          int64_t workspace_bytes, int blocks_per_sm, int one_stage_blocks_per_sm,
                          int decoded_fp8_blocks_per_sm = 0, int paired_scores_blocks_per_sm = 0);

// Whether an fp8 launch should decode each tile once into shared memory instead of per MMA
// fragment: in one-wave grids (a block alone on its SM gains nothing from the smaller
// shared-memory traffic and pays the extra conversions; bench/HISTORY.md v13), and before sm_89,
// which converts e4m3 in software. Needs num_sms > 0; sm_version 0 is unknown.
bool decoded_fp8_plan(int num_tokens, int num_heads, int head_groups, const SplitPlan& plan, int num_sms,
                      int sm_version = 0);
constexpr int kFp8ConvertSmVersion = 89;
// Whether a device of `sm_version` (0: unknown) converts e4m3 in software.
constexpr bool software_fp8_convert(int sm_version) { return sm_version > 0 && sm_version < kFp8ConvertSmVersion; }

// Workspace bytes that cover every split plan on a device with num_sms SMs.
int64_t workspace_size(int num_sms);

}  // namespace sparse_mla
