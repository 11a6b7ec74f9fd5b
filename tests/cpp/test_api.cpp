// GoogleTest suite of the host API: argument checks (csrc/sparse_mla/api.h) and the planner (planner.h).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>

#include "api.h"
#include "kernel_traits.h"

using namespace sparse_mla;

namespace {

// Head groups of a plan: 16-head and 32-head blocks.
constexpr int kOneGroup = 1;
constexpr int kTwoGroups = 2;

// plan_splits(num_tokens, num_heads, 16-head blocks, format, topk, 132 SMs, blocks_per_sm) is
// `splits` splits of `tiles` tiles.
void expect_h200_plan(int num_tokens, int num_heads, KvFormat format, int topk, int blocks_per_sm, int splits,
                      int tiles) {
  const SplitPlan p =
      plan_splits(num_tokens, num_heads, kOneGroup, format, topk, 132, workspace_size(132), blocks_per_sm);
  EXPECT_EQ(p.num_splits, splits) << num_tokens << " x " << num_heads << ", format " << static_cast<int>(format);
  EXPECT_EQ(p.tiles_per_split, tiles) << num_tokens << " x " << num_heads << ", format " << static_cast<int>(format);
}

// The checks never dereference data: each tensor gets its own 16-byte aligned fake address,
// far enough from the others that no two overlap.
uintptr_t g_next_address = uintptr_t{1} << 20;

TensorDesc tensor(ScalarType dtype, std::initializer_list<int64_t> sizes, int64_t element_size, bool cuda = true,
                  int device = 0) {
  TensorDesc t;
  t.defined = true;
  t.data = reinterpret_cast<const void*>(g_next_address);
  g_next_address += uintptr_t{1} << 36;
  t.dtype = dtype;
  t.dim = static_cast<int>(sizes.size());
  int i = 0;
  for (int64_t s : sizes) t.sizes[i++] = s;
  int64_t stride = 1;
  for (int d = t.dim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.sizes[d];
  }
  t.is_cuda = cuda;
  t.device_index = cuda ? device : -1;
  t.element_size = element_size;
  return t;
}

SparseMlaFwdArgs good_args(int64_t T = 4, int64_t H = 16, int64_t D = 576, int64_t topk = 2048) {
  SparseMlaFwdArgs a;
  a.q = tensor(ScalarType::kBFloat16, {T, H, D}, 2);
  a.kv_cache = tensor(ScalarType::kBFloat16, {256, 64, D}, 2);
  a.indices = tensor(ScalarType::kInt32, {T, topk}, 4);
  a.out = tensor(ScalarType::kBFloat16, {T, H, 512}, 2);
  a.lse = tensor(ScalarType::kFloat32, {T, H}, 4);
  a.workspace = tensor(ScalarType::kUInt8, {workspace_size(132)}, 1);
  a.sm_scale = 0.135234f;
  return a;
}

std::string error_of(const SparseMlaFwdArgs& a, bool require_cuda = true) {
  try {
    plan_sparse_mla_fwd(a, require_cuda, 132);
  } catch (const ArgumentError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(SparseMlaFwdChecks, AcceptsGoodArguments) {
  EXPECT_EQ(error_of(good_args()), "");
  const auto launch = plan_sparse_mla_fwd(good_args(), true, 132);
  EXPECT_EQ(launch.params.head_size, 576);
  EXPECT_EQ(launch.params.num_kv_rows, 256 * 64);
  EXPECT_EQ(launch.params.kv_row_stride, 576 * 2);
  EXPECT_EQ(launch.format, KvFormat::kBFloat16);
}

TEST(SparseMlaFwdChecks, NamesTheBadArgument) {
  auto a = good_args();
  a.q.dtype = ScalarType::kFloat32;
  EXPECT_NE(error_of(a).find("q must be bfloat16 or float16"), std::string::npos);

  a = good_args();
  a.q.sizes[1] = 129;
  EXPECT_NE(error_of(a).find("num_heads) must be in 1..128"), std::string::npos);

  a = good_args();
  a.kv_cache.is_cuda = false;
  EXPECT_NE(error_of(a).find("kv_cache must be a CUDA tensor"), std::string::npos);

  a = good_args();
  a.lse.device_index = 1;
  EXPECT_NE(error_of(a).find("lse must be on the same device as q"), std::string::npos);

  a = good_args();
  a.kv_cache_dtype = "fp8_ds_mla";
  a.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
  EXPECT_NE(error_of(a).find("kv_cache last dim must be 656"), std::string::npos);

  a = good_args();
  a.indices.strides[1] = 2;
  EXPECT_NE(error_of(a).find("indices must have a contiguous last dim"), std::string::npos);

  a = good_args();
  a.out.data = static_cast<const char*>(a.out.data) + 4;
  EXPECT_NE(error_of(a).find("out must start at a 16-byte aligned address"), std::string::npos);

  a = good_args();
  a.topk = 0;
  EXPECT_NE(error_of(a).find("topk must be >= 1"), std::string::npos);

  a = good_args(4, 32);
  a.block_heads = 8;
  EXPECT_NE(error_of(a).find("block_heads must be 0 (planned), 16 or 32, got 8"), std::string::npos);

  a = good_args(4, 16);
  a.block_heads = 32;
  EXPECT_NE(error_of(a).find("block_heads 32 needs num_heads > 16"), std::string::npos);
}

TEST(SparseMlaFwdChecks, ZeroTokensPlansAnEmptyLaunch) {
  auto a = good_args(/*T=*/0);
  const auto launch = plan_sparse_mla_fwd(a, true, 132);
  EXPECT_TRUE(launch.empty);
  EXPECT_EQ(launch.params.num_splits, 1);
}

TEST(SparseMlaFwdChecks, OutputsMayNotOverlap) {
  auto a = good_args();
  a.out.strides[1] = 0;
  EXPECT_NE(error_of(a).find("out must not overlap itself"), std::string::npos);
  a = good_args();
  a.out.data = a.q.data;
  EXPECT_NE(error_of(a).find("out must not overlap q"), std::string::npos);
  // A split launch writes its partial results into the workspace while blocks read the inputs.
  a = good_args();
  a.workspace.data = a.kv_cache.data;
  EXPECT_NE(error_of(a).find("workspace must not overlap kv_cache"), std::string::npos);
}

TEST(SparseMlaFwdChecks, CpuPathAcceptsCpuTensorsOnly) {
  auto a = good_args();
  for (TensorDesc* t : {&a.q, &a.kv_cache, &a.indices, &a.out, &a.lse}) {
    t->is_cuda = false;
    t->device_index = -1;
  }
  a.workspace = TensorDesc{};
  EXPECT_EQ(error_of(a, /*require_cuda=*/false), "");
  EXPECT_NE(error_of(a, /*require_cuda=*/true).find("q must be a CUDA tensor"), std::string::npos);
}

// The cache writer reads kv_c, k_pe, slot_mapping and k_scale while it writes the cache: none
// may lie inside it (a slot_mapping there was overwritten mid-launch, found on the emulation).
TEST(ConcatAndCacheChecks, TheCacheMayNotOverlapAnInput) {
  ConcatAndCacheArgs a;
  a.kv_c = tensor(ScalarType::kBFloat16, {4, 512}, 2);
  a.k_pe = tensor(ScalarType::kBFloat16, {4, 64}, 2);
  a.kv_cache = tensor(ScalarType::kUInt8, {16, 64, 576}, 1);
  a.slot_mapping = tensor(ScalarType::kInt64, {4}, 8);
  a.k_scale = tensor(ScalarType::kFloat32, {1}, 4);
  a.kv_cache_dtype = "fp8_e4m3";
  EXPECT_NO_THROW(check_concat_and_cache(a, true));
  for (TensorDesc ConcatAndCacheArgs::*input :
       {&ConcatAndCacheArgs::kv_c, &ConcatAndCacheArgs::k_pe, &ConcatAndCacheArgs::slot_mapping,
        &ConcatAndCacheArgs::k_scale}) {
    ConcatAndCacheArgs b = a;
    (b.*input).data = static_cast<const uint8_t*>(a.kv_cache.data) + 4096;
    try {
      check_concat_and_cache(b, true);
      ADD_FAILURE() << "an input inside the cache was accepted";
    } catch (const ArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("kv_cache must not overlap"), std::string::npos) << e.what();
    }
  }
}

TEST(SplitPlan, SplitsOnlyWhenTheGridIsSmall) {
  const int64_t ws = workspace_size(132);
  // One decode token, 32 heads in 16-head blocks, topk 2048: 64 tiles -> split to fill the GPU.
  SplitPlan p = plan_splits(1, 32, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws);
  EXPECT_GT(p.num_splits, 1);
  EXPECT_GE(p.tiles_per_split, kMinTilesPerSplit);
  EXPECT_GE(p.num_splits * p.tiles_per_split, 64);
  EXPECT_LT((p.num_splits - 1) * p.tiles_per_split, 64);  // no empty trailing split
  // Enough blocks already: no split, no combine pass.
  EXPECT_EQ(plan_splits(4096, 64, kTwoGroups, KvFormat::kBFloat16, 2048, 132, ws).num_splits, 1);
  EXPECT_EQ(plan_splits(132, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws).num_splits, 1);
  // More (token, head) rows than SMs, split past one round of the one-block-per-row combine
  // (8 splits; test_kernel_gpu.py runs these two on the H200).
  p = plan_splits(9, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws);
  EXPECT_EQ(p.num_splits, 13);
  EXPECT_EQ(combine_split_groups(9, 16, p.num_splits, 132), 1);
  p = plan_splits(12, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws);
  EXPECT_EQ(p.num_splits, 11);
  EXPECT_EQ(combine_split_groups(12, 16, p.num_splits, 132), 1);
  // Short top-k: nothing to split.
  EXPECT_EQ(plan_splits(1, 16, kOneGroup, KvFormat::kBFloat16, 32, 132, ws).num_splits, 1);
  // No tokens: nothing to plan (and no division by zero).
  EXPECT_EQ(plan_splits(0, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws).num_splits, 1);
  // No workspace: no split.
  EXPECT_EQ(plan_splits(1, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, 0).num_splits, 1);
}

TEST(SplitPlan, SplitsFewRowsIntoOneTileBlocksThatOneCombineRoundCovers) {
  const int64_t ws = workspace_size(132);
  auto expect_plan = [&](int num_tokens, int num_heads, int topk, int splits, int tiles) {
    const SplitPlan p = plan_splits(num_tokens, num_heads, kOneGroup, KvFormat::kBFloat16, topk, 132, ws);
    EXPECT_EQ(p.num_splits, splits) << num_tokens << " x " << num_heads << ", topk " << topk;
    EXPECT_EQ(p.tiles_per_split, tiles) << num_tokens << " x " << num_heads << ", topk " << topk;
  };
  // Up to kOneTileSplitMaxRows (token, head) rows: one tile per block.
  expect_plan(1, 16, 2048, 64, 1);  // DeepSeek-V3.2 decode
  expect_plan(1, 8, 2176, 68, 1);   // GLM-5.3-Flash: the most splits one combine round covers
  expect_plan(2, 8, 2048, 64, 1);   // 128 blocks, still one per SM
  // 32 rows: two tiles (the partial results would double).
  expect_plan(1, 32, 2048, 32, 2);
  expect_plan(2, 16, 2048, 32, 2);
  // One tile more than a combine round covers: no one-tile blocks.
  EXPECT_GE(plan_splits(1, 16, kOneGroup, KvFormat::kBFloat16, 69 * 32, 132, ws).tiles_per_split, kMinTilesPerSplit);
  EXPECT_EQ(kCombineDecodeOneRound, 68);
  // The decode combine: 17 loads per thread only where that makes one round of 16 loads' two.
  for (const auto& [splits, loads] : {std::pair{2, 16}, std::pair{64, 16}, std::pair{65, 17}, std::pair{68, 17},
                                      std::pair{69, 16}, std::pair{128, 16}})
    EXPECT_EQ(combine_decode_loads(splits), loads) << splits;
}

TEST(SplitPlan, SplitsAnUnderfilledGridIntoOneWave) {
  const int64_t ws = workspace_size(132);
  // 64 blocks of 32 heads x 68 tiles on 132 SMs: two splits fill one wave with half the tiles.
  SplitPlan p = plan_splits(64, 32, kTwoGroups, KvFormat::kBFloat16, 2176, 132, ws);
  EXPECT_EQ(p.num_splits, 2);
  EXPECT_EQ(p.tiles_per_split, 34);
  // DeepSeek-V3.2 decode of 16 tokens x 128 heads: 64 blocks -> two splits as well.
  EXPECT_EQ(plan_splits(16, 128, kTwoGroups, KvFormat::kBFloat16, 2048, 132, ws).num_splits, 2);
  // One token: one or two tiles per block, at most kMaxSplitBlocksPerSm blocks per SM.
  p = plan_splits(1, 128, kTwoGroups, KvFormat::kBFloat16, 2048, 132, ws);
  EXPECT_LE(p.tiles_per_split, 2);
  EXPECT_LE(int64_t{p.num_splits} * 4, int64_t{kMaxSplitBlocksPerSm} * 132);
  // A partial second wave is worth splitting too (133 blocks: 2 x 64 tiles -> 3 x 32).
  EXPECT_EQ(plan_splits(133, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws).num_splits, 2);
}

TEST(SplitPlan, UsesASecondBlockPerSmWhereItFits) {
  const int64_t ws = workspace_size(132);
  // 64 blocks of 16 heads x 64 tiles: one block per SM -> 2 splits; two per SM -> 4 splits,
  // every SM running two blocks of 16 tiles.
  EXPECT_EQ(plan_splits(64, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, 1).num_splits, 2);
  const SplitPlan p = plan_splits(64, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, 2);
  EXPECT_EQ(p.num_splits, 4);
  EXPECT_EQ(p.tiles_per_split, 16);
  // Blocks of 4-7 tiles gain from sharing an SM only with a bf16 cache or at most one row per SM
  // (co_resident_tile_time): T = 16 x 16 heads (256 rows) keeps 8 splits of 8 tiles for the
  // other formats, and for bf16 at one block per SM; bf16 at two takes 16 of 4. At 8 heads (128
  // rows) every format takes 16 of 4.
  for (KvFormat f : {KvFormat::kFloat16, KvFormat::kFp8E4m3, KvFormat::kFp8DsMla}) {
    EXPECT_EQ(plan_splits(16, 16, kOneGroup, f, 2048, 132, ws, 2).num_splits, 8) << static_cast<int>(f);
    EXPECT_EQ(plan_splits(16, 8, kOneGroup, f, 2048, 132, ws, 2).num_splits, 16) << static_cast<int>(f);
  }
  expect_h200_plan(16, 16, KvFormat::kBFloat16, 2048, 1, 8, 8);
  expect_h200_plan(16, 16, KvFormat::kBFloat16, 2048, 2, 16, 4);
  // A grid that fills the GPU stays unsplit whatever the occupancy.
  EXPECT_EQ(plan_splits(1024, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, 2).num_splits, 1);
}

TEST(SplitPlan, CoResidentTileTime) {
  const KvFormat kBf16 = KvFormat::kBFloat16;
  for (KvFormat f : {kBf16, KvFormat::kFloat16, KvFormat::kFp8E4m3, KvFormat::kFp8DsMla}) {
    const double short_others = f == kBf16 ? kCoResidentShortTileTime : 1.0;
    // A lone block; blocks of at least kCoResidentMinTiles; a third block only for long ones.
    EXPECT_EQ(co_resident_tile_time(f, 64, 16, 132, 1, 64), 1.0);
    EXPECT_EQ(co_resident_tile_time(f, 64, 16, 132, 2, kCoResidentMinTiles), kCoResidentTileTime);
    EXPECT_EQ(co_resident_tile_time(f, 64, 16, 132, 3, kCoResidentThreeMinTiles), kCoResidentTileTimeThree);
    EXPECT_EQ(co_resident_tile_time(f, 64, 16, 132, 3, kCoResidentThreeMinTiles - 1), kCoResidentTileTime);
    // Blocks of 4-7 tiles: bf16 caches, or at most one (token, head) row per SM.
    EXPECT_EQ(co_resident_tile_time(f, 8, 16, 132, 2, kCoResidentShortMinTiles), kCoResidentShortTileTime);  // 128 rows
    EXPECT_EQ(co_resident_tile_time(f, 1, 128, 132, 2, 7), kCoResidentShortTileTime);
    EXPECT_EQ(co_resident_tile_time(f, 9, 16, 132, 2, 7), short_others);  // 144 rows
    EXPECT_EQ(co_resident_tile_time(f, 1, 16, 0, 2, 7), short_others);    // no SM count
    // Shorter blocks: no credit.
    EXPECT_EQ(co_resident_tile_time(f, 1, 16, 132, 2, kCoResidentShortMinTiles - 1), 1.0);
  }
  EXPECT_LT(kCoResidentTileTimeThree, kCoResidentTileTime);
  EXPECT_LT(kCoResidentTileTime, kCoResidentShortTileTime);
}

TEST(SplitPlan, AThirdBlockPerSmSharesItsTiles) {
  // 64 tokens x 32 heads in 16-head blocks (128 blocks), GLM's 68 tiles: two blocks per SM take
  // 2 splits of 34 tiles; three per SM (the H200's fp8_e4m3 kernel at D = 512), 3 of 23.
  expect_h200_plan(64, 32, KvFormat::kFp8E4m3, 2176, 2, 2, 34);
  expect_h200_plan(64, 32, KvFormat::kFp8E4m3, 2176, 3, 3, 23);
  // Only for blocks of kCoResidentThreeMinTiles or more: T = 20 keeps 6 splits of 12 tiles at
  // two blocks per SM (9 of 8 at three ran 0.96x).
  expect_h200_plan(20, 32, KvFormat::kFp8E4m3, 2176, 3, 6, 12);
}

TEST(SplitPlan, ShortBlocksCreditedLessThanLongOnes) {
  // bf16, T = 12 x 16 heads: 11 splits of 6 tiles, one block per SM, stay (at
  // kCoResidentTileTime, 16 of 4 would be planned: 0.97x measured, bench/HISTORY.md v21).
  expect_h200_plan(12, 16, KvFormat::kBFloat16, 2048, 2, 11, 6);
  // Blocks of 3 tiles get no credit: GLM H8 T = 8 keeps 14 splits of 5 tiles (one per SM).
  expect_h200_plan(8, 8, KvFormat::kBFloat16, 2176, 2, 14, 5);
}

TEST(SplitPlan, OutsideTheAdmittedDomainNothingSplits) {
  const int64_t ws = workspace_size(132);
  for (const auto& [T, H, topk] : {std::tuple{-1, -100, 2048}, std::tuple{1, 0, 2048}, std::tuple{1, 129, 2048},
                                   std::tuple{1, 16, 0}, std::tuple{1, 16, (1 << 30) + 1}, std::tuple{1, 16, 2147483647}}) {
    const SplitPlan p = plan_splits(T, H, head_groups_for(H), KvFormat::kBFloat16, topk, 132, ws, 2);
    EXPECT_EQ(p.num_splits, 1) << T << " " << H << " " << topk;
    EXPECT_GE(p.tiles_per_split, 1);
  }
  EXPECT_EQ(plan_splits(1, 16, kOneGroup, KvFormat::kBFloat16, 2147483647, 132, ws).tiles_per_split,
            67108864);  // covers every tile
  for (int groups : {0, 3})
    EXPECT_EQ(plan_splits(1, 64, groups, KvFormat::kBFloat16, 2048, 132, ws).num_splits, 1) << groups;
}

TEST(SplitPlan, CombineUsesFourThreadGroupsOnlyAtDecode) {
  // T x H rows that leave SMs idle: four groups over the splits; rows that fill the GPU, or no
  // split (no combine pass), one.
  EXPECT_EQ(combine_split_groups(1, 16, 32, 132), kCombineDecodeSplitGroups);
  EXPECT_EQ(combine_split_groups(1, 128, 32, 132), kCombineDecodeSplitGroups);
  EXPECT_EQ(combine_split_groups(8, 16, 16, 128), kCombineDecodeSplitGroups);  // 128 rows on 128 SMs
  EXPECT_EQ(combine_split_groups(64, 16, 4, 132), 1);
  EXPECT_EQ(combine_split_groups(4, 64, 16, 132), 1);
  EXPECT_EQ(combine_split_groups(1, 16, 1, 132), 1);
  // The launch plan carries it: 4 decode tokens x 16 heads split, 64 x 16 too but fill the GPU.
  const SparseMlaFwdParams decode = plan_sparse_mla_fwd(good_args(4), true, 132).params;
  EXPECT_GT(decode.num_splits, 1);
  EXPECT_EQ(decode.combine_split_groups, kCombineDecodeSplitGroups);
  const SparseMlaFwdParams wide = plan_sparse_mla_fwd(good_args(64), true, 132).params;
  EXPECT_GT(wide.num_splits, 1);
  EXPECT_EQ(wide.combine_split_groups, 1);
}

TEST(SplitPlan, OneStageKernelWhereTwoBlocksShareAnSmForLong) {
  // 132 SMs; 16 heads are one block per token, 64 heads two.
  EXPECT_TRUE(one_stage_plan(1024, 16, kOneGroup, {1, 64}, 132));   // unsplit, two blocks for every SM
  EXPECT_TRUE(one_stage_plan(264, 8, kOneGroup, {1, 3}, 132));      // ... however short
  EXPECT_TRUE(one_stage_plan(132, 64, kTwoGroups, {1, 64}, 132));    // 264 blocks of 32 heads
  EXPECT_TRUE(one_stage_plan(64, 16, kOneGroup, {4, 16}, 132));     // 256 blocks of 16 tiles
  EXPECT_TRUE(one_stage_plan(200, 16, kOneGroup, {1, 68}, 132));    // 68 SMs get a second long block
  EXPECT_FALSE(one_stage_plan(200, 16, kOneGroup, {1, 8}, 132));    // ... a short one
  EXPECT_FALSE(one_stage_plan(16, 16, kOneGroup, {16, 4}, 132));    // 256 blocks of 4 tiles
  EXPECT_FALSE(one_stage_plan(16, 16, kOneGroup, {8, 8}, 132));     // 128 blocks: one per SM
  EXPECT_FALSE(one_stage_plan(132, 16, kOneGroup, {1, 64}, 132));   // one per SM, however long
  EXPECT_FALSE(one_stage_plan(1024, 16, kOneGroup, {1, 64}, 0));    // SM count unknown
}

TEST(SplitPlan, OneStagePlanOnlyWhereItDoublesTheBlocksPerSm) {
  EXPECT_TRUE(variant_raises_occupancy(1, 2));   // sm_120: one two-stage block, two one-stage
  EXPECT_TRUE(variant_raises_occupancy(1, 3));   // sm_80
  EXPECT_FALSE(variant_raises_occupancy(2, 4));  // the H200: two two-stage blocks fit
  EXPECT_FALSE(variant_raises_occupancy(1, 1));  // no second one-stage block
  EXPECT_FALSE(variant_raises_occupancy(1, 0));  // no variant
  const int64_t ws = workspace_size(132);
  // sm_120's occupancy (one two-stage block per SM, two one-stage): T = 64 plans four splits of
  // 16 tiles for two blocks per SM, T = 1024 stays unsplit; both run the one-stage kernel.
  SplitPlan p = plan_fwd_splits(64, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, 1, 2);
  EXPECT_TRUE(p.variant == FwdVariant::kOneStage);
  EXPECT_EQ(p.num_splits, 4);
  EXPECT_EQ(p.tiles_per_split, 16);
  p = plan_fwd_splits(1024, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, 1, 2);
  EXPECT_TRUE(p.variant == FwdVariant::kOneStage);
  EXPECT_EQ(p.num_splits, 1);
  // Blocks of few tiles (T = 1, 4, 16) keep the two-stage kernel and its plan.
  for (int T : {1, 4, 16}) {
    p = plan_fwd_splits(T, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, 1, 2);
    EXPECT_FALSE(p.variant == FwdVariant::kOneStage) << T;
    EXPECT_EQ(p.num_splits, plan_splits(T, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, 1).num_splits) << T;
  }
  // The H200 (two two-stage blocks per SM), no second one-stage block, no variant (0).
  for (const auto& [two, one] : {std::pair{2, 4}, std::pair{1, 1}, std::pair{1, 0}}) {
    p = plan_fwd_splits(64, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, two, one);
    EXPECT_FALSE(p.variant == FwdVariant::kOneStage) << two << " " << one;
    EXPECT_EQ(p.num_splits, plan_splits(64, 16, kOneGroup, KvFormat::kBFloat16, 2048, 132, ws, two).num_splits)
        << two << " " << one;
  }
}

// sm_120's occupancies as launch.h fwd_blocks_per_sm reports them: 16-head 16-bit kernels one
// two-stage block per SM and two one-stage ones; 16-head fp8 kernels two of raw tiles and two
// decode-once ones, but fp8_ds_mla at D = 576 one of raw tiles and two of its paired-scores
// variant; the other configurations one block, and one of the decode-once variant.
int sm120_like_blocks_per_sm(DType, KvFormat format, int head_size, int head_groups, FwdVariant variant) {
  const bool sixteen = head_groups == 1;
  const bool bits16 = format == KvFormat::kBFloat16 || format == KvFormat::kFloat16;
  switch (variant) {
    case FwdVariant::kOneStage: return sixteen && bits16 ? 2 : 0;
    case FwdVariant::kDecodedFp8:
      return bits16 ? 0 : sixteen ? 2 : 1;
    case FwdVariant::kPairedScores: return sixteen && format == KvFormat::kFp8DsMla && head_size == 576 ? 2 : 0;
    default: return sixteen && !bits16 && !(format == KvFormat::kFp8DsMla && head_size == 576) ? 2 : 1;
  }
}

TEST(SplitPlan, LaunchPlanCarriesTheKernelVariant) {
  EXPECT_TRUE(plan_sparse_mla_fwd(good_args(1024), true, 132, &sm120_like_blocks_per_sm).params.variant == FwdVariant::kOneStage);
  const SparseMlaFwdParams t64 = plan_sparse_mla_fwd(good_args(64), true, 132, &sm120_like_blocks_per_sm).params;
  EXPECT_TRUE(t64.variant == FwdVariant::kOneStage);
  EXPECT_EQ(t64.num_splits, 4);
  EXPECT_FALSE(plan_sparse_mla_fwd(good_args(4), true, 132, &sm120_like_blocks_per_sm).params.variant == FwdVariant::kOneStage);
  // 32 heads: no variant.
  EXPECT_FALSE(plan_sparse_mla_fwd(good_args(1024, 32), true, 132, &sm120_like_blocks_per_sm).params.variant == FwdVariant::kOneStage);
  // Without a workspace nothing splits, but a grid of two blocks per SM still takes the variant.
  SparseMlaFwdArgs no_workspace = good_args(1024);
  no_workspace.workspace = TensorDesc{};
  const SparseMlaFwdParams unsplit = plan_sparse_mla_fwd(no_workspace, true, 132, &sm120_like_blocks_per_sm).params;
  EXPECT_EQ(unsplit.num_splits, 1);
  EXPECT_TRUE(unsplit.variant == FwdVariant::kOneStage);
  // Without the occupancy query: one block per SM, no variant.
  EXPECT_FALSE(plan_sparse_mla_fwd(good_args(1024), true, 132).params.variant == FwdVariant::kOneStage);
}

TEST(SplitPlan, DecodedFp8KernelWhereItDoublesTheBlocksPerSm) {
  const int64_t ws = workspace_size(170);
  // One block of raw tiles per SM, two decode-once ones, no paired-scores variant: the
  // decode-once kernel at its occupancy, whatever the grid.
  for (int T : {1, 16, 32, 64, 1024}) {  // T = 32: 5 x 13 tiles at one block per SM, 8 x 8 at two
    const SplitPlan p = plan_fwd_splits(T, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 170, ws, 1, 0, 2);
    const SplitPlan want = plan_splits(T, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 170, ws, 2);
    EXPECT_EQ(p.variant, FwdVariant::kDecodedFp8) << T;
    EXPECT_EQ(p.num_splits, want.num_splits) << T;
    EXPECT_EQ(p.tiles_per_split, want.tiles_per_split) << T;
  }
  EXPECT_NE(plan_splits(32, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 170, ws, 1).num_splits,
            plan_splits(32, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 170, ws, 2).num_splits);
  // The H200 (two of raw tiles), no second decode-once block, no variant: the main kernel's plan.
  for (const auto& [raw, decoded] : {std::pair{2, 2}, std::pair{1, 1}, std::pair{1, 0}}) {
    const SplitPlan p = plan_fwd_splits(64, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 170, ws, raw, 0, decoded);
    EXPECT_FALSE(p.variant == FwdVariant::kDecodedFp8) << raw << " " << decoded;
    EXPECT_EQ(p.num_splits, plan_splits(64, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 170, ws, raw).num_splits)
        << raw << " " << decoded;
  }
  // Through the launch plan, with sm_120's occupancies (an RTX 5090's 170 SMs, sm_120).
  auto decoded = [](const char* kv_cache_dtype, int64_t D, int64_t T, int64_t H) {
    SparseMlaFwdArgs a = good_args(T, H, D);
    const bool ds_mla = std::string(kv_cache_dtype) == "fp8_ds_mla";
    a.kv_cache = tensor(ScalarType::kUInt8, {256, 64, ds_mla ? 656 : D}, 1);
    a.kv_cache_dtype = kv_cache_dtype;
    return plan_sparse_mla_fwd(a, true, 170, &sm120_like_blocks_per_sm, 120).params.variant == FwdVariant::kDecodedFp8;
  };
  EXPECT_FALSE(decoded("fp8_ds_mla", 576, 1024, 16));  // two of the paired-scores variant (below)
  EXPECT_FALSE(decoded("fp8_ds_mla", 512, 1024, 16));  // two of raw tiles fit
  EXPECT_TRUE(decoded("fp8_ds_mla", 576, 16, 16));     // one wave (decoded_fp8_plan)
  EXPECT_FALSE(decoded("fp8_ds_mla", 576, 1024, 32));  // one block per SM either way
  EXPECT_FALSE(decoded("fp8_e4m3", 576, 1024, 16));
  EXPECT_TRUE(decoded("fp8_e4m3", 576, 16, 16));       // one wave (decoded_fp8_plan)
}

TEST(SplitPlan, PairedScoresVariantWhereItDoublesTheBlocksPerSm) {
  const int64_t ws = workspace_size(170);
  // One block of raw tiles per SM, two of the paired-scores variant and two decode-once ones
  // (sm_120, 16-head fp8_ds_mla at D = 576): the paired one at its occupancy.
  for (int T : {1, 16, 32, 64, 1024}) {  // T = 32: 5 x 13 tiles at one block per SM, 8 x 8 at two
    const SplitPlan p = plan_fwd_splits(T, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 170, ws, 1, 0, 2, 2);
    const SplitPlan want = plan_splits(T, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 170, ws, 2);
    EXPECT_EQ(p.variant, FwdVariant::kPairedScores) << T;
    EXPECT_EQ(p.num_splits, want.num_splits) << T;
    EXPECT_EQ(p.tiles_per_split, want.tiles_per_split) << T;
  }
  // Where the main kernel holds two blocks (the H200), it runs.
  EXPECT_FALSE(plan_fwd_splits(64, 16, kOneGroup, KvFormat::kFp8DsMla, 2048, 132, ws, 2, 0, 2, 2).variant == FwdVariant::kPairedScores);
  // Through the launch plan (an RTX 5090's 170 SMs, sm_120): paired at T = 1024; the decode-once
  // kernel in a grid of one wave (decoded_fp8_plan), and before sm_89.
  auto plan = [](int64_t T, int sm_version) {
    SparseMlaFwdArgs a = good_args(T, 16, 576);
    a.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 656}, 1);
    a.kv_cache_dtype = "fp8_ds_mla";
    return plan_sparse_mla_fwd(a, true, 170, &sm120_like_blocks_per_sm, sm_version).params;
  };
  EXPECT_EQ(plan(1024, 120).variant, FwdVariant::kPairedScores);
  EXPECT_EQ(plan(16, 120).variant, FwdVariant::kDecodedFp8);
  EXPECT_EQ(plan(1024, 86).variant, FwdVariant::kDecodedFp8);
}

// An SM of an sm_86-like GPU holding two 16-head fp8 blocks of raw tiles but one decode-once block.
int raw_twice_decoded_once(DType, KvFormat, int, int, FwdVariant variant) {
  return variant == FwdVariant::kMain ? 2 : variant == FwdVariant::kDecodedFp8 ? 1 : 0;
}

TEST(SplitPlan, BeforeSm89TheDecodeOnceKernelIsPlannedAtItsOwnOccupancy) {
  SparseMlaFwdArgs a = good_args(32, 16);
  a.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
  a.kv_cache_dtype = "fp8_e4m3";
  const int64_t ws = workspace_size(132);  // good_args' workspace
  for (const auto& [sm_version, blocks] : {std::pair{86, 1}, std::pair{120, 2}}) {
    const SparseMlaFwdParams p = plan_sparse_mla_fwd(a, true, 170, &raw_twice_decoded_once, sm_version).params;
    const SplitPlan want = plan_splits(32, 16, kOneGroup, KvFormat::kFp8E4m3, 2048, 170, ws, blocks);
    EXPECT_EQ(p.variant == FwdVariant::kDecodedFp8, sm_version == 86);
    EXPECT_EQ(p.num_splits, want.num_splits) << sm_version;
    EXPECT_EQ(p.tiles_per_split, want.tiles_per_split) << sm_version;
  }
  EXPECT_NE(plan_splits(32, 16, kOneGroup, KvFormat::kFp8E4m3, 2048, 170, ws, 1).num_splits,
            plan_splits(32, 16, kOneGroup, KvFormat::kFp8E4m3, 2048, 170, ws, 2).num_splits);
}

TEST(SplitPlan, DecodedFp8KernelForGridsOfOneWave) {
  // 132 SMs; 16 heads are one block per token, 64 heads two.
  EXPECT_TRUE(decoded_fp8_plan(1, 16, kOneGroup, {34, 2}, 132));     // T = 1: 34 blocks
  EXPECT_TRUE(decoded_fp8_plan(16, 16, kOneGroup, {8, 9}, 132));     // 128 blocks
  EXPECT_TRUE(decoded_fp8_plan(64, 64, kTwoGroups, {1, 64}, 132));    // 128 blocks of 32 heads
  EXPECT_TRUE(decoded_fp8_plan(132, 16, kOneGroup, {1, 68}, 132));   // one per SM, however long
  EXPECT_FALSE(decoded_fp8_plan(133, 16, kOneGroup, {1, 68}, 132));  // a second wave
  EXPECT_FALSE(decoded_fp8_plan(64, 16, kOneGroup, {4, 17}, 132));   // 256 blocks: two per SM
  EXPECT_FALSE(decoded_fp8_plan(1, 16, kOneGroup, {34, 2}, 0));      // SM count unknown
  // Before sm_89 the e4m3 conversion is a software sequence: always decode once.
  EXPECT_TRUE(decoded_fp8_plan(64, 16, kOneGroup, {4, 17}, 132, 86));
  EXPECT_TRUE(decoded_fp8_plan(64, 16, kOneGroup, {4, 17}, 0, 80));
  for (int sm : {89, 90, 120, 121, 0}) EXPECT_FALSE(decoded_fp8_plan(64, 16, kOneGroup, {4, 17}, 132, sm)) << sm;
  // The launch plan sets it for fp8 caches only.
  auto e4m3 = [](int64_t T, int64_t H) {
    SparseMlaFwdArgs a = good_args(T, H);
    a.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
    a.kv_cache_dtype = "fp8_e4m3";
    return plan_sparse_mla_fwd(a, true, 132).params.variant == FwdVariant::kDecodedFp8;
  };
  EXPECT_TRUE(e4m3(1, 16));
  EXPECT_TRUE(e4m3(16, 128));  // 4 head blocks x 16 tokens, 2 splits
  EXPECT_FALSE(e4m3(1024, 16));
  {
    SparseMlaFwdArgs a = good_args(1024, 16);
    a.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
    a.kv_cache_dtype = "fp8_e4m3";
    EXPECT_TRUE(plan_sparse_mla_fwd(a, true, 84, nullptr, 86).params.variant == FwdVariant::kDecodedFp8);  // an RTX 3090
    EXPECT_FALSE(plan_sparse_mla_fwd(a, true, 170, nullptr, 120).params.variant == FwdVariant::kDecodedFp8);  // an RTX 5090
  }
  EXPECT_FALSE(plan_sparse_mla_fwd(good_args(1), true, 132).params.variant == FwdVariant::kDecodedFp8);  // bf16
  SparseMlaFwdArgs ds_mla = good_args(1, 16);
  ds_mla.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 656}, 1);
  ds_mla.kv_cache_dtype = "fp8_ds_mla";
  EXPECT_TRUE(plan_sparse_mla_fwd(ds_mla, true, 132).params.variant == FwdVariant::kDecodedFp8);
}

TEST(SplitPlan, ForcedThirtyTwoHeadFp8BlocksStayRawBeyondOneWave) {
  // tests/test_kernel_gpu.py's lazy-rescale cases: 32 heads in forced 32-head blocks, topk 2048.
  // At T = 64 the H200's grid is one wave and decodes each tile once (the main kernel); at
  // T = 256 it is more than one wave on every target GPU (132 to 188 SMs), so the tiles stay raw
  // and the launch runs the WideWarps kernel, where the lazy rescale is.
  for (const std::string kv : {"fp8_e4m3", "fp8_ds_mla"}) {
    auto plan = [&](int64_t T, int sms, int sm_version) {
      SparseMlaFwdArgs a = good_args(T, 32);
      a.kv_cache = tensor(ScalarType::kUInt8, {256, 64, kv == "fp8_e4m3" ? 576 : 656}, 1);
      a.kv_cache_dtype = kv;
      a.block_heads = 32;
      return plan_sparse_mla_fwd(a, true, sms, nullptr, sm_version).params;
    };
    EXPECT_TRUE(plan(64, 132, 90).variant == FwdVariant::kDecodedFp8) << kv;
    const std::pair<int, int> gpus[] = {{132, 90}, {170, 120}, {188, 120}};  // SMs, sm_version
    for (const auto& [sms, sm_version] : gpus) {
      const SparseMlaFwdParams p = plan(256, sms, sm_version);
      EXPECT_FALSE(p.variant == FwdVariant::kDecodedFp8) << kv << " " << sms;
      EXPECT_EQ(p.head_groups, 2) << kv << " " << sms;
    }
  }
}

TEST(HeadGroups, Fp8SixteenHeadBlocksWhereAnSmHoldsTwo) {
  const int64_t ws = workspace_size(132);
  for (KvFormat f : {KvFormat::kFp8E4m3, KvFormat::kFp8DsMla})
    for (int H : {17, 32, 64, 128})
      for (int T : {1, 4, 64, 1024, 4096}) {
        // 32-head blocks (the WideWarps kernel) where their unsplit grid has more blocks than
        // SMs, but not before sm_89 (sm_version 86), whose e4m3 conversion is software.
        const int wide = T * ((H + 31) / 32) > 132 ? 2 : 1;
        EXPECT_EQ(plan_head_groups(T, H, f, 2048, 132, ws, 2, 1), wide) << H << " " << T;
        EXPECT_EQ(plan_head_groups(T, H, f, 2048, 132, ws, 2, 1, 120), wide) << H << " " << T;
        EXPECT_EQ(plan_head_groups(T, H, f, 2048, 132, ws, 2, 1, 86), 1) << H << " " << T;
      }
  // The edge: 64 heads, 66 tokens are 132 blocks of 32 heads (one wave), 67 tokens 134.
  for (KvFormat f : {KvFormat::kFp8E4m3, KvFormat::kFp8DsMla}) {
    EXPECT_EQ(plan_head_groups(66, 64, f, 2048, 132, ws, 2, 1), 1);
    EXPECT_EQ(plan_head_groups(67, 64, f, 2048, 132, ws, 2, 1), 2);
  }
  // Up to 16 heads one group, whatever the occupancies.
  for (int H : {1, 8, 16}) EXPECT_EQ(plan_head_groups(1024, H, KvFormat::kBFloat16, 2048, 132, ws, 1, 1), 1) << H;
  // 16-bit caches: 16-head blocks at decode only (T = 1: 34 splits of 2 tiles; T = 64: 2 of 34).
  for (KvFormat f : {KvFormat::kBFloat16, KvFormat::kFloat16})
    for (const auto& [T, groups] : {std::pair{1, 1}, std::pair{64, 2}, std::pair{1024, 2}})
      EXPECT_EQ(plan_head_groups(T, 32, f, 2048, 132, ws, 2, 1), groups) << T;
}

TEST(HeadGroups, WithOneSixteenHeadBlockPerSmOnlyDecodeSplitsTakeThem) {
  const int64_t ws = workspace_size(132);
  // The 32-head plans (132 SMs, one block each): T = 1 34 splits of 2 tiles (32 heads) and 32 of 2
  // (128 heads); T = 2, 128 heads: 16 of 4; T = 4, 128 heads: 8 of 8 (not fewer than
  // kCoResidentMinTiles); T = 64, 32 heads: 2 of 34; T = 1024 unsplit.
  EXPECT_EQ(plan_splits(4, 128, kTwoGroups, KvFormat::kBFloat16, 2048, 132, ws).tiles_per_split, kCoResidentMinTiles);
  for (const auto& [T, H, groups] : {std::tuple{1, 32, 1}, std::tuple{1, 128, 1}, std::tuple{2, 128, 1},
                                     std::tuple{4, 128, 2}, std::tuple{64, 32, 2}, std::tuple{1024, 64, 2}})
    EXPECT_EQ(plan_head_groups(T, H, KvFormat::kBFloat16, 2048, 132, ws, 1, 1), groups) << T << " " << H;
  // Without a workspace nothing splits: 32-head blocks; nor does an unsplit plan of short blocks.
  EXPECT_EQ(plan_head_groups(1, 64, KvFormat::kBFloat16, 2048, 132, 0, 1, 1), kTwoGroups);
  EXPECT_EQ(plan_head_groups(1024, 32, KvFormat::kBFloat16, 64, 132, ws, 1, 1), kTwoGroups);
}

// The H200's occupancies: two 16-head blocks of every configuration per SM, one 32-head block.
int h200_like_blocks_per_sm(DType, KvFormat, int, int head_groups, FwdVariant variant) {
  return variant != FwdVariant::kMain ? 0 : head_groups == 1 ? 2 : 1;
}

TEST(SplitPlan, LaunchPlanUsesTheCacheFormat) {
  // T = 16 x 16 heads with the H200's occupancies: bf16 takes 16 splits of 4 tiles (two blocks
  // per SM), fp8_e4m3 keeps 8 of 8 (one per SM; rows > SMs).
  EXPECT_EQ(plan_sparse_mla_fwd(good_args(16, 16), true, 132, &h200_like_blocks_per_sm).params.num_splits, 16);
  SparseMlaFwdArgs fp8 = good_args(16, 16);
  fp8.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
  fp8.kv_cache_dtype = "fp8_e4m3";
  EXPECT_EQ(plan_sparse_mla_fwd(fp8, true, 132, &h200_like_blocks_per_sm).params.num_splits, 8);
}

TEST(HeadGroups, LaunchPlanCarriesTheHeadGroups) {
  const int64_t ws = workspace_size(132);  // good_args' workspace
  for (int64_t T : {1, 64, 1024}) {
    for (const KvFormat format : {KvFormat::kFp8DsMla, KvFormat::kFp8E4m3}) {
      const bool e4m3 = format == KvFormat::kFp8E4m3;
      SparseMlaFwdArgs fp8 = good_args(T, 64);
      fp8.kv_cache = tensor(ScalarType::kUInt8, {256, 64, e4m3 ? 576 : kDsMlaRecordBytes}, 1);
      fp8.kv_cache_dtype = e4m3 ? "fp8_e4m3" : "fp8_ds_mla";
      const SparseMlaFwdParams p = plan_sparse_mla_fwd(fp8, true, 132, &h200_like_blocks_per_sm).params;
      // 32-head blocks where they are more than one wave: T = 1024 (2,048 blocks).
      const int groups = T == 1024 ? kTwoGroups : kOneGroup;
      const SplitPlan want = plan_splits(static_cast<int>(T), 64, groups, format, 2048, 132, ws, groups == 1 ? 2 : 1);
      EXPECT_EQ(p.head_groups, groups) << T << " " << fp8.kv_cache_dtype;
      EXPECT_EQ(p.num_splits, want.num_splits) << T << " " << fp8.kv_cache_dtype;
      EXPECT_EQ(p.tiles_per_split, want.tiles_per_split) << T << " " << fp8.kv_cache_dtype;
    }
  }
  // sm_120's: one 16-head 16-bit block per SM, two fp8_e4m3 ones, whose 32-head blocks still run
  // where they are more than one wave (T = 1024 x 32 heads), and not before sm_89.
  EXPECT_EQ(plan_sparse_mla_fwd(good_args(1024, 32), true, 132, &sm120_like_blocks_per_sm).params.head_groups,
            kTwoGroups);
  EXPECT_EQ(plan_sparse_mla_fwd(good_args(1, 32), true, 132, &sm120_like_blocks_per_sm).params.head_groups, kOneGroup);
  SparseMlaFwdArgs fp8 = good_args(1024, 32);
  fp8.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
  fp8.kv_cache_dtype = "fp8_e4m3";
  EXPECT_EQ(plan_sparse_mla_fwd(fp8, true, 132, &sm120_like_blocks_per_sm, 120).params.head_groups, kTwoGroups);
  EXPECT_EQ(plan_sparse_mla_fwd(fp8, true, 132, &sm120_like_blocks_per_sm, 86).params.head_groups, kOneGroup);
  fp8 = good_args(64, 32);
  fp8.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
  fp8.kv_cache_dtype = "fp8_e4m3";
  EXPECT_EQ(plan_sparse_mla_fwd(fp8, true, 132, &sm120_like_blocks_per_sm, 120).params.head_groups, kOneGroup);
  EXPECT_EQ(plan_sparse_mla_fwd(good_args(1024, 64), true, 132, &h200_like_blocks_per_sm).params.head_groups,
            kTwoGroups);
  SparseMlaFwdArgs fp16 = good_args(1024, 64);
  fp16.kv_cache = tensor(ScalarType::kFloat16, {256, 64, 576}, 2);
  EXPECT_EQ(plan_sparse_mla_fwd(fp16, true, 132, &h200_like_blocks_per_sm).params.head_groups, kTwoGroups);
  // block_heads forces either: 32 where fp8 plans 16 (the H200's), 16 where bf16 plans 32 (sm_120's).
  SparseMlaFwdArgs forced = good_args(1024, 64);
  forced.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
  forced.kv_cache_dtype = "fp8_e4m3";
  forced.block_heads = 32;
  const SparseMlaFwdParams p32 = plan_sparse_mla_fwd(forced, true, 132, &h200_like_blocks_per_sm).params;
  EXPECT_EQ(p32.head_groups, kTwoGroups);
  EXPECT_EQ(p32.num_splits, plan_splits(1024, 64, kTwoGroups, KvFormat::kFp8E4m3, 2048, 132, ws, 1).num_splits);
  forced = good_args(1024, 64);
  forced.block_heads = 16;
  EXPECT_EQ(plan_sparse_mla_fwd(forced, true, 132, &sm120_like_blocks_per_sm).params.head_groups, kOneGroup);
  // Up to 16 heads: one group.
  EXPECT_EQ(plan_sparse_mla_fwd(good_args(1024, 16), true, 132, &sm120_like_blocks_per_sm).params.head_groups,
            kOneGroup);
}

TEST(HeadGroups, SplitsAndVariantsFollowThePlannedBlocks) {
  // 64 heads, T = 16, the H200's occupancies: fp8's four 16-head blocks per token split 4 x 16
  // tiles at two blocks per SM (256 blocks); bf16's two 32-head blocks at one per SM too (128).
  SparseMlaFwdArgs fp8_t16 = good_args(16, 64);
  fp8_t16.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
  fp8_t16.kv_cache_dtype = "fp8_e4m3";
  const SparseMlaFwdParams t16 = plan_sparse_mla_fwd(fp8_t16, true, 132, &h200_like_blocks_per_sm).params;
  EXPECT_EQ(t16.head_groups, kOneGroup);
  EXPECT_EQ(t16.num_splits, 4);
  EXPECT_EQ(t16.tiles_per_split, 16);
  const SparseMlaFwdParams bf16_t16 = plan_sparse_mla_fwd(good_args(16, 64), true, 132, &h200_like_blocks_per_sm).params;
  EXPECT_EQ(bf16_t16.head_groups, kTwoGroups);
  EXPECT_EQ(bf16_t16.num_splits, 4);
  EXPECT_EQ(bf16_t16.tiles_per_split, 16);
  // The one-wave rule counts 16-head blocks: 40 tokens x 4 of two tiles (160) are more than 132
  // SMs, so fp8 keeps raw tiles (40 x 2 blocks of 32 heads would be one wave).
  SparseMlaFwdArgs fp8 = good_args(40, 64, 576, 64);
  fp8.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 576}, 1);
  fp8.kv_cache_dtype = "fp8_e4m3";
  const SparseMlaFwdParams wave = plan_sparse_mla_fwd(fp8, true, 132, &h200_like_blocks_per_sm).params;
  EXPECT_EQ(wave.head_groups, kOneGroup);
  EXPECT_EQ(wave.num_splits, 1);
  EXPECT_FALSE(wave.variant == FwdVariant::kDecodedFp8);
  // Forced 16-head blocks take the variants of the 16-head configuration (sm_120's occupancies).
  SparseMlaFwdArgs bf16 = good_args(1024, 32);
  bf16.block_heads = 16;
  EXPECT_TRUE(plan_sparse_mla_fwd(bf16, true, 132, &sm120_like_blocks_per_sm).params.variant == FwdVariant::kOneStage);
  SparseMlaFwdArgs ds_mla = good_args(1024, 32);
  ds_mla.kv_cache = tensor(ScalarType::kUInt8, {256, 64, 656}, 1);
  ds_mla.kv_cache_dtype = "fp8_ds_mla";
  ds_mla.block_heads = 16;
  EXPECT_TRUE(plan_sparse_mla_fwd(ds_mla, true, 132, &sm120_like_blocks_per_sm).params.variant == FwdVariant::kPairedScores);
}

TEST(HeadGroups, BlockHeadsTakesSixteenOrThirtyTwo) {
  SparseMlaFwdArgs a = good_args(4, 16);
  a.block_heads = 16;
  EXPECT_EQ(error_of(a), "");
  for (int64_t v : {int64_t{-16}, int64_t{1}, int64_t{48}, int64_t{1} << 36}) {
    a = good_args(4, 64);
    a.block_heads = v;
    EXPECT_NE(error_of(a).find("block_heads must be 0 (planned), 16 or 32"), std::string::npos) << v;
  }
}

TEST(SplitPlan, WorkspaceCoversEveryPlan) {
  for (int sms : {20, 48, 84, 132, 188}) {
    const int64_t ws = workspace_size(sms);
    for (int T : {1, 2, 3, 7, 16, 64, 100}) {
      for (int H : {1, 8, 16, 32, 64, 128}) {
        for (int topk : {1, 100, 2048, 2176, 100000}) {
          // (two-stage, one-stage) blocks per SM: one-stage plans at 2 and 3 (sm_120, sm_80).
          for (const auto& [two, one] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{4, 0}, std::pair{1, 2},
                                         std::pair{1, 3}}) {
            for (int groups = kOneGroup; groups <= head_groups_for(H); ++groups) {
              for (KvFormat f : {KvFormat::kBFloat16, KvFormat::kFloat16, KvFormat::kFp8E4m3, KvFormat::kFp8DsMla}) {
                const SplitPlan p = plan_fwd_splits(T, H, groups, f, topk, sms, int64_t{1} << 40, two, one);
                const int64_t need = int64_t{p.num_splits} * T * H * (512 + 1) * 4;
                EXPECT_LE(p.num_splits == 1 ? 0 : need, ws) << "sms " << sms << " T " << T << " H " << H << " groups "
                                                             << groups << " topk " << topk << " format " << int(f);
                EXPECT_LE(p.num_splits, kMaxSplits);
              }
            }
          }
        }
      }
    }
  }
}

TEST(KvCacheDtype, ParsesVllmNames) {
  TensorDesc kv = tensor(ScalarType::kFloat16, {1, 576}, 2);
  EXPECT_EQ(parse_kv_cache_dtype("auto", kv), KvFormat::kFloat16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8", kv), KvFormat::kFp8E4m3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3", kv), KvFormat::kFp8E4m3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_ds_mla", kv), KvFormat::kFp8DsMla);
  EXPECT_THROW(parse_kv_cache_dtype("fp8_e5m2", kv), ArgumentError);
  EXPECT_EQ(kv_row_bytes(KvFormat::kFp8DsMla, 512), 656);
  EXPECT_EQ(kv_row_bytes(KvFormat::kBFloat16, 576), 1152);
}
