// The sparse-MLA forward kernel on the warp-level mma.sync path. 32-head blocks of 16-bit caches
// whose q enters the MMAs in one part run the WideWarps body instead (sparse_mla_fwd_wide.cuh),
// and those of raw fp8 tiles the PingPong body (sparse_mla_fwd_pingpong.cuh).
//
// Grid: x = token * head_blocks + head_block (blocks of one token are adjacent, so the KV rows
// they share are read from DRAM once and from L2 after), y = split of the top-k axis.
// Per KV tile of kBlockN gathered rows (see kernel_traits.h for the warp roles):
//   1. S = Q K^T      each warp: 16 heads x 32 rows over a quarter of D, Q from registers.
//   2. online softmax 8 threads per head sum the 4 partial scores of 4 rows (base 2, fp32;
//                     2 in the PairedScores variant, whose warps 2-3 add theirs into 0-1's);
//                     P is written for phase 3 (fp8_ds_mla: p in fp32, see kRegisterP).
//   3. O += P V       each warp: 16 heads x 128 columns, K-dim = 32 rows, V = the first 512
//                     columns of the same shared tile.
// A masked slot is zero-filled without a read and its score forced to -inf. fp8 tiles stay raw
// in shared memory and are decoded per MMA fragment in phases 1 and 3 (kernel_traits.h), but in
// the DecodedFp8 variant.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fwd_common.cuh"
#include "kernel_traits.h"
#include "kv_convert.cuh"
#include "mma_utils.cuh"
#include "params.h"
#include "sparse_mla_fwd_pingpong.cuh"
#include "sparse_mla_fwd_wide.cuh"

namespace sparse_mla {

// x0, x1 as MMA operand pairs: x ~= hi + lo with both in Element (lo only when kSplit).
template <typename Element, bool kSplit>
__device__ __forceinline__ void split2(uint32_t& hi, uint32_t& lo, float x0, float x1) {
  hi = pack2<Element>(x0, x1);
  if constexpr (kSplit) {
    const Element* he = reinterpret_cast<const Element*>(&hi);
    lo = pack2<Element>(x0 - static_cast<float>(he[0]), x1 - static_cast<float>(he[1]));
  }
}

// Barrier of the 4 warps of head group `grp` (named barrier 1 + grp; 0 is __syncthreads). The
// S -> softmax -> P V phases of a tile involve one head group only, so in a 32-head block the two
// groups drift apart within a tile and one's softmax overlaps the other's MMAs.
template <int kHeadGroups>
__device__ __forceinline__ void head_group_sync(int grp) {
  if constexpr (kHeadGroups == 1) {
    __syncthreads();
  } else {
    static_assert(kHeadGroups == 2);
    if (grp == 0) named_barrier_sync<1, 128>();  // constant ids: 3 barriers, not 16
    else named_barrier_sync<2, 128>();
  }
}

// The forward kernel's grid (the header's comment), for the launch and its host emulation.
template <typename Traits>
dim3 fwd_grid(const SparseMlaFwdParams& p) {
  const int head_blocks = (p.num_heads + Traits::kBlockH - 1) / Traits::kBlockH;
  return dim3(static_cast<unsigned>(p.num_tokens) * head_blocks, p.num_splits);
}

// kSmemBytes is a template argument so that the launch size is in the kernel's name in the
// binary: tools/check_resources.py reads it back with cuobjdump.
template <typename Traits, int kSmemBytes>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    sparse_mla_fwd_kernel(const SparseMlaFwdParams p) {
  static_assert(kSmemBytes == Traits::kSmemBytes);
  // One entry point for the launch and the build checks; each kernel family has its own body.
  if constexpr (Traits::kPingPong) {
    sparse_mla_fwd_pingpong_block<Traits>(p);
  } else if constexpr (Traits::kWideWarps) {
    sparse_mla_fwd_wide_block<Traits>(p);
  } else {  // the main kernel (the header's comment)
    using Element = typename Traits::Element;
    using QElement = typename Traits::QElement;
    constexpr int kBlockH = Traits::kBlockH;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kPitch = Traits::kSmemPitch;
    constexpr int kTpr = Traits::kThreadsPerRow;
    constexpr int kLineChunks = 8;  // 16-byte chunks per 128-byte cache line
    constexpr int kStages = Traits::kStages;
    constexpr int kQParts = Traits::kQParts;
    constexpr int kSteps = Traits::kStepsPerWarp;
    constexpr int kLatentSteps = Traits::kLatentStepsPerWarp;
    constexpr int kWpg = Traits::kWarpsPerGroup;
    constexpr int kSBuf = Traits::kSBuffersPerGroup;

    extern __shared__ __align__(128) uint8_t smem[];
    Element* sKV = reinterpret_cast<Element*>(smem + Traits::kSmemKVOffset);  // 16-bit or decoded fp8 tiles
    uint8_t* sKV_raw = smem + Traits::kSmemKVOffset;  // [stage][kBlockN][kSmemRowBytes], any format
    float* sS = reinterpret_cast<float*>(smem + Traits::kSmemSOffset);      // [g][buffer][16][pitch]
    Element* sP = reinterpret_cast<Element*>(smem + Traits::kSmemPOffset);  // [g][buffer][16][pitch]
    float* sAlpha = reinterpret_cast<float*>(smem + Traits::kSmemStatsOffset);
    float* sL = sAlpha + kBlockH;
    int* sValid = reinterpret_cast<int*>(smem + Traits::kSmemValidOffset);
    float* sScale = reinterpret_cast<float*>(smem + Traits::kSmemScaleOffset);  // [stage][kBlockN][4]

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int grp = warp / kWpg;  // head group of this warp
    const int wq = warp % kWpg;   // its quarter of D (S) and of the 512 output columns (O)
    const BlockWork work = block_work<kBlockH, kBlockN>(p);
    const int t = work.t, h0 = work.h0, split = work.split, topk_t = work.topk_t;
    const int tile_begin = work.tile_begin, num_tiles = work.num_tiles;

    // Gather role: thread (row, sub) moves chunks sub, sub + kGatherTpr, ... of rows row,
    // row + kGatherRowStride, ... (kGatherRows of them) of each tile. With cp.async, 8 threads
    // share a row, so that one warp instruction copies whole 128-byte lines of 4 rows instead of
    // half lines of 8: half as many L2 line requests, which bound the gather (bench/HISTORY.md).
    // The fp8 register path keeps kThreadsPerRow threads per row.
    constexpr int kGatherTpr = Traits::kDirectCopy ? kLineChunks : kTpr;
    constexpr int kGatherRowStride = Traits::kNumThreads / kGatherTpr;
    constexpr int kGatherRows = kBlockN / kGatherRowStride;
    static_assert(kGatherRows * kGatherRowStride == kBlockN && (Traits::kDirectCopy || kGatherRows == 1));
    const int g_row = tid / kGatherTpr;
    const int g_sub = tid % kGatherTpr;
    const int32_t* idx_ptr = p.indices + static_cast<int64_t>(t) * p.indices_stride_t;
    // The thread's row i of `tile` as stored (-1 past topk_t). Indices are prefetched one tile
    // ahead and checked only when used (valid_kv_row): checked at once, every warp stalled on the
    // index load right after issuing a tile (ncu: 12-21 % of all stall samples on that compare).
    auto row_index = [&](int tile, int i) -> int32_t {
      const int j = (tile_begin + tile) * kBlockN + g_row + i * kGatherRowStride;
      return j < topk_t ? __ldg(idx_ptr + j) : -1;
    };
    // Whether k-step s reads raw fp8 bytes (raw fp8_ds_mla tiles keep their rope in bf16).
    auto raw_fp8_step = [&](int s) { return Traits::kRawFp8 && !(Traits::kDsMla && s >= kLatentSteps); };

    // fp8 register path: the tile in flight. Issued first so its latency overlaps the Q loads.
    using Loader = std::conditional_t<Traits::kDirectCopy, int, Fp8RowLoader<Traits>>;
    Loader loader;
    auto load_rows = [&](int tile, int32_t(&rows)[kGatherRows]) {
#pragma unroll
      for (int i = 0; i < kGatherRows; ++i) rows[i] = tile < num_tiles ? row_index(tile, i) : -1;
    };
    int32_t next_row[kGatherRows];  // the thread's rows of the next tile to issue
    load_rows(0, next_row);
    // Issue the gather of `tile` (rows `rows`) into `stage` (cp.async) or into registers.
    auto issue_rows = [&](const int32_t(&rows)[kGatherRows], int tile, int stage) {
#pragma unroll
      for (int i = 0; i < kGatherRows; ++i) {
        const int32_t r = rows[i];
        const bool valid = tile < num_tiles && valid_kv_row(p, r);
        const uint8_t* row = p.kv + (valid ? static_cast<int64_t>(r) : 0) * p.kv_row_stride;
        if constexpr (Traits::kDirectCopy) {
          const int row_in_tile = g_row + i * kGatherRowStride;
          uint8_t* dst = sKV_raw + stage * Traits::kSmemKVStageBytes + row_in_tile * Traits::kSmemRowBytes;
          constexpr int kRowChunks = Traits::kGatherRowBytes / 16;
          if constexpr (!Traits::kRawFp8) {
            cp_async_row<Traits::kGatherRowBytes, kGatherTpr>(dst + g_sub * 16, row + g_sub * 16, valid);
          } else {  // fp8 rows keep the loop: one address per row lost on them (bench/HISTORY.md v26)
#pragma unroll
            for (int c = g_sub; c < kRowChunks; c += kGatherTpr) cp_async_16(dst + c * 16, row + c * 16, valid);
          }
          if (g_sub == 0) sValid[stage * kBlockN + row_in_tile] = valid;
        } else {
          loader.load(row, valid, g_sub);
        }
      }
    };
    // ... from next_row, which then takes the rows of tile + 1. The gathers go first, the next
    // tile's index loads after them (the other order was slower: bench/HISTORY.md v10).
    auto issue_tile = [&](int tile, int stage) {
      issue_rows(next_row, tile, stage);
      load_rows(tile + 1, next_row);
    };
    auto store_tile = [&](int stage) {  // fp8 register path: decode the tile held in registers
      if constexpr (!Traits::kDirectCopy) {
        loader.store(sKV + stage * (kBlockN * kPitch) + g_row * kPitch, sScale + (stage * kBlockN + g_row) * 4, g_sub);
        if (g_sub == 0) sValid[stage * kBlockN + g_row] = loader.valid;
      }
    };
    if constexpr (Traits::kDirectCopy && kStages == 2) {
      // Both tiles' indices are loaded before either tile is issued: one index latency, not two.
      int32_t second_row[kGatherRows];
      load_rows(1, second_row);
      issue_rows(next_row, 0, 0);
      cp_async_commit();
      issue_rows(second_row, 1, 1);
      cp_async_commit();
      load_rows(2, next_row);
    } else {
      issue_tile(0, 0);
      if constexpr (Traits::kDirectCopy) cp_async_commit();
    }

    // Q as m16n8k16 A fragments of this warp's 16 heads and k-steps, in registers for the whole
    // kernel: (a0, a1, a2, a3) = rows (r, r + 8), r = lane / 4, x the column pairs of a_frag_col
    // (permuted for raw fp8 tiles). Heads past num_heads are zeros.
    uint32_t q_frag[kSteps][kQParts][4];
    {
      const QElement* qn[2];
      const QElement* qp[2];
      bool ok[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int h = h0 + grp * 16 + lane / 4 + rr * 8;
        ok[rr] = h < p.num_heads;
        const int64_t hh = ok[rr] ? h : 0;
        qn[rr] = static_cast<const QElement*>(p.q_nope) + t * p.q_nope_stride_t + hh * p.q_nope_stride_h;
        qp[rr] = p.q_pe == nullptr ? qn[rr]
                 : static_cast<const QElement*>(p.q_pe) + t * p.q_pe_stride_t + hh * p.q_pe_stride_h;
      }
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int rr = i & 1;
          const int c = step_col<Traits>(wq, s) + a_frag_col(lane, i, raw_fp8_step(s));
          const QElement* src = c < p.q_nope_dim ? qn[rr] + c : qp[rr] + (c - p.q_nope_dim);
          const uint32_t raw = ok[rr] ? __ldg(reinterpret_cast<const uint32_t*>(src)) : 0u;
          // bf16 -> fp16, fp16 -> bf16 hi + lo, and the same type through fp32 too (exact): an
          // unconverted load result would be first read by the tile loop's first MMA, which ptxas
          // then kept waiting, in every tile, on the scoreboard the loop's index loads reuse
          // (bench/HISTORY.md v26).
          const QElement* v = reinterpret_cast<const QElement*>(&raw);
          split2<Element, Traits::kQSplit>(q_frag[s][0][i], q_frag[s][kQParts - 1][i], static_cast<float>(v[0]),
                                           static_cast<float>(v[1]));
        }
      }
    }

    // fp8_e4m3: S and O carry the per-tensor scale, applied in fp32.
    float tensor_scale = 1.f;
    if constexpr (Traits::kFormat == KvFormat::kFp8E4m3) {
      if (p.k_scale != nullptr) tensor_scale = __ldg(p.k_scale);
    }
    const float score_scale = p.sm_scale_log2 * tensor_scale;

    if constexpr (!Traits::kDirectCopy) {
      store_tile(0);
      issue_tile(1, 0);
    }

    // Softmax role: thread owns head tid / 8 and 4 scores of each tile; keeps the running max (m,
    // base-2 scaled, shared by the head's 8 threads) and its share of the sum (l) in registers.
    const int sm_h = tid / 8;  // 0 .. kBlockH - 1
    const int sm_g = sm_h / 16;
    const int sm_k = (tid % 8) * 4;
    float m_run = -INFINITY, l_run = 0.f;

    // fp8_ds_mla: the power-of-two norm of this warp's P copy for the current tile, and the
    // previous tile's, by which acc_o is still divided (folded into the next rescale).
    float ds_norm = 1.f, ds_norm_prev = 1.f;

    float acc_o[Traits::kDvPerWarp / 8][4];
#pragma unroll
    for (int n = 0; n < Traits::kDvPerWarp / 8; ++n) acc_o[n][0] = acc_o[n][1] = acc_o[n][2] = acc_o[n][3] = 0.f;

    // 1. Partial S = Q K^T over this warp's k-steps, all 32 rows of the tile at sK / sK_bytes
    //    (decoded fp8_ds_mla scales at sScaleK). fp8_ds_mla: the latent part is scaled per row by
    //    scale tile wq in fp32; the bf16 rope part has scale 1. Those scales of keys
    //    8 nt + 2 (lane % 4) + e go to key_scale, for this warp's P (phase 3).
    auto scores = [&](const Element* sK, const uint8_t* sK_bytes, const float* sScaleK, float (&key_scale)[4][2]) {
      // fp8_ds_mla: the scale of `key`'s scale tile wq (this warp's latent columns), from the raw
      // record or from the decoded tile's scale buffer.
      auto tile_scale = [&](int key) {
        if constexpr (Traits::kRawFp8) {
          return *reinterpret_cast<const float*>(sK_bytes + key * Traits::kSmemRowBytes + kDsMlaScaleOffset + wq * 4);
        } else {
          return sScaleK[key * 4 + wq];
        }
      };
      float acc_s[4][4] = {};
      float acc_rope[4][4] = {};
      const Element* k_base = sK + ((lane % 8) + (lane / 16) * 8) * kPitch + ((lane / 8) & 1) * 8;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        if (raw_fp8_step(s)) {
          // Matrix nt = keys 8 nt.., the step's 16 bytes read as 8 b16: thread (n = lane / 4,
          // j = lane % 4) gets bytes 4j .. 4j + 3 of key 8 nt + n, k-steps (2j, 2j + 1) and
          // (2j + 8, 2j + 9) in Q's permuted order.
          static_assert(kBlockN == 32, "lane l addresses key l of the tile");
          uint32_t r[4];
          ldmatrix_x4(r, sK_bytes + lane * Traits::kSmemRowBytes + step_col<Traits>(wq, s));
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int part = 0; part < kQParts; ++part)
              mma_16816<Element>(acc_s[nt], q_frag[s][part], e4m3x2_to_half2(r[nt]), e4m3x2_hi_to_half2(r[nt]));
          }
          continue;
        }
        if constexpr (Traits::kRawFp8 && Traits::kDsMla) {
          // Raw fp8_ds_mla rope step: bf16 at record byte kDsMlaRopeOffset + 2 (column - 512).
          // Matrix nt = keys 8 nt.., 8 columns: thread (n, j) gets columns 2j, 2j + 1 of key
          // 8 nt + n, a B fragment in the usual order (Q's rope is not permuted), as fp16.
          static_assert(kQParts == 1, "fp8 caches run fp16 MMAs: Q in one part");
          uint32_t lo[4], hi[4];
          const uint8_t* rope = sK_bytes + lane * Traits::kSmemRowBytes + kDsMlaRopeOffset +
                                 (step_col<Traits>(wq, s) - kKvLoraRank) * 2;
          ldmatrix_x4(lo, rope);
          ldmatrix_x4(hi, rope + 16);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            mma_16816<Element>(acc_rope[nt], q_frag[s][0], bf16x2_to_half2(lo[nt]), bf16x2_to_half2(hi[nt]));
          continue;
        }
        uint32_t b[2][4];
        ldmatrix_x4(b[0], k_base + step_col<Traits>(wq, s));
        ldmatrix_x4(b[1], k_base + 16 * kPitch + step_col<Traits>(wq, s));
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          float(&acc)[4] = (Traits::kDsMla && s >= kLatentSteps) ? acc_rope[nt] : acc_s[nt];
#pragma unroll
          for (int part = 0; part < kQParts; ++part)
            mma_16816<Element>(acc, q_frag[s][part], b[nt / 2][(nt % 2) * 2], b[nt / 2][(nt % 2) * 2 + 1]);
        }
      }
      // Partial-score buffer of warp wq (kPairedScores: of warps wq and wq + 2).
      float* s_out = sS + (Traits::kPairedScores ? grp * kSBuf + wq % kSBuf : warp) * Traits::kSmemSPartElems +
                     (lane / 4) * Traits::kSPitch + (lane % 4) * 2;
      const bool adds_to_pair = Traits::kPairedScores && wq >= kSBuf;
      if constexpr (Traits::kDsMla) {
        // The norm of this warp's P (see kernel_traits.h) for the tile: lane r holds row r's
        // scale of tile wq.
        float smax = tile_scale(lane);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) smax = fmaxf(smax, __shfl_xor_sync(~0u, smax, o));
        ds_norm_prev = ds_norm;
        ds_norm = ds_scale_norm(smax);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        if constexpr (Traits::kDsMla) {
          const int key = nt * 8 + (lane % 4) * 2;
          const float sc0 = tile_scale(key), sc1 = tile_scale(key + 1);
          key_scale[nt][0] = sc0;
          key_scale[nt][1] = sc1;
          acc_s[nt][0] = sc0 * acc_s[nt][0] + acc_rope[nt][0];
          acc_s[nt][1] = sc1 * acc_s[nt][1] + acc_rope[nt][1];
          acc_s[nt][2] = sc0 * acc_s[nt][2] + acc_rope[nt][2];
          acc_s[nt][3] = sc1 * acc_s[nt][3] + acc_rope[nt][3];
        }
        if (!adds_to_pair) {
          *reinterpret_cast<float2*>(s_out + nt * 8) = make_float2(acc_s[nt][0], acc_s[nt][1]);
          *reinterpret_cast<float2*>(s_out + 8 * Traits::kSPitch + nt * 8) = make_float2(acc_s[nt][2], acc_s[nt][3]);
        }
      }
      if constexpr (Traits::kPairedScores) {
        head_group_sync<Traits::kHeadGroups>(grp);  // warps 0 and 1's partial scores written
        if (adds_to_pair) {
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              float2* s_pair = reinterpret_cast<float2*>(s_out + hf * 8 * Traits::kSPitch + nt * 8);
              const float2 v = *s_pair;
              *s_pair = make_float2(v.x + acc_s[nt][2 * hf], v.y + acc_s[nt][2 * hf + 1]);
            }
          }
        }
      }
    };

    // 2. Online softmax over the tile in `stage`.
    auto softmax = [&](int stage) {
      float* s_in = sS + (sm_g * kSBuf) * Traits::kSmemSPartElems + (sm_h % 16) * Traits::kSPitch + sm_k;
      float x[4];
      const float tile_max = tile_scores<kSBuf, Traits::kSmemSPartElems, kBlockN, false, false>(s_in, sValid, stage, sm_k,
                                                                                            score_scale, m_run, x);
      const float m_new = fmaxf(m_run, tile_max);
      float alpha = 1.f, psum = 0.f;
      float pr[4] = {0.f, 0.f, 0.f, 0.f};
      if (m_new != -INFINITY) {  // else nothing valid so far: p = 0, state unchanged
        alpha = exp2f(m_run - m_new);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pr[i] = exp2f(x[i] - m_new);
          psum += pr[i];
        }
      }
      l_run = l_run * alpha + psum;  // this thread's 4 columns; summed over the 8 at the end
      m_run = m_new;
      if constexpr (Traits::kRegisterP) {
        // fp32 p in place of partial score 0, which only this thread reads; each warp builds its
        // own P from it (phase 3).
        *reinterpret_cast<float4*>(s_in) = make_float4(pr[0], pr[1], pr[2], pr[3]);
      } else {
        // P rounded once to the MMA type.
        Element* p_row = sP + sm_g * Traits::kPBuffers * Traits::kSmemPBufferElems + (sm_h % 16) * Traits::kPPitch + sm_k;
        *reinterpret_cast<uint2*>(p_row) = make_uint2(pack2<Element>(pr[0], pr[1]), pack2<Element>(pr[2], pr[3]));
      }
      if ((tid % 8) == 0) sAlpha[sm_h] = alpha;
    };

    // 3. O = alpha * O + P V for this warp's 128 columns, from the tile at sK / sK_bytes.
    auto pv = [&](const Element* sK, const uint8_t* sK_bytes, const float (&key_scale)[4][2]) {
      float alpha0 = sAlpha[grp * 16 + lane / 4];
      float alpha1 = sAlpha[grp * 16 + lane / 4 + 8];
      if constexpr (Traits::kDsMla) {
        // acc_o holds O / norm of the last tile: O / norm = alpha * (norm_prev / norm) * acc_o
        // + P' V, exactly (powers of two); the epilogue multiplies the last norm back. The
        // ratio stays finite while consecutive tiles' largest scales are < 2^128 apart (cache
        // values of |x| < 2^60 and > 2^-60, or zero, always are).
        const float ratio = ds_norm_prev * pow2_reciprocal(ds_norm);
        alpha0 *= ratio;
        alpha1 *= ratio;
      }
#pragma unroll
      for (int n = 0; n < Traits::kDvPerWarp / 8; ++n) {
        acc_o[n][0] *= alpha0;
        acc_o[n][1] *= alpha0;
        acc_o[n][2] *= alpha1;
        acc_o[n][3] *= alpha1;
      }
      if constexpr (Traits::kE4m3Pv) {
        // P' as e4m3 hi + lo in the m16n8k32 A layout: (a0, a1, a2, a3) = rows (r, r + 8) x
        // keys (2j, 2j + 1, 8 + 2j, 9 + 2j), and those + 16 (k 4j .. 4j + 3 and + 16), which are
        // this thread's keys of key_scale. V: lane l addresses key l of a 16-byte column chunk;
        // ldmatrix.trans gives keys (2j, 2j + 1) of each 8-key matrix, 2 bytes each, so the even
        // bytes of matrices 0-1 (2-3) are b0 (b1) of the chunk's even columns in the same key
        // order, the odd bytes of its odd columns: acc_o[2 chunk + odd], the raw tiles' order.
        const float* p_in = sS + (grp * kSBuf) * Traits::kSmemSPartElems + (lane / 4) * Traits::kSPitch + (lane % 4) * 2;
        const float p_scale = pow2_reciprocal(ds_norm) * Traits::kE4m3PScale;
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int rr = i & 1, nt = (i >> 1) * 2;  // row half, first key group
          const float2 p0 = *reinterpret_cast<const float2*>(p_in + rr * 8 * Traits::kSPitch + nt * 8);
          const float2 p1 = *reinterpret_cast<const float2*>(p_in + rr * 8 * Traits::kSPitch + (nt + 1) * 8);
          e4m3x4_hi_lo(p0.x * (key_scale[nt][0] * p_scale), p0.y * (key_scale[nt][1] * p_scale),
                       p1.x * (key_scale[nt + 1][0] * p_scale), p1.y * (key_scale[nt + 1][1] * p_scale), a_hi[i], a_lo[i]);
        }
        const uint8_t* v_base = sK_bytes + lane * Traits::kSmemRowBytes + wq * Traits::kDvPerWarp;
#pragma unroll
        for (int c = 0; c < Traits::kDvPerWarp / 16; ++c) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, v_base + c * 16);
#pragma unroll
          for (int odd = 0; odd < 2; ++odd) {
            // Into a zeroed tile first, then added in fp32: the e4m3 MMA of sm_89 (and maybe
            // others) may keep fewer mantissa bits of its C input than fp32, which over every tile
            // of acc_o would add up.
            const uint32_t select = odd ? 0x7531u : 0x6420u;
            const uint32_t b0 = __byte_perm(r[0], r[1], select), b1 = __byte_perm(r[2], r[3], select);
            float t[4] = {0.f, 0.f, 0.f, 0.f};
            mma_16832_e4m3(t, a_hi, b0, b1);
            mma_16832_e4m3(t, a_lo, b0, b1);
#pragma unroll
            for (int i = 0; i < 4; ++i) acc_o[2 * c + odd][i] += t[i];
          }
        }
      } else {
        const Element* p_base = sP + (grp * Traits::kPBuffers) * Traits::kSmemPBufferElems +
                                (lane % 16) * Traits::kPPitch + (lane / 16) * 8;
        uint32_t p_frag[kBlockN / 16][4];
        if constexpr (Traits::kRegisterP) {
          // This warp's P = p * (its column tile's key scales) / norm, built as the A fragments of
          // P V's k-steps (FlashAttention-2): (a0, a1, a2, a3) = rows (r, r + 8) x keys (2j, 2j + 8)
          // of k-step kk, r = lane / 4, j = lane % 4, which are the keys of key_scale.
          const float* p_in =
              sS + (grp * kSBuf) * Traits::kSmemSPartElems + (lane / 4) * Traits::kSPitch + (lane % 4) * 2;
          const float inv_norm = pow2_reciprocal(ds_norm);
#pragma unroll
          for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int nt = 2 * kk + (i >> 1), hf = i & 1;
              const float2 pv = *reinterpret_cast<const float2*>(p_in + hf * 8 * Traits::kSPitch + nt * 8);
              p_frag[kk][i] =
                  pack2<Element>(pv.x * (key_scale[nt][0] * inv_norm), pv.y * (key_scale[nt][1] * inv_norm));
            }
          }
        }
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          uint32_t a[4];
          if constexpr (Traits::kRegisterP) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = p_frag[kk][i];
          } else {
            ldmatrix_x4(a, p_base + kk * 16);
          }
          const int v_row = kk * 16 + (lane % 8) + ((lane >> 3) & 1) * 8;
          if constexpr (Traits::kRawFp8) {
            // Matrices (keys 0-7, 8-15) x (bytes 0-15, 16-31) of each 32 columns, transposed as b16:
            // thread (n = lane / 4, j = lane % 4) gets bytes 2n, 2n + 1 of keys 2j and 2j + 1 (of
            // 8 more). Its even bytes are the B fragment of n-tile "even columns", the odd ones of
            // "odd columns": acc_o[2 b + odd] holds columns 16 b + 2 n' + odd (the epilogue's order).
            const uint8_t* v_base =
                sK_bytes + v_row * Traits::kSmemRowBytes + wq * Traits::kDvPerWarp + (lane >> 4) * 16;
#pragma unroll
            for (int n4 = 0; n4 < Traits::kDvPerWarp / 32; ++n4) {
              uint32_t r[4];
              ldmatrix_x4_trans(r, v_base + n4 * 32);
#pragma unroll
              for (int c = 0; c < 2; ++c) {
#pragma unroll
                for (int odd = 0; odd < 2; ++odd) {
                  const uint32_t b0 = e4m3_trans_column_to_half2(r[2 * c], odd);
                  const uint32_t b1 = e4m3_trans_column_to_half2(r[2 * c + 1], odd);
                  mma_16816<Element>(acc_o[2 * (2 * n4 + c) + odd], a, b0, b1);
                }
              }
            }
          } else {
            const Element* v_base = sK + v_row * kPitch + wq * Traits::kDvPerWarp + (lane >> 4) * 8;
#pragma unroll
            for (int n2 = 0; n2 < Traits::kDvPerWarp / 16; ++n2) {
              uint32_t b[4];
              ldmatrix_x4_trans(b, v_base + n2 * 16);
              mma_16816<Element>(acc_o[2 * n2], a, b[0], b[1]);
              mma_16816<Element>(acc_o[2 * n2 + 1], a, b[2], b[3]);
            }
          }
        }
      }
    };

    // Per tile: barrier (tile landed; every warp is past the previous tile, so its stage, sS and
    // sP are free), S, barrier (PairedScores: two, the pairs' sums between), softmax, barrier,
    // P V. With two stages one tile is in flight while one is computed; with one (fp8 register
    // path: the next tile waits in registers; 16-bit: the one-stage variant) the stage is refilled
    // behind one more barrier.
    for (int it = 0; it < num_tiles; ++it) {
      const int stage = it % kStages;
      if constexpr (Traits::kDirectCopy) {
        if (kStages == 2 && it == 0) cp_async_wait<1>();  // the prologue issued tiles 0 and 1
        else cp_async_wait<0>();
      } else if (kStages == 1 && it > 0) {
        __syncthreads();  // stage 0 is free
        store_tile(0);
        issue_tile(it + 1, 0);
      }
      __syncthreads();
      if constexpr (Traits::kDirectCopy && kStages == 2) {
        if (it > 0 && it + 1 < num_tiles) {  // into the stage of tile it - 1
          issue_tile(it + 1, (it + 1) % kStages);
          cp_async_commit();
        }
      }
      const Element* sK = sKV + stage * (kBlockN * kPitch);
      const uint8_t* sK_bytes = sKV_raw + stage * Traits::kSmemKVStageBytes;  // raw fp8 tiles
      const float* sScaleK = sScale + stage * (kBlockN * 4);
      float key_scale[4][2];
      scores(sK, sK_bytes, sScaleK, key_scale);
      head_group_sync<Traits::kHeadGroups>(grp);
      softmax(stage);
      head_group_sync<Traits::kHeadGroups>(grp);
      pv(sK, sK_bytes, key_scale);
      if constexpr (Traits::kDirectCopy && kStages == 1) {
        // One cp.async stage: tile it + 1 is gathered once every warp is done with tile it.
        if (it + 1 < num_tiles) {
          __syncthreads();
          issue_tile(it + 1, 0);
          cp_async_commit();
        }
      } else if constexpr (!Traits::kDirectCopy && kStages == 2) {
        // fp8 register path, two stages: tile it + 1 (loaded a tile ago) into the stage of tile
        // it - 1, which every warp left before this tile's first barrier; the next one publishes it.
        if (it + 1 < num_tiles) {
          store_tile((it + 1) % kStages);
          issue_tile(it + 2, 0);
        }
      }
    }
    cp_async_wait<0>();  // nothing may be in flight when the block exits
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Lets the combine pass (a programmatic dependent, see launch_template.cuh) be scheduled as
    // the blocks of this grid reach their epilogue; it still waits for this grid's completion.
    // (Triggered at the start it slowed short launches: bench/HISTORY.md v10.)
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif

    // Epilogue (fwd_common.cuh): normalise and write out / lse, or the split's partial result.
    write_lse(p, sL, t, h0, split, tid, sm_h, m_run, l_run);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = grp * 16 + lane / 4 + half * 8;
      const int h = h0 + r;
      if (h >= p.num_heads) continue;
      const float l = sL[r];
      const float inv = l > 0.f ? tensor_scale * ds_norm / (Traits::kE4m3Pv ? l * Traits::kE4m3PScale : l) : 0.f;
      write_o_row<QElement, Traits::kRawFp8>(p, t, h, split, wq * Traits::kDvPerWarp + (lane % 4) * (Traits::kRawFp8 ? 4 : 2),
                                             half, acc_o, inv);
    }
  }
}

}  // namespace sparse_mla
