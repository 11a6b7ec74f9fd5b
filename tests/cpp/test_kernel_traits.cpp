// GoogleTest of the tile configuration (csrc/sparse_mla/kernel_traits.h): the stages of each
// cache format, fp8 raw tiles, and what they leave of sm_120's occupancy.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "kernel_traits.h"

using namespace sparse_mla;

namespace {

template <typename QElement, KvFormat kFormat, int kHeadDim>
void expect_stages(int stages_16_heads, int stages_32_heads) {
  using Group1 = SparseMlaFwdTraits<QElement, kFormat, kHeadDim, 1>;
  using Group2 = SparseMlaFwdTraits<QElement, kFormat, kHeadDim, 2>;
  EXPECT_EQ(Group1::kStages, stages_16_heads) << "16 heads, D " << kHeadDim << ", format " << static_cast<int>(kFormat);
  EXPECT_EQ(Group2::kStages, stages_32_heads) << "32 heads, D " << kHeadDim << ", format " << static_cast<int>(kFormat);
  if constexpr (kFormat == KvFormat::kFp8E4m3 || kFormat == KvFormat::kFp8DsMla) {
    // Two 16-head fp8 blocks share an sm_120 SM, with two stages of raw tiles (but fp8_ds_mla
    // at D = 576, 52,608 bytes, and its paired-scores variant, 47,488) or one decoded stage
    // (decoded ones stay at one: with two, one block, 0.64-0.96x, bench/HISTORY.md v11).
    const bool raw_fits = !(kFormat == KvFormat::kFp8DsMla && kHeadDim == kHeadSizeRoPE);
    EXPECT_EQ(sm120_blocks_by_smem(Group1::kSmemBytes), raw_fits ? 2 : 1) << "D " << kHeadDim;
    EXPECT_EQ(Group1::kHasPairedScoresVariant, !raw_fits) << "D " << kHeadDim;
    if constexpr (Group1::kHasPairedScoresVariant)
      EXPECT_EQ(sm120_blocks_by_smem(Group1::PairedScores::kSmemBytes), 2) << "D " << kHeadDim;
    EXPECT_EQ(sm120_blocks_by_smem(Group1::DecodedFp8::kSmemBytes), 2) << "D " << kHeadDim;
  }
}

}  // namespace

TEST(KernelTraits, SixteenBitAndFp8CachesCopyTwoStages) {
  expect_stages<__nv_bfloat16, KvFormat::kBFloat16, 512>(2, 2);
  expect_stages<__nv_bfloat16, KvFormat::kBFloat16, 576>(2, 2);
  expect_stages<__half, KvFormat::kFloat16, 512>(2, 2);
  expect_stages<__half, KvFormat::kFloat16, 576>(2, 2);
  // (fp8: raw tiles, two stages; their 32-head blocks three, the PingPong kernel's.)
  expect_stages<__nv_bfloat16, KvFormat::kFp8E4m3, 512>(2, 3);
  expect_stages<__half, KvFormat::kFp8E4m3, 576>(2, 3);
  expect_stages<__nv_bfloat16, KvFormat::kFp8DsMla, 512>(2, 3);
  expect_stages<__half, KvFormat::kFp8DsMla, 576>(2, 3);
}

TEST(KernelTraits, Fp8E4m3TilesStayRawWithAConflictFreePitch) {
  using E4m3 = SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 576, 1>;
  static_assert(E4m3::kRawFp8 && E4m3::kDirectCopy);
  EXPECT_EQ(E4m3::kSmemRowBytes, 592);  // 37 x 16 bytes: 8 rows of ldmatrix in 8 bank groups
  EXPECT_EQ(E4m3::kSmemKVStageBytes, 32 * 592);
  EXPECT_EQ((SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 512, 1>::kSmemRowBytes), 528);
  // Its 32-head blocks: the PingPong kernel of raw tiles (sparse_mla_fwd_pingpong.cuh), 16 warps
  // in two roles, three stages (q in stages 1 and 2), one partial-score buffer, one P.
  using E4m3Glm32 = SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 512, 2>;
  using E4m3Ds32 = SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kFp8E4m3, 576, 2>;
  static_assert(E4m3Glm32::kRawFp8 && E4m3Glm32::kWideWarps && E4m3Glm32::kHasDecodedFp8Variant);
  static_assert(E4m3Ds32::kRawFp8 && E4m3Ds32::kWideWarps && E4m3Ds32::kHasDecodedFp8Variant);
  static_assert(!E4m3Ds32::DecodedFp8::kWideWarps && !E4m3Ds32::DecodedFp8::kRawFp8);
  static_assert(E4m3Ds32::kPingPong && E4m3Glm32::kPingPong && !E4m3::kPingPong);
  static_assert(!SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 2>::kPingPong);
  EXPECT_EQ(E4m3Ds32::kNumThreads, 512);
  EXPECT_EQ(E4m3Ds32::kPBuffers, 1);
  EXPECT_EQ(E4m3Ds32::kSBuffersPerGroup, 4);
  EXPECT_EQ(E4m3Ds32::kSmemBytes, 80016);  // 3 x (32 x 592 + 128) + 20,480 + 2,048 + 256 + 16
  EXPECT_EQ(E4m3Glm32::kSmemBytes, 73872);
  EXPECT_LE(E4m3Ds32::kSmemBytes, kSmemBudgetBytes);
  static_assert(!SparseMlaFwdTraits<__half, KvFormat::kBFloat16, 576, 1>::kRawFp8);
}

TEST(KernelTraits, Fp8DsMlaTilesStayRawAsStored) {
  // The record as stored (latent, scales, bf16 rope: 41 x 16 bytes), without the rope at D = 512
  // (33 x 16); its scales are read from the tile, not a separate buffer.
  using DsMla576 = SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 576, 1>;
  using DsMla512 = SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kFp8DsMla, 512, 1>;
  static_assert(DsMla576::kRawFp8 && DsMla576::kDirectCopy && !DsMla576::kScaleBuffer);
  // Its P (which carries the key scales) is built in registers: no P buffer in shared memory.
  static_assert(DsMla576::kRegisterP && DsMla576::kPBuffers == 0);
  EXPECT_EQ(DsMla576::kSmemRowBytes, kDsMlaRecordBytes);
  EXPECT_EQ(DsMla576::kGatherRowBytes, kDsMlaRecordBytes);
  EXPECT_EQ(DsMla512::kSmemRowBytes, kDsMlaRopeOffset);
  EXPECT_EQ(DsMla512::kGatherRowBytes, kDsMlaRopeOffset);
  EXPECT_EQ(DsMla576::kSmemBytes, 52608);
  // Its paired-scores variant: two stages of 656-byte rows (41,984 bytes), two partial-score
  // buffers instead of four (one per pair of warps, 5,120 bytes), the softmax statistics and the
  // valid flags: 47,488 bytes, two blocks per sm_120 SM.
  using Paired = DsMla576::PairedScores;
  static_assert(DsMla576::kHasPairedScoresVariant && !DsMla576::kPairedScores && DsMla576::kSBuffersPerGroup == 4);
  static_assert(Paired::kPairedScores && !Paired::kHasPairedScoresVariant && Paired::kSBuffersPerGroup == 2);
  static_assert(Paired::kRawFp8 && Paired::kStages == 2);
  // Its e4m3 P V variant (a measuring option): the same tiles and shared memory, P V on e4m3 MMAs;
  // none for the paired-scores variant, fp8_e4m3 (P through shared memory) or 16-bit caches.
  using E4m3Pv = DsMla576::E4m3Pv;
  static_assert(DsMla576::kHasE4m3PvVariant && E4m3Pv::kE4m3Pv && !E4m3Pv::kHasE4m3PvVariant);
  static_assert(!Paired::kHasE4m3PvVariant && DsMla512::kHasE4m3PvVariant);
  static_assert(!SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 576, 1>::kHasE4m3PvVariant);
  static_assert(!SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 2>::kHasE4m3PvVariant);
  EXPECT_EQ(E4m3Pv::kSmemBytes, DsMla576::kSmemBytes);
  EXPECT_EQ(Paired::kSmemBytes, 47488);
  // No other configuration has it (the decode-once variant, 32-head blocks, D = 512, 16-bit).
  static_assert(!DsMla576::DecodedFp8::kHasPairedScoresVariant && !DsMla512::kHasPairedScoresVariant);
  static_assert(!SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 576, 2>::kHasPairedScoresVariant);
  static_assert(!SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 576, 1>::kHasPairedScoresVariant);
  static_assert(!SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 1>::kHasPairedScoresVariant);
  static_assert(!SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 1>::OneStage::kHasPairedScoresVariant);
  static_assert(SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 576, 2>::kRawFp8);
  using DsMlaGlm32 = SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 512, 2>;
  static_assert(DsMlaGlm32::kRawFp8 && !DsMlaGlm32::kScaleBuffer && DsMlaGlm32::kHasDecodedFp8Variant);
  static_assert(DsMlaGlm32::DecodedFp8::kScaleBuffer);
  // Its 32-head blocks: the PingPong kernel of raw tiles (sparse_mla_fwd_pingpong.cuh), whose P V
  // warps scale the one P by their scale tile's key scales, in three stages; their e4m3 P V
  // variant is the main kernel's, with P in registers.
  using DsMla32 = SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 576, 2>;
  static_assert(DsMla32::kWideWarps && DsMlaGlm32::kWideWarps && !DsMla32::kRegisterP);
  static_assert(DsMla32::kPingPong && DsMlaGlm32::kPingPong && DsMla32::kNumThreads == 512);
  static_assert(DsMla32::kPBuffers == 1 && DsMla32::kStatsArrays == 2 && DsMla32::kStages == 3 &&
                DsMla32::kSBuffersPerGroup == 4);
  static_assert(DsMla32::kHasE4m3PvVariant && !DsMla32::E4m3Pv::kWideWarps && DsMla32::E4m3Pv::kRegisterP);
  EXPECT_EQ(DsMla32::kSmemBytes, 86160);  // 3 x (32 x 656 + 128) + 20,480 + 2,048 + 256 + 16
  EXPECT_EQ(DsMlaGlm32::kSmemBytes, 73872);
}

TEST(KernelTraits, Fp8CachesHaveADecodeOnceVariantThatFitsTwicePerSm120Sm) {
  using E4m3 = SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 576, 1>;
  using Decoded = E4m3::DecodedFp8;
  static_assert(E4m3::kHasDecodedFp8Variant && !Decoded::kRawFp8 && !Decoded::kDirectCopy);
  static_assert(!Decoded::kHasDecodedFp8Variant && !Decoded::kHasOneStageVariant);
  static_assert(SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 576, 1>::kHasDecodedFp8Variant);
  static_assert(!SparseMlaFwdTraits<__half, KvFormat::kFloat16, 576, 1>::kHasDecodedFp8Variant);
  EXPECT_EQ(Decoded::kStages, 1);
  EXPECT_EQ((SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 576, 2>::DecodedFp8::kStages), 2);
  EXPECT_EQ(sm120_blocks_by_smem(Decoded::kSmemBytes), 2);
  EXPECT_EQ(sm120_blocks_by_smem(SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kFp8E4m3, 512, 1>::DecodedFp8::kSmemBytes),
            2);
}

TEST(KernelTraits, Fp8DsMlaKeepsPInRegistersAndDecodesIntoTwoStagesIn32HeadBlocks) {
  // The decode-once kernels: 32-head fp8_ds_mla at D = 576 needed 105,984 bytes for two stages
  // with four P copies per head group in shared memory; with P in registers, 96,768.
  using DsMla576 = SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 576, 2>::DecodedFp8;
  static_assert(DsMla576::kRegisterP && DsMla576::kPBuffers == 0 && !DsMla576::kRawFp8);
  static_assert(!SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 576, 2>::kRegisterP);
  EXPECT_EQ(DsMla576::kStages, 2);
  EXPECT_EQ(DsMla576::kSmemBytes, 96768);
  using DsMla512 = SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 512, 2>::DecodedFp8;
  EXPECT_EQ(DsMla512::kStages, 2);
  EXPECT_EQ(DsMla512::kSmemBytes, 88576);
  EXPECT_EQ((SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 512, 2>::E4m3Pv::kSmemBytes), 54784);  // raw tiles
  using DsMla576x16 = SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 576, 1>::DecodedFp8;
  EXPECT_EQ(DsMla576x16::kStages, 1);
  EXPECT_EQ(DsMla576x16::kSmemBytes, 48384);
}

TEST(KernelTraits, SixteenHeadSixteenBitBlocksHaveAOneStageVariantThatFitsTwicePerSm120Sm) {
  using Bf16 = SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 1>;
  using Fp16 = SparseMlaFwdTraits<__half, KvFormat::kFloat16, 512, 1>;
  static_assert(Bf16::kHasOneStageVariant && Fp16::kHasOneStageVariant);
  static_assert(!SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 2>::kHasOneStageVariant);
  static_assert(!SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 576, 1>::kHasOneStageVariant);
  EXPECT_EQ(Bf16::OneStage::kStages, 1);
  EXPECT_EQ(sm120_blocks_by_smem(Bf16::kSmemBytes), 1);  // 86,656 bytes
  EXPECT_EQ(sm120_blocks_by_smem(Bf16::OneStage::kSmemBytes), 2);  // 49,152
  EXPECT_EQ(sm120_blocks_by_smem(Fp16::kSmemBytes), 1);
  EXPECT_EQ(sm120_blocks_by_smem(Fp16::OneStage::kSmemBytes), 2);
}

namespace {

// Whether a warp's float2 accesses to fp32 scores of row pitch `pitch` (words) in MMA accumulator
// order (lane: row lane / 4, columns 2 (lane % 4) + {0, 1}) are free of bank conflicts: shared
// memory serves 64-bit accesses a half-warp at a time, so each half-warp's 32 words must fall
// into 32 different banks.
bool accumulator_order_float2_conflict_free(int pitch) {
  for (int half = 0; half < 2; ++half) {
    bool used[32] = {};
    for (int lane = 16 * half; lane < 16 * half + 16; ++lane) {
      for (int w = 0; w < 2; ++w) {
        const int bank = ((lane / 4) * pitch + (lane % 4) * 2 + w) % 32;
        if (used[bank]) return false;
        used[bank] = true;
      }
    }
  }
  return true;
}

}  // namespace

TEST(KernelTraits, AccumulatorOrderScoreAccessesAreConflictFree) {
  EXPECT_FALSE(accumulator_order_float2_conflict_free(36));  // two-way: the check can fail
  // Every kernel's S warps write their partial scores in that order, register-P warps read them
  // so (bench/HISTORY.md v30: 1.01-1.06x faster at pitch 40 than at 36).
  EXPECT_TRUE(accumulator_order_float2_conflict_free(SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 1>::kSPitch));
  EXPECT_TRUE(accumulator_order_float2_conflict_free(SparseMlaFwdTraits<__half, KvFormat::kFloat16, 512, 2>::kSPitch));
  EXPECT_TRUE(accumulator_order_float2_conflict_free(SparseMlaFwdTraits<__half, KvFormat::kBFloat16, 576, 2>::kSPitch));
  EXPECT_TRUE(accumulator_order_float2_conflict_free(SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kFp8E4m3, 576, 1>::kSPitch));
  EXPECT_TRUE(accumulator_order_float2_conflict_free(SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kFp8DsMla, 512, 2>::kSPitch));
  // With it the largest kernel, whose P and alpha are double-buffered since v33 (P V one tile
  // late), still fits one block on an sm_120 SM.
  using Wide576 = SparseMlaFwdTraits<__half, KvFormat::kFloat16, 576, 2>;
  static_assert(Wide576::kWideWarps);
  EXPECT_EQ(Wide576::kSmemBytes, 99968);
  EXPECT_EQ(sm120_blocks_by_smem(Wide576::kSmemBytes), 1);
}

namespace {

// The WideWarps kernel family (v29): the kernel of 32-head blocks of 16-bit caches whose q enters
// the MMAs in one part (not fp16 q with a bf16 cache), and of fp8 caches (v42, v43), of no other
// configuration or variant.
template <typename Traits>
void expect_wide_warps_rule(const char* variant, bool is_main) {
  const bool one_q_part = !(Traits::kFormat == KvFormat::kBFloat16 && std::is_same_v<typename Traits::QElement, __half>);
  const bool format = is_fp8(Traits::kFormat) || one_q_part;
  const bool there = is_main && Traits::kHeadGroups == 2 && format;
  const auto config = [&] {
    return std::string(variant) + ": format " + std::to_string(static_cast<int>(Traits::kFormat)) + ", D " +
           std::to_string(Traits::kHeadDim) + ", " + std::to_string(Traits::kHeadGroups) + " head groups, q " +
           (std::is_same_v<typename Traits::QElement, __half> ? "fp16" : "bf16");
  };
  EXPECT_EQ(Traits::kWideWarps, there) << config();
}

template <typename QElement, KvFormat kFormat, int kHeadDim, int kHeadGroups>
void expect_rules_of_every_variant() {
  using Main = SparseMlaFwdTraits<QElement, kFormat, kHeadDim, kHeadGroups>;
  expect_wide_warps_rule<Main>("main", true);
  if constexpr (Main::kHasOneStageVariant) expect_wide_warps_rule<typename Main::OneStage>("one-stage", false);
  if constexpr (Main::kHasDecodedFp8Variant) expect_wide_warps_rule<typename Main::DecodedFp8>("decode-once", false);
  if constexpr (Main::kHasPairedScoresVariant) expect_wide_warps_rule<typename Main::PairedScores>("paired", false);
  if constexpr (Main::kHasE4m3PvVariant) expect_wide_warps_rule<typename Main::E4m3Pv>("e4m3 P V", false);
}

template <typename QElement, KvFormat kFormat>
void expect_rules_of_every_shape() {
  expect_rules_of_every_variant<QElement, kFormat, 512, 1>();
  expect_rules_of_every_variant<QElement, kFormat, 512, 2>();
  expect_rules_of_every_variant<QElement, kFormat, 576, 1>();
  expect_rules_of_every_variant<QElement, kFormat, 576, 2>();
}

}  // namespace

TEST(KernelTraits, WideWarpsOnlyForThirtyTwoHeadBlocksOfSixteenBitCachesWithQInOnePartAndOfFp8Caches) {
  // The rule's measurements are in kernel_traits.h beside it (bench/HISTORY.md v29, v42, v43).
  for (auto check : {expect_rules_of_every_shape<__nv_bfloat16, KvFormat::kBFloat16>,
                     expect_rules_of_every_shape<__half, KvFormat::kBFloat16>,
                     expect_rules_of_every_shape<__nv_bfloat16, KvFormat::kFloat16>,
                     expect_rules_of_every_shape<__half, KvFormat::kFloat16>,
                     expect_rules_of_every_shape<__nv_bfloat16, KvFormat::kFp8E4m3>,
                     expect_rules_of_every_shape<__half, KvFormat::kFp8E4m3>,
                     expect_rules_of_every_shape<__nv_bfloat16, KvFormat::kFp8DsMla>,
                     expect_rules_of_every_shape<__half, KvFormat::kFp8DsMla>})
    check();
}
