// Tile configuration and shared-memory layout of the sparse-MLA forward kernel. The kernel body
// (sparse_mla_fwd_kernel.cuh) is written against these traits; the ceiling check is here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "formats.h"
#include "params.h"

namespace sparse_mla {

// Heads one block serves: 16 (one m16 tile) or 32 (each gathered tile feeds twice the MMAs);
// planned per launch (planner.h plan_head_groups).
constexpr int kMaxHeadGroups = 2;
// The groups of the largest block a token of num_heads heads can fill.
constexpr int head_groups_for(int num_heads) { return num_heads > 16 ? 2 : 1; }

// Whether a configuration's kernel is the WideWarps family: 32-head blocks of 16-bit caches whose
// q enters the MMAs in one part, i.e. all but fp16 q with a bf16 cache (sparse_mla_fwd_wide.cuh;
// 1.08-1.13x faster than the main kernel there on the H200, bench/HISTORY.md v29), and of fp8
// caches in raw tiles (fp8_e4m3 v42, fp8_ds_mla v43; sparse_mla_fwd_pingpong.cuh since v48), but
// for the E4m3Pv variant.
template <typename QElement, KvFormat kFormat, int kHeadGroups, int kCopyStages, bool kFp8RawTiles>
constexpr bool wide_warps_kernel() {
  if (kHeadGroups != 2 || kCopyStages != 2) return false;
  if (is_fp8(kFormat)) return kFp8RawTiles;
  return !(kFormat == KvFormat::kBFloat16 && !std::is_same_v<QElement, __nv_bfloat16>);
}

// QElement: q / out type. kFormat: cache row format. kHeadDim: D (512 or 576). kHeadGroups:
// groups of 16 heads per block. The rest select a variant (docs/design.md, the table of
// variants): kCopyStages 1 is OneStage, kFp8RawTiles false DecodedFp8, kPairedScores
// PairedScores, kE4m3Pv E4m3Pv; kWideWarps, which the configuration sets, the WideWarps family.
template <typename QElement_, KvFormat kFormat_, int kHeadDim_, int kHeadGroups_, int kCopyStages_ = 2,
          bool kFp8RawTiles_ = true, bool kPairedScores_ = false, bool kE4m3Pv_ = false,
          bool kWideWarps_ = wide_warps_kernel<QElement_, kFormat_, kHeadGroups_, kCopyStages_, kFp8RawTiles_>()>
struct SparseMlaFwdTraits {
  using QElement = QElement_;
  static constexpr KvFormat kFormat = kFormat_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == kHeadSizeNoPE || kHeadDim == kHeadSizeRoPE, "D must be 512 or 576");

  // Precision plan (docs/design.md "Precision"). Cache values enter the MMA exactly: bf16 caches
  // as bf16, fp16 caches as fp16, e4m3 values (exact in fp16) as fp16, their scales applied in
  // fp32; q too (bf16 -> fp16 in fp16's range, fp16 -> bf16 as hi + lo parts). S, the softmax and
  // O are fp32; P is rounded once to the MMA type, as vLLM's own sparse kernels do (fp8_ds_mla's
  // in the WideWarps family twice, both in fp16: p, then p x key scale / norm).
  static constexpr bool kMmaBf16 = kFormat == KvFormat::kBFloat16;
  using Element = std::conditional_t<kMmaBf16, __nv_bfloat16, __half>;  // MMA operand type
  static constexpr bool kQConvert = !std::is_same_v<QElement, Element>;
  static constexpr bool kQSplit = kMmaBf16 && kQConvert;
  // fp8_ds_mla folds its per-row scales into P, so each warp's P differs (its column tile's
  // scales): the softmax writes p in fp32 and every warp builds its own P fragments in registers,
  // divided by a power of two near its tile's largest scale to keep fp16 out of the subnormals.
  // (The WideWarps family instead has each warp scale its P fragments, read from the one P.)
  static constexpr bool kDsMla = kFormat == KvFormat::kFp8DsMla;
  static constexpr bool kRegisterP = kDsMla && !kWideWarps_;

  // One block: one query token, kHeadGroups x 16 heads, a range of KV tiles of kBlockN rows.
  // Warp (g, w) of head group g (16 heads = the M of m16n8k16):
  //   S = Q K^T: all 32 rows of the tile over its quarter of D (latent columns 128w..128w+127,
  //              which is fp8_ds_mla scale tile w, plus rope k-step w when D = 576), with its
  //              Q fragments held in registers for the whole kernel; the four partial scores
  //              are summed by the softmax threads.
  //   O += P V:  its 128 of the 512 output columns over the tile's 32 rows, so it holds
  //              16 x 128 fp32 accumulators (64 registers per thread).
  static constexpr int kHeadGroups = kHeadGroups_;
  static constexpr int kBlockH = 16 * kHeadGroups;
  static constexpr int kBlockN = 32;
  static constexpr int kWarpsPerGroup = 4;
  static constexpr int kNumWarps = kWarpsPerGroup * kHeadGroups;
  // PingPong (sparse_mla_fwd_pingpong.cuh): the WideWarps family's fp8 blocks with a second set of
  // 8 warps, S in one set and the softmax and P V in the other, three stages.
  static constexpr bool kPingPong = kWideWarps_ && is_fp8(kFormat_);
  static constexpr int kNumThreads = kNumWarps * 32 * (kPingPong ? 2 : 1);
  static constexpr int kDvPerWarp = kHeadSizeV / kWarpsPerGroup;
  static constexpr int kLatentStepsPerWarp = kKvLoraRank / 16 / kWarpsPerGroup;  // 8
  static constexpr int kRopeStepsPerWarp = (kHeadDim - kKvLoraRank) / 16 / kWarpsPerGroup;  // 0 or 1
  static constexpr int kStepsPerWarp = kLatentStepsPerWarp + kRopeStepsPerWarp;
  // fp8 register loader: 4 or 8 threads per KV row (cp.async gathers use 8 in every block).
  static constexpr int kThreadsPerRow = kNumThreads / kBlockN;
  static_assert(kThreadsPerRow * kBlockN == kNumThreads);
  static_assert(kRopeStepsPerWarp * 16 * kWarpsPerGroup == kHeadDim - kKvLoraRank);
  static_assert(kLatentStepsPerWarp * 16 == kDsMlaTile && kDvPerWarp == kDsMlaTile,
                "a warp's latent columns must be one fp8_ds_mla scale tile");

  // Rows are copied into shared memory with cp.async, two stages (one in OneStage). fp8 tiles
  // stay raw there (fp8_ds_mla: the record as stored, without its rope at D = 512) and are
  // decoded per MMA fragment: half the shared-memory traffic of a decoded tile, which bound the
  // 16-head fp8 kernels (bench/HISTORY.md v12). DecodedFp8 instead loads fp8 rows into registers
  // a tile ahead and decodes them into shared memory: into a second stage where it fits (32-head
  // blocks), else into the one stage between two barriers, which keeps two blocks on a 100 KB SM.
  static constexpr bool kRawFp8 = is_fp8(kFormat) && kFp8RawTiles_;
  static constexpr bool kDirectCopy = kFormat == KvFormat::kBFloat16 || kFormat == KvFormat::kFloat16 || kRawFp8;
  static constexpr int kQParts = kQSplit ? 2 : 1;
  // P buffers per head group: none with P in registers; two in the WideWarps body (below), whose
  // P V of a tile runs beside the next tile's softmax, which also needs a second array of alpha;
  // one in the PingPong body, whose P V warps write their P and read it back.
  static constexpr bool kWideWarps = kWideWarps_;
  static constexpr int kPBuffers = kRegisterP ? 0 : kWideWarps && !kPingPong ? 2 : 1;
  static constexpr int kStatsArrays = kWideWarps && !kPingPong ? 3 : 2;  // alpha (per tile in flight), l; kBlockH floats each

  // ldmatrix reads 8 rows at one column, and a row pitch that is an odd multiple of 16 bytes
  // (mod 128) puts those rows in 8 different bank groups: rows are padded by 16 bytes, but for
  // raw fp8_ds_mla records, whose sizes already are.
  static constexpr int kSmemPitch = kHeadDim + 8;  // elements of a decoded or 16-bit row
  // Raw fp8_ds_mla rows: the record without its rope (D = 512) or all of it, 33 or 41 x 16 bytes.
  static constexpr int kSmemRowBytes = !kRawFp8 ? kSmemPitch * 2
                                       : kDsMla  ? kDsMlaRopeOffset + 2 * (kHeadDim - kKvLoraRank)
                                                 : kHeadDim + 16;
  static constexpr int kGatherRowBytes = kRawFp8 && kDsMla ? kSmemRowBytes : kv_row_bytes(kFormat, kHeadDim);
  static_assert(kSmemRowBytes % 16 == 0 && (kSmemRowBytes / 16) % 2 == 1);
  // fp32 scores (and, with register P, p in place of partial 0's), which the S warps write and
  // register-P warps read as float2 in accumulator order: pitch 40 keeps that free of bank
  // conflicts (36: two-way, 1.01-1.06x slower; bench/HISTORY.md v30).
  static constexpr int kSPitch = kBlockN + 8;
  // Probabilities, Element. The WideWarps family's rows are unpadded and their 16-byte chunks
  // swizzled instead (sparse_mla_fwd_wide.cuh p_chunk): its two P buffers must fit beside 576-wide
  // 16-bit tiles.
  static constexpr int kPPitch = kWideWarps ? kBlockN : kBlockN + 8;

  static constexpr int kSmemKVStageBytes = kBlockN * kSmemRowBytes;
  static constexpr int kSmemSPartElems = 16 * kSPitch;
  static constexpr int kSmemPBufferElems = 16 * kPPitch;
  // Shared memory per stage (tile, valid flags, decoded fp8_ds_mla's scales) and the rest.
  static constexpr bool kScaleBuffer = kDsMla && !kRawFp8;
  static constexpr int kSmemPerStage = kSmemKVStageBytes + kBlockN * 4 + (kScaleBuffer ? kBlockN * 4 * 4 : 0);
  // Partial-score buffers per head group: one per warp; in PairedScores one per pair of warps
  // (warps 2 and 3 add theirs into 0 and 1's behind one more barrier).
  static constexpr int kSmemSPartBytes = kSmemSPartElems * 4;
  static constexpr bool kPairedScores = kPairedScores_;
  static_assert(!kPairedScores || (kDirectCopy && kHeadGroups == 1), "paired partial scores: 16-head copied tiles");
  static constexpr int kSBuffersPerGroup = kPairedScores ? kWarpsPerGroup / 2 : kWarpsPerGroup;
  // PingPong: the mbarrier of its partial-score buffer's hand-over (8 bytes, in a 16-byte slot at an
  // 8-byte-aligned offset).
  static constexpr int kSmemBarrierBytes = kPingPong ? 16 : 0;
  static constexpr int kSmemUnstaged = kHeadGroups * kSBuffersPerGroup * kSmemSPartBytes +
                                       kHeadGroups * kPBuffers * kSmemPBufferElems * 2 + kStatsArrays * kBlockH * 4 +
                                       kSmemBarrierBytes;
  static constexpr int kStages =
      kPingPong ? 3 : kDirectCopy ? kCopyStages_ : (kHeadGroups == 2 && kSmemUnstaged + 2 * kSmemPerStage <= kSmemBudgetBytes) ? 2 : 1;
  // OneStage: a 16-head 16-bit block of one stage fits twice on a 100 KB SM (two stages: once);
  // its gather is not prefetched but hides behind the other block's MMAs.
  static constexpr bool kHasOneStageVariant = kDirectCopy && !kRawFp8 && kHeadGroups == 1 && kCopyStages_ == 2;
  static_assert(kCopyStages_ == 2 || (kCopyStages_ == 1 && kDirectCopy && !kRawFp8 && kHeadGroups == 1));
  using OneStage = SparseMlaFwdTraits<QElement_, kFormat_, kHeadDim_, kHeadGroups_, 1>;
  static constexpr bool kHasDecodedFp8Variant = kRawFp8;
  static_assert(kFp8RawTiles_ || is_fp8(kFormat));
  using DecodedFp8 = SparseMlaFwdTraits<QElement_, kFormat_, kHeadDim_, kHeadGroups_, kCopyStages_, false>;

  static constexpr int kSmemKVOffset = 0;
  static constexpr int kSmemSOffset = kSmemKVOffset + kStages * kSmemKVStageBytes;  // sS [g][buffer][16][pitch]
  static constexpr int kSmemPOffset = kSmemSOffset + kHeadGroups * kSBuffersPerGroup * kSmemSPartBytes;  // sP, same
  static constexpr int kSmemStatsOffset = kSmemPOffset + kHeadGroups * kPBuffers * kSmemPBufferElems * 2;
  static constexpr int kSmemValidOffset = kSmemStatsOffset + kStatsArrays * kBlockH * 4;  // alpha, l
  static constexpr int kSmemScaleOffset = kSmemValidOffset + kStages * kBlockN * 4;  // [stage][row][4]
  static constexpr int kSmemBarrierOffset = kSmemScaleOffset + (kScaleBuffer ? kStages * kBlockN * 4 * 4 : 0);
  static constexpr int kSmemBytes = kSmemBarrierOffset + kSmemBarrierBytes;
  static_assert(kSmemBarrierOffset % 8 == 0);
  static_assert(kSmemBytes == kSmemUnstaged + kStages * kSmemPerStage);

  // PairedScores exists where pairing alone lets a 16-head block of copied tiles fit twice on a
  // 100 KB SM (fp8_ds_mla's raw tiles at D = 576; bench/HISTORY.md v22).
  static constexpr bool kHasPairedScoresVariant =
      !kPairedScores && kDirectCopy && kHeadGroups == 1 && sm120_blocks_by_smem(kSmemBytes) < 2 &&
      sm120_blocks_by_smem(kSmemBytes - kWarpsPerGroup / 2 * kSmemSPartBytes) >= 2;
  using PairedScores =
      SparseMlaFwdTraits<QElement_, kFormat_, kHeadDim_, kHeadGroups_, kCopyStages_, kFp8RawTiles_, true>;

  // E4m3Pv (fp8_ds_mla's raw tiles, register P): P V on e4m3 m16n8k32 MMAs, V read as stored and
  // P' = p * key scale / norm * kE4m3PScale as e4m3 hi + lo parts, both at that scale so that
  // one set of accumulators takes both (bench/NOTES.md step D). P' < 2 before the scale, so the
  // parts stay below e4m3's 448. A measuring option (SPARSE_MLA_E4M3_PV=1, docs/kernel.md); on
  // sm_90 the e4m3 MMA is emulated.
  static constexpr bool kE4m3Pv = kE4m3Pv_;
  static_assert(!kE4m3Pv || (kRawFp8 && kRegisterP), "e4m3 P V: raw fp8_ds_mla tiles only");
  static constexpr float kE4m3PScale = 128.f;
  static constexpr bool kHasE4m3PvVariant = !kE4m3Pv && !kPairedScores && kRawFp8 && kDsMla;
  using E4m3Pv =
      SparseMlaFwdTraits<QElement_, kFormat_, kHeadDim_, kHeadGroups_, kCopyStages_, kFp8RawTiles_, false, true, false>;

  // WideWarps (wide_warps_kernel): the kernel bodies of sparse_mla_fwd_wide.cuh and (fp8)
  // sparse_mla_fwd_pingpong.cuh, in which every warp serves all 32 heads, so that each K and V
  // fragment read from shared memory feeds two MMAs: S over a quarter of D for 16 of the tile's 32
  // keys, P V over 64 of the 512 output columns. The main kernel's shared-memory layout but for a
  // second P buffer and alpha array (WideWarps) or a third stage and an mbarrier (PingPong).
  static_assert(kWideWarps == (wide_warps_kernel<QElement_, kFormat_, kHeadGroups_, kCopyStages_, kFp8RawTiles_>() &&
                               !kE4m3Pv_),
                "the kernel family follows from the configuration");
  static_assert(!kWideWarps || (kDirectCopy && !kRegisterP && !kQSplit && kStages == (kPingPong ? 3 : 2)));

  static_assert(kSmemBytes <= kSmemBudgetBytes,
                "a kernel instantiation exceeds the 101,376-byte shared-memory ceiling");
};

// fn(traits) for the traits of `variant` of the configuration Traits, or missing() where the
// configuration has no such variant.
template <typename Traits, typename Fn, typename Missing>
auto with_variant(FwdVariant variant, Fn&& fn, Missing&& missing) {
  switch (variant) {
    case FwdVariant::kMain:
      return fn(Traits{});
    case FwdVariant::kOneStage:
      if constexpr (Traits::kHasOneStageVariant) return fn(typename Traits::OneStage{});
      break;
    case FwdVariant::kDecodedFp8:
      if constexpr (Traits::kHasDecodedFp8Variant) return fn(typename Traits::DecodedFp8{});
      break;
    case FwdVariant::kPairedScores:
      if constexpr (Traits::kHasPairedScoresVariant) return fn(typename Traits::PairedScores{});
      break;
    case FwdVariant::kE4m3Pv:
      if constexpr (Traits::kHasE4m3PvVariant) return fn(typename Traits::E4m3Pv{});
      break;
  }
  return missing();
}

}  // namespace sparse_mla
