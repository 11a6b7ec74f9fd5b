// GoogleTest of the tile configuration (csrc/sparse_mla/kernel_traits.h): where fp8 tiles get a
// second decoded stage, and what that leaves of sm_120's occupancy.
#include <gtest/gtest.h>

#include "kernel_traits.h"

using namespace sparse_mla;

namespace {

template <typename Traits>
constexpr int sm120_blocks_by_smem() {
  return kSm120SmemPerSm / (Traits::kSmemBytes + kSmemReservedPerBlock);
}

template <typename QElement, KvFormat kFormat, int kHeadDim>
void expect_stages(int stages_16_heads, int stages_32_heads) {
  using Group1 = SparseMlaFwdTraits<QElement, kFormat, kHeadDim, 1>;
  using Group2 = SparseMlaFwdTraits<QElement, kFormat, kHeadDim, 2>;
  EXPECT_EQ(Group1::kStages, stages_16_heads) << "16 heads, D " << kHeadDim << ", format " << static_cast<int>(kFormat);
  EXPECT_EQ(Group2::kStages, stages_32_heads) << "32 heads, D " << kHeadDim << ", format " << static_cast<int>(kFormat);
  if constexpr (kFormat == KvFormat::kFp8E4m3 || kFormat == KvFormat::kFp8DsMla) {
    // The 16-head fp8 kernels stay at one stage so that two blocks share an sm_120 SM (with two
    // stages, one block: 0.64-0.96x, bench/NOTES.md v11); fp8_ds_mla at D = 576 gets one either
    // way (and ran 0.91-0.94x with two stages).
    const bool two_fit = !(kFormat == KvFormat::kFp8DsMla && kHeadDim == kHeadSizeRoPE);
    EXPECT_EQ(sm120_blocks_by_smem<Group1>(), two_fit ? 2 : 1) << "D " << kHeadDim;
  }
}

}  // namespace

TEST(KernelTraits, SixteenBitCachesCopyTwoStages) {
  expect_stages<__nv_bfloat16, KvFormat::kBFloat16, 512>(2, 2);
  expect_stages<__nv_bfloat16, KvFormat::kBFloat16, 576>(2, 2);
  expect_stages<__half, KvFormat::kFloat16, 512>(2, 2);
  expect_stages<__half, KvFormat::kFloat16, 576>(2, 2);
}

TEST(KernelTraits, Fp8DecodesIntoASecondStageOnlyIn32HeadBlocksThatFitIt) {
  expect_stages<__nv_bfloat16, KvFormat::kFp8E4m3, 512>(1, 2);
  expect_stages<__half, KvFormat::kFp8E4m3, 576>(1, 2);
  expect_stages<__half, KvFormat::kFp8DsMla, 512>(1, 2);
  // 32-head fp8_ds_mla at D = 576 would need 105,984 bytes with two stages.
  expect_stages<__nv_bfloat16, KvFormat::kFp8DsMla, 576>(1, 1);
  using DsMla576 = SparseMlaFwdTraits<__half, KvFormat::kFp8DsMla, 576, 2>;
  EXPECT_GT(DsMla576::kSmemUnstaged + 2 * DsMla576::kSmemPerStage, kSmemBudgetBytes);
}

TEST(KernelTraits, SixteenHeadSixteenBitBlocksHaveAOneStageVariantThatFitsTwicePerSm120Sm) {
  using Bf16 = SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 1>;
  using Fp16 = SparseMlaFwdTraits<__half, KvFormat::kFloat16, 512, 1>;
  static_assert(Bf16::kHasOneStageVariant && Fp16::kHasOneStageVariant);
  static_assert(!SparseMlaFwdTraits<__nv_bfloat16, KvFormat::kBFloat16, 576, 2>::kHasOneStageVariant);
  static_assert(!SparseMlaFwdTraits<__half, KvFormat::kFp8E4m3, 576, 1>::kHasOneStageVariant);
  EXPECT_EQ(Bf16::OneStage::kStages, 1);
  EXPECT_EQ(sm120_blocks_by_smem<Bf16>(), 1);  // 86,912 bytes
  EXPECT_EQ(sm120_blocks_by_smem<Bf16::OneStage>(), 2);  // 49,408
  EXPECT_EQ(sm120_blocks_by_smem<Fp16>(), 1);
  EXPECT_EQ(sm120_blocks_by_smem<Fp16::OneStage>(), 2);
}
