// Tile configuration and shared-memory layout of the sparse-MLA forward kernel. The kernel body
// (sparse_mla_fwd_kernel.cuh) is written against these traits; the ceiling check is here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "formats.h"

namespace sparse_mla {

template <typename T> struct ElementDType;
template <> struct ElementDType<__nv_bfloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct ElementDType<__half> { static constexpr DType value = DType::kFloat16; };

// Element: q / out / MMA operand type. kFormat: cache row format. kHeadDim: D (512 or 576).
template <typename Element_, KvFormat kFormat_, int kHeadDim_>
struct SparseMlaFwdTraits {
  using Element = Element_;
  static constexpr KvFormat kFormat = kFormat_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == kHeadSizeNoPE || kHeadDim == kHeadSizeRoPE, "D must be 512 or 576");

  // One block: one query token, kBlockH heads (the M = 16 of m16n8k16), a range of KV tiles of
  // kBlockN rows. Each of the 4 warps scores 8 rows of a tile, then accumulates 128 of the 512
  // output columns, so a warp holds 16 x 128 fp32 accumulators (64 registers per thread).
  static constexpr int kBlockH = 16;
  static constexpr int kBlockN = 32;
  static constexpr int kNumWarps = 4;
  static constexpr int kNumThreads = kNumWarps * 32;
  static constexpr int kDvPerWarp = kHeadSizeV / kNumWarps;
  static constexpr int kThreadsPerRow = kNumThreads / kBlockN;  // gather: 4 threads per KV row
  static_assert(kThreadsPerRow * kBlockN == kNumThreads);
  static_assert(kBlockN == kNumWarps * 8, "each warp scores one n8 slice of the tile");

  // 16-bit cache rows are copied straight into shared memory with cp.async (two stages in
  // flight); a row of the other 16-bit type is then converted in place by the thread that copied
  // it. fp8 rows are loaded into registers one tile ahead and dequantised on the way into shared
  // memory.
  static constexpr bool kDirectCopy = kFormat == KvFormat::kBFloat16 || kFormat == KvFormat::kFloat16;
  static constexpr bool kConvertInPlace =
      kDirectCopy && (kFormat == KvFormat::kBFloat16) != std::is_same_v<Element, __nv_bfloat16>;
  static constexpr int kStages = kDirectCopy ? 2 : 1;

  // Rows padded by 16 bytes: ldmatrix reads 8 rows at one column, and a row pitch that is an
  // odd multiple of 16 bytes (mod 128) puts those rows in 8 different bank groups.
  static constexpr int kSmemPitch = kHeadDim + 8;  // elements
  static constexpr int kSPitch = kBlockN + 4;      // fp32 scores
  static constexpr int kPPitch = kBlockN + 8;      // probabilities, Element

  static constexpr int kSmemQOffset = 0;
  static constexpr int kSmemKVOffset = kSmemQOffset + kBlockH * kSmemPitch * 2;
  static constexpr int kSmemKVStageBytes = kBlockN * kSmemPitch * 2;
  static constexpr int kSmemSOffset = kSmemKVOffset + kStages * kSmemKVStageBytes;
  static constexpr int kSmemPOffset = kSmemSOffset + kBlockH * kSPitch * 4;
  static constexpr int kSmemStatsOffset = kSmemPOffset + kBlockH * kPPitch * 2;  // alpha, l
  static constexpr int kSmemValidOffset = kSmemStatsOffset + 2 * kBlockH * 4;
  static constexpr int kSmemBytes = kSmemValidOffset + kStages * kBlockN * 4;

  static_assert(kSmemBytes <= kSmemBudgetBytes,
                "a kernel instantiation exceeds the 101,376-byte shared-memory ceiling");
};

}  // namespace sparse_mla
