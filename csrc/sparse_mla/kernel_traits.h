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

// QElement: q / out type. kFormat: cache row format. kHeadDim: D (512 or 576).
template <typename QElement_, KvFormat kFormat_, int kHeadDim_>
struct SparseMlaFwdTraits {
  using QElement = QElement_;
  static constexpr KvFormat kFormat = kFormat_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == kHeadSizeNoPE || kHeadDim == kHeadSizeRoPE, "D must be 512 or 576");

  // Precision plan (SPEC §5 asks for per-row cosine >= 0.999998, i.e. little beyond the final
  // rounding of out). Cache values enter the MMA exactly: fp16 caches as fp16, bf16 caches as
  // bf16, e4m3 values as bf16 (which holds them exactly) with their scales applied in fp32.
  // q enters exactly too: as is, bf16 -> fp16 (exact in fp16's range), or fp16 -> bf16 split
  // into hi + lo bf16 parts. P in bf16 would lose 2^-9, so bf16 P is split into hi + lo as well.
  static constexpr bool kMmaBf16 = kFormat != KvFormat::kFloat16;
  using Element = std::conditional_t<kMmaBf16, __nv_bfloat16, __half>;  // MMA operand type
  static constexpr bool kQConvert = !std::is_same_v<QElement, Element>;
  static constexpr bool kQSplit = kMmaBf16 && kQConvert;
  static constexpr bool kPSplit = kMmaBf16;
  static constexpr bool kDsMla = kFormat == KvFormat::kFp8DsMla;

  // One block: one query token, kBlockH heads (the M = 16 of m16n8k16), a range of KV tiles of
  // kBlockN rows. Each of the 4 warps scores 8 rows of a tile, then accumulates 128 of the 512
  // output columns, so a warp holds 16 x 128 fp32 accumulators (64 registers per thread). Those
  // 128 columns are exactly one fp8_ds_mla scale tile, so warp w folds scale w into its P.
  static constexpr int kBlockH = 16;
  static constexpr int kBlockN = 32;
  static constexpr int kNumWarps = 4;
  static constexpr int kNumThreads = kNumWarps * 32;
  static constexpr int kDvPerWarp = kHeadSizeV / kNumWarps;
  static constexpr int kThreadsPerRow = kNumThreads / kBlockN;  // gather: 4 threads per KV row
  static_assert(kThreadsPerRow * kBlockN == kNumThreads);
  static_assert(kBlockN == kNumWarps * 8, "each warp scores one n8 slice of the tile");
  static_assert(!kDsMla || kDvPerWarp == kDsMlaTile, "a warp's columns must be one scale tile");

  // 16-bit cache rows are copied straight into shared memory with cp.async (two stages in
  // flight, one when a split q takes the room); fp8 rows are loaded into registers one tile
  // ahead and decoded on the way into shared memory.
  static constexpr bool kDirectCopy = kFormat == KvFormat::kBFloat16 || kFormat == KvFormat::kFloat16;
  static constexpr int kQParts = kQSplit ? 2 : 1;
  static constexpr int kStages = kDirectCopy && !kQSplit ? 2 : 1;
  static constexpr int kPParts = kPSplit ? 2 : 1;
  static constexpr int kPBuffers = (kDsMla ? kNumWarps : 1) * kPParts;

  // Rows padded by 16 bytes: ldmatrix reads 8 rows at one column, and a row pitch that is an
  // odd multiple of 16 bytes (mod 128) puts those rows in 8 different bank groups.
  static constexpr int kSmemPitch = kHeadDim + 8;  // elements
  static constexpr int kSPitch = kBlockN + 4;      // fp32 scores
  static constexpr int kPPitch = kBlockN + 8;      // probabilities, Element

  static constexpr int kSmemQOffset = 0;
  static constexpr int kSmemQPartBytes = kBlockH * kSmemPitch * 2;
  static constexpr int kSmemKVOffset = kSmemQOffset + kQParts * kSmemQPartBytes;
  static constexpr int kSmemKVStageBytes = kBlockN * kSmemPitch * 2;
  static constexpr int kSmemSOffset = kSmemKVOffset + kStages * kSmemKVStageBytes;
  static constexpr int kSmemPOffset = kSmemSOffset + kBlockH * kSPitch * 4;
  static constexpr int kSmemPBufferElems = kBlockH * kPPitch;
  static constexpr int kSmemStatsOffset = kSmemPOffset + kPBuffers * kSmemPBufferElems * 2;  // alpha, l
  static constexpr int kSmemValidOffset = kSmemStatsOffset + 2 * kBlockH * 4;
  static constexpr int kSmemScaleOffset = kSmemValidOffset + kStages * kBlockN * 4;  // fp8_ds_mla
  static constexpr int kSmemBytes = kSmemScaleOffset + (kDsMla ? kBlockN * 4 * 4 : 0);

  static_assert(kSmemBytes <= kSmemBudgetBytes,
                "a kernel instantiation exceeds the 101,376-byte shared-memory ceiling");
};

}  // namespace sparse_mla
