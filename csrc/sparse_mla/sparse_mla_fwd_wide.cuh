// The WideWarps kernel family: 16-bit caches with q in one MMA part, and raw fp8 tiles;
// blocks of 32 heads (kernel_traits.h kWideWarps). Same grid, gather, shared-memory layout, softmax and epilogue
// contract as the main kernel (sparse_mla_fwd_kernel.cuh); what differs is who computes what:
//   S = Q K^T   warp (dq = warp % 4, kh = warp / 4): both head groups x keys 16 kh .. 16 kh + 15
//               over quarter dq of D, Q of 32 heads in registers (each K fragment feeds 2 MMAs).
//   softmax     as in the main kernel, the 4 partial scores of a (head, key) from the 4 quarters.
//   O += P V    warp w: both head groups x output columns 64 w .. 64 w + 63 (each V fragment
//               feeds 2 MMAs), one tile late: beside the next tile's softmax.
// Per tile, each warp reads half the K and V fragment bytes of the main kernel's warps, for the
// same MMAs; the price is that the phases of a tile synchronise the whole block (two barriers).
// fp8 tiles stay raw in shared memory, as in the main kernel, and each fragment decoded there
// feeds two MMAs instead of one; fp8_ds_mla's P V warps scale their P fragments by their scale
// tile's key scales.
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

namespace sparse_mla {

template <typename Traits>
__device__ __forceinline__ void sparse_mla_fwd_wide_block(const SparseMlaFwdParams& p) {
  static_assert(Traits::kWideWarps);
  using Element = typename Traits::Element;
  using QElement = typename Traits::QElement;
  constexpr int kBlockH = Traits::kBlockH;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kPitch = Traits::kSmemPitch;
  constexpr int kSPitch = Traits::kSPitch;
  constexpr int kPPitch = Traits::kPPitch;
  constexpr int kSteps = Traits::kStepsPerWarp;  // a quarter of D
  constexpr int kLatentSteps = Traits::kLatentStepsPerWarp;
  constexpr int kQuarters = 4;
  constexpr int kMTiles = kBlockH / 16;
  constexpr int kDvPerWarp = kHeadSizeV / Traits::kNumWarps;
  constexpr int kLineChunks = 8;  // cp.async: 8 threads per row, whole 128-byte lines per warp
  constexpr bool kRaw = Traits::kRawFp8;  // fp8 (kernel_traits.h wide_warps_kernel)
  constexpr bool kDs = Traits::kDsMla;    // its records: latent, scales, bf16 rope
  static_assert(!kDs || (kRaw && std::is_same_v<Element, __half>), "fp8_ds_mla: raw tiles, fp16 P (hmul2)");
  // fp16 P: the FlashAttention-4 lazy rescale. A row's reference maximum moves only when a tile's
  // maximum passes it by more than kLazyLog2 (p <= 2^8), and O is rescaled only in the tiles where
  // some row's did (a warp vote), with fp8_ds_mla's norm kept within 2^3 of the tile's largest
  // scale. Under a lazy maximum the largest p, otherwise exactly 1, is rounded like the rest: bf16
  // P would spend up to 1.3e-3 of its 4e-3 bar (tools/lazy_rescale_rounding.py), and fp8_ds_mla
  // with fp16 out, whose P' is rounded twice already, ~3.4e-4 more of fp16's 1e-3 (emulated: 8.2e-4
  // at D = 576); those keep the exact maximum.
  constexpr bool kLazy = std::is_same_v<Element, __half> && !(kDs && std::is_same_v<QElement, __half>);
  constexpr float kLazyLog2 = 8.f;
  static_assert(kBlockH == 32 && kBlockN == 32 && Traits::kNumWarps == 8 && Traits::kNumThreads / kLineChunks == kBlockN &&
                Traits::kStatsArrays == 3);
  static_assert(Traits::kHeadGroups * Traits::kSBuffersPerGroup * Traits::kSmemSPartElems == kQuarters * kBlockH * kSPitch &&
                Traits::kHeadGroups * Traits::kPBuffers * Traits::kSmemPBufferElems == 2 * kBlockH * kPPitch,
                "the partial-score and P buffers, read as [quarter][head][key] and [buffer][head][key]");

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sKV = smem + Traits::kSmemKVOffset;                            // [stage][kBlockN][row bytes]
  float* sS = reinterpret_cast<float*>(smem + Traits::kSmemSOffset);      // [quarter][head][kSPitch]
  Element* sP = reinterpret_cast<Element*>(smem + Traits::kSmemPOffset);  // [buffer][head][kPPitch]
  float* sAlpha = reinterpret_cast<float*>(smem + Traits::kSmemStatsOffset);  // [buffer][head]
  float* sL = sAlpha + 2 * kBlockH;
  int* sValid = reinterpret_cast<int*>(smem + Traits::kSmemValidOffset);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int dq = warp % kQuarters;  // S: quarter of D
  const int kh = warp / kQuarters;  // S: half of the tile's keys
  const BlockWork work = block_work<kBlockH, kBlockN>(p);
  const int t = work.t, h0 = work.h0, split = work.split, topk_t = work.topk_t;
  const int tile_begin = work.tile_begin, num_tiles = work.num_tiles;

  // Gather: thread (g_row, g_sub) copies chunks g_sub, g_sub + 8, ... of row g_row of each tile
  // (cp_async_row). Indices are loaded a tile ahead and checked when used (as in the main kernel).
  const int g_row = tid / kLineChunks;
  const int g_sub = tid % kLineChunks;
  const int32_t* idx_ptr = p.indices + static_cast<int64_t>(t) * p.indices_stride_t;
  auto row_index = [&](int tile) -> int32_t {
    const int j = (tile_begin + tile) * kBlockN + g_row;
    return tile < num_tiles && j < topk_t ? __ldg(idx_ptr + j) : -1;
  };
  auto issue_row = [&](int32_t r, int stage) {
    gather_row<Traits, kLineChunks>(p, sKV, sValid, r, stage, g_row, g_sub);
  };
  // First column of k-step s of quarter dq: its latent steps, then its rope step (D = 576).
  auto step_col = [&](int s) {
    return s < kLatentSteps ? (dq * kLatentSteps + s) * 16
                            : kKvLoraRank + (dq * Traits::kRopeStepsPerWarp + s - kLatentSteps) * 16;
  };
  // Q of both head groups as m16n8k16 A fragments over this warp's k-steps. q goes through stage
  // 1, which tile 1 takes after: whole 128-byte lines per warp instead of each thread's 4-byte
  // loads of its fragments (72 at D = 576), whose issue was most of the prologue (bench/HISTORY.md
  // v36). Tile 0's gather is in flight meanwhile. Rows at the tiles' pitch: ldmatrix reads them
  // without bank conflicts.
  const int32_t first = row_index(0), second = row_index(1);
  // [head][kPitch], q as given (QElement), converted after the load where the cache's type
  // differs. Raw fp8 stages are half as large: q also takes the partial-score buffers after
  // stage 1, which the loop uses first.
  Element* sQ = reinterpret_cast<Element*>(sKV + Traits::kSmemKVStageBytes);
  static_assert(sizeof(QElement) == sizeof(Element), "q's rows at the pitch of a 16-bit tile");
  static_assert(Traits::kSmemKVOffset + 2 * Traits::kSmemKVStageBytes == Traits::kSmemSOffset &&
                    kBlockH * kPitch * sizeof(Element) <= Traits::kSmemPOffset - Traits::kSmemKVStageBytes &&
                    (kRaw || kBlockH * kPitch * sizeof(Element) <= Traits::kSmemKVStageBytes),
                "q of the block fits in stage 1 and the partial-score buffers");
  stage_q<Traits, Traits::kNumThreads>(p, reinterpret_cast<QElement*>(sQ), t, h0, tid);
  issue_row(first, 0);
  cp_async_wait<1>();  // q's group; tile 0's may still be in flight
  __syncthreads();
  uint32_t q_frag[kSteps][kMTiles][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      if constexpr (!kRaw) {
        ldmatrix_x4(q_frag[s][m], sQ + (m * 16 + lane % 16) * kPitch + step_col(s) + (lane / 16) * 8);
      } else {
        // q's A fragments take the raw tiles' column order (the S loop below), as in the main
        // kernel, but for fp8_ds_mla's bf16 rope, whose fragments are the usual ones.
        const bool permuted = !(kDs && s >= kLatentSteps);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          q_frag[s][m][i] = *reinterpret_cast<const uint32_t*>(
              sQ + (m * 16 + lane / 4 + (i & 1) * 8) * kPitch + step_col(s) + a_frag_col(lane, i, permuted));
      }
      if constexpr (!std::is_same_v<QElement, Element>) {  // bf16 q with an fp16 cache
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const QElement* v = reinterpret_cast<const QElement*>(&q_frag[s][m][i]);
          q_frag[s][m][i] = pack2<Element>(static_cast<float>(v[0]), static_cast<float>(v[1]));
        }
      }
    }
  }
  __syncthreads();  // every warp has its q: stage 1 is free for tile 1
  // fp8_e4m3: S and O carry the per-tensor scale, applied in fp32.
  float tensor_scale = 1.f;
  if constexpr (Traits::kFormat == KvFormat::kFp8E4m3) {
    if (p.k_scale != nullptr) tensor_scale = __ldg(p.k_scale);
  }
  const float score_scale = p.sm_scale_log2 * tensor_scale;
  issue_row(second, 1);
  int32_t next_row = row_index(2);  // the thread's row of the next tile to issue

  // P rows are 64 bytes, two to a 128-byte line; 16-byte chunk c of row h sits at chunk
  // c ^ ((h >> 1) & 3), so that the 8 rows an ldmatrix reads at one chunk hit 8 bank groups.
  static_assert(kPPitch * 2 == 64 && kBlockN / 8 == 4);
  auto p_chunk = [](int h, int c) { return c ^ ((h >> 1) & 3); };

  // Softmax role, as in the main kernel: 8 threads per head, 4 keys each.
  const int sm_h = tid / 8;
  const int sm_k = (tid % 8) * 4;
  float m_run = -INFINITY, l_run = 0.f;

  float acc_o[kMTiles][kDvPerWarp / 8][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < kDvPerWarp / 8; ++n) acc_o[m][n][0] = acc_o[m][n][1] = acc_o[m][n][2] = acc_o[m][n][3] = 0.f;
  }

  // P V of a tile runs one tile late, beside the next tile's softmax, whose chain of loads,
  // shuffles and exponentials would otherwise leave the MMA pipe idle. Its V (this warp's 64
  // columns x the 32 keys) waits in registers, so that the next gather may take its stage; its P
  // and alpha wait in the second of two buffers.
  // Raw fp8: 32 columns (bytes) per ldmatrix, decoded in pv().
  constexpr int kVCols = kRaw ? 32 : 16;
  uint32_t v_frag[kBlockN / 16][kDvPerWarp / kVCols][4];
  // Lazy fp8_e4m3 kernels: the pending tile's first 16 keys of V are decoded before the loop's
  // second barrier, which reads them (__syncthreads_or), so that ptxas cannot sink the decoding
  // below it and issues P V MMAs while the softmax's partial-score loads are in flight
  // (bench/HISTORY.md v47; fp8_ds_mla's kernels lost so).
  constexpr bool kPreDecode = kRaw && kLazy && !kDs;
  uint32_t v_dec[kDvPerWarp / kVCols][2][2][2];  // keys 0-15: [n2][c][odd][b0, b1] of pv()
  auto predecode = [&]() -> uint32_t {  // returns an OR of the decoded words, for the barrier
    uint32_t any = 0;
#pragma unroll
    for (int n2 = 0; n2 < kDvPerWarp / kVCols; ++n2) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int odd = 0; odd < 2; ++odd) {
          v_dec[n2][c][odd][0] = e4m3_trans_column_to_half2(v_frag[0][n2][2 * c], odd);
          v_dec[n2][c][odd][1] = e4m3_trans_column_to_half2(v_frag[0][n2][2 * c + 1], odd);
          any |= v_dec[n2][c][odd][0] | v_dec[n2][c][odd][1];
        }
      }
    }
    return any;
  };
  // Offset of this lane's ldmatrix address in a stage, in bytes (raw) or elements.
  const int v_key = (lane % 8) + ((lane >> 3) & 1) * 8;
  const int v_off = kRaw ? v_key * Traits::kSmemRowBytes + warp * kDvPerWarp + (lane >> 4) * 16
                         : v_key * kPitch + warp * kDvPerWarp + (lane >> 4) * 8;
  // fp8_ds_mla: the P V warps' scale tile (their 64 columns are half of one), and the pending
  // tile's scale of key `lane` in it, read with V since the next gather may take the stage.
  const int ds_tile = warp * kDvPerWarp / kDsMlaTile;
  float pv_key_scale = 0.f;
  auto load_v = [&](const uint8_t* sV_bytes) {
    const Element* sV = reinterpret_cast<const Element*>(sV_bytes);
    if constexpr (kDs) pv_key_scale = *reinterpret_cast<const float*>(sV_bytes + lane * Traits::kSmemRowBytes + kDsMlaScaleOffset + ds_tile * 4);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int n2 = 0; n2 < kDvPerWarp / kVCols; ++n2) {
        if constexpr (kRaw) ldmatrix_x4_trans(v_frag[kk][n2], sV_bytes + v_off + kk * 16 * Traits::kSmemRowBytes + n2 * kVCols);
        else ldmatrix_x4_trans(v_frag[kk][n2], sV + v_off + kk * 16 * kPitch + n2 * 16);
      }
    }
  };
  // The pending tile's P (A fragments) and alpha, read during the next tile's S: written before
  // that turn's first barrier, they are ready then, and the P V after the second barrier then
  // starts on registers while the softmax's loads are in flight.
  uint32_t p_frag[kBlockN / 16][kMTiles][4];
  float alpha_r[kMTiles][2];
  // fp8_ds_mla: P' = p * key scale / norm for this warp's scale tile (the main kernel's register
  // P), norm a power of two near the tile's largest such scale (lazy: within 2^3 of it); acc_o
  // holds O / ds_norm, the norm of the last tile it took.
  float ds_norm = 1.f;
  const Element* p_row = sP + (lane % 16) * kPPitch;  // + m * 16 rows: same swizzle
  auto load_p = [&](int buf) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      alpha_r[m][0] = sAlpha[buf * kBlockH + m * 16 + lane / 4];
      alpha_r[m][1] = sAlpha[buf * kBlockH + m * 16 + lane / 4 + 8];
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
        ldmatrix_x4(p_frag[kk][m], p_row + buf * (kBlockH * kPPitch) + m * 16 * kPPitch +
                                       p_chunk(lane % 16, 2 * kk + lane / 16) * 8);
    }
    if constexpr (kDs) {
      // The largest scale: non-negative floats order as their bits (one REDUX, not 5 shuffles).
      const float smax = __int_as_float(__reduce_max_sync(~0u, __float_as_int(pv_key_scale)));
      // Lazy: the norm stays while the tile's largest scale is within 2^3 of it (P' <= 2^8 x 2^3).
      const float norm =
          kLazy && smax >= ds_norm * 0.125f && smax < ds_norm * 8.f ? ds_norm : ds_scale_norm(smax);
      // O / norm = alpha (norm_prev / norm) O / norm_prev + P' V, exactly (powers of two).
      const float inv_norm = pow2_reciprocal(norm);
      const float ratio = ds_norm * inv_norm;
      ds_norm = norm;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        alpha_r[m][0] *= ratio;
        alpha_r[m][1] *= ratio;
      }
      // Fragment register i of p_frag[kk][m] holds keys 16 kk + 8 (i / 2) + 2 (lane % 4) + {0, 1}:
      // their scales / norm as an fp16 pair, from the even lane of the pair.
      const float s = pv_key_scale * inv_norm;
      const uint32_t pair = pack2<Element>(s, __shfl_down_sync(~0u, s, 1));
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t sc = __shfl_sync(~0u, pair, kk * 16 + h * 8 + (lane % 4) * 2);
#pragma unroll
          for (int m = 0; m < kMTiles; ++m) {
            p_frag[kk][m][2 * h] = hmul2(p_frag[kk][m][2 * h], sc);
            p_frag[kk][m][2 * h + 1] = hmul2(p_frag[kk][m][2 * h + 1], sc);
          }
        }
      }
    }
  };
  // O = alpha O + P V for both head groups x this warp's 64 columns, from p_frag, alpha_r, v_frag.
  auto pv = [&]() {
    auto rescale = [&]() {
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int n = 0; n < kDvPerWarp / 8; ++n) {
          acc_o[m][n][0] *= alpha_r[m][0];
          acc_o[m][n][1] *= alpha_r[m][0];
          acc_o[m][n][2] *= alpha_r[m][1];
          acc_o[m][n][3] *= alpha_r[m][1];
        }
      }
    };
    if constexpr (kLazy) {
      // A warp-uniform branch: the 64 multiplies are the loop's largest block without an MMA.
      bool keep = true;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) keep = keep && alpha_r[m][0] == 1.f && alpha_r[m][1] == 1.f;
      if (!__all_sync(~0u, keep)) rescale();
    } else {
      rescale();
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int n2 = 0; n2 < kDvPerWarp / kVCols; ++n2) {
        if constexpr (kRaw) {
          // As the main kernel's raw P V: matrices (keys 0-7, 8-15) x (bytes 0-15, 16-31),
          // transposed as b16; the even bytes are the B fragment of 16-column chunk c's even
          // columns, the odd bytes of its odd ones: acc_o[m][2 (2 n2 + c) + odd] (the epilogue's
          // order).
#pragma unroll
          for (int c = 0; c < 2; ++c) {
#pragma unroll
            for (int odd = 0; odd < 2; ++odd) {
              const bool pre = kPreDecode && kk == 0;
              const uint32_t b0 = pre ? v_dec[n2][c][odd][0] : e4m3_trans_column_to_half2(v_frag[kk][n2][2 * c], odd);
              const uint32_t b1 = pre ? v_dec[n2][c][odd][1] : e4m3_trans_column_to_half2(v_frag[kk][n2][2 * c + 1], odd);
#pragma unroll
              for (int m = 0; m < kMTiles; ++m) mma_16816<Element>(acc_o[m][2 * (2 * n2 + c) + odd], p_frag[kk][m], b0, b1);
            }
          }
        } else {
#pragma unroll
          for (int m = 0; m < kMTiles; ++m) {
            mma_16816<Element>(acc_o[m][2 * n2], p_frag[kk][m], v_frag[kk][n2][0], v_frag[kk][n2][1]);
            mma_16816<Element>(acc_o[m][2 * n2 + 1], p_frag[kk][m], v_frag[kk][n2][2], v_frag[kk][n2][3]);
          }
        }
      }
    }
  };
  // The first tile's late P V has no tile before it: P = 0 with V = 0 and alpha = 1 leave O at
  // zero, and spare the loop a branch.
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
    for (int n2 = 0; n2 < kDvPerWarp / kVCols; ++n2) v_frag[kk][n2][0] = v_frag[kk][n2][1] = v_frag[kk][n2][2] = v_frag[kk][n2][3] = 0u;
  }
  for (int i = tid; i < kBlockH * kPPitch / 2; i += Traits::kNumThreads) reinterpret_cast<uint32_t*>(sP + kBlockH * kPPitch)[i] = 0u;
  if (tid < kBlockH) sAlpha[kBlockH + tid] = 1.f;

  // S: partial scores of both head groups x this warp's 16 keys over quarter dq, for the tile
  // it in sK_bytes, into sS; the next tile's gather is issued halfway.
  auto scores = [&](const uint8_t* sK_bytes, int it) {
    const Element* sK = reinterpret_cast<const Element*>(sK_bytes);
    float acc_s[kMTiles][2][4] = {};
    const Element* k_base = sK + (kh * 16 + (lane % 8) + (lane / 16) * 8) * kPitch + ((lane / 8) & 1) * 8;
    // fp8_ds_mla: the latent part times the key's scale of tile dq (fp32), before the bf16 rope
    // step adds in at scale 1; this thread's keys are 16 kh + 8 nt + 2 (lane % 4) + e.
    auto scale_by_keys = [&]() {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = kh * 16 + nt * 8 + (lane % 4) * 2 + e;
          const float sc = *reinterpret_cast<const float*>(sK_bytes + key * Traits::kSmemRowBytes + kDsMlaScaleOffset + dq * 4);
#pragma unroll
          for (int m = 0; m < kMTiles; ++m) {
            acc_s[m][nt][e] *= sc;
            acc_s[m][nt][2 + e] *= sc;
          }
        }
      }
    };
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      // The next tile's gather is issued here, not at the loop top: ptxas cannot tell the stages
      // apart, so it keeps this tile's ldmatrix loads behind those cp.async writes, and ~115 issue
      // slots would precede the first S MMA.
      if (s == kSteps / 2 && it > 0 && it + 1 < num_tiles) {
        issue_row(next_row, (it + 1) % 2);  // into the stage of tile it - 1, whose V is in registers
        next_row = row_index(it + 2);
      }
      uint32_t b[4];  // keys 0-7 (b0, b1) and 8-15 (b2, b3) of the half
      if (kDs && s == kLatentSteps) {
        // fp8_ds_mla's rope step: bf16 at record byte kDsMlaRopeOffset + 2 (column - 512);
        // matrices (keys 0-7, 8-15) x (columns 0-7, 8-15), the usual B fragments, as fp16.
        scale_by_keys();
        uint32_t r[4];
        ldmatrix_x4(r, sK_bytes + (kh * 16 + (lane % 8) + ((lane >> 3) & 1) * 8) * Traits::kSmemRowBytes +
                           kDsMlaRopeOffset + (step_col(s) - kKvLoraRank) * 2 + (lane >> 4) * 16);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          b[2 * nt] = bf16x2_to_half2(r[nt]);
          b[2 * nt + 1] = bf16x2_to_half2(r[2 + nt]);
        }
      } else if constexpr (kRaw) {
        // The step's 16 bytes of the half's keys read as 8 b16: thread (n = lane / 4, j = lane
        // % 4) gets bytes 4j .. 4j + 3 of key 8 nt + n, q's permuted columns.
        uint32_t r[2];
        ldmatrix_x2(r, sK_bytes + (kh * 16 + lane % 16) * Traits::kSmemRowBytes + step_col(s));
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          b[2 * nt] = e4m3x2_to_half2(r[nt]);
          b[2 * nt + 1] = e4m3x2_hi_to_half2(r[nt]);
        }
      } else {
        ldmatrix_x4(b, k_base + step_col(s));
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) mma_16816<Element>(acc_s[m][nt], q_frag[s][m], b[2 * nt], b[2 * nt + 1]);
      }
    }
    if constexpr (kDs && kSteps == kLatentSteps) scale_by_keys();  // D = 512: no rope
    float* s_out = sS + dq * (kBlockH * kSPitch) + (lane / 4) * kSPitch + kh * 16 + (lane % 4) * 2;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        *reinterpret_cast<float2*>(s_out + m * 16 * kSPitch + nt * 8) = make_float2(acc_s[m][nt][0], acc_s[m][nt][1]);
        *reinterpret_cast<float2*>(s_out + (m * 16 + 8) * kSPitch + nt * 8) =
            make_float2(acc_s[m][nt][2], acc_s[m][nt][3]);
      }
    }
  };

  // Online softmax over the tile in `stage` (base 2, fp32): its P, rounded once to the MMA type
  // (fp8_ds_mla: and again after its scale in load_p), and alpha into buffer `stage`.
  auto softmax = [&](int stage) {
    const float* s_in = sS + sm_h * kSPitch + sm_k;
    // The shorter chain (sums from quarter 0, a tree maximum, the SFU's 2^x) gained 2-3 % at
    // D = 512; at D = 576 ptxas then ordered S and P V so that it lost 1.5 % (v35).
    constexpr bool kShortChain = Traits::kHeadDim == kHeadSizeNoPE;
    float x[4];
    const float tile_max = tile_scores<kQuarters, kBlockH * kSPitch, kBlockN, kShortChain>(
        s_in, sValid, stage, sm_k, kRaw ? score_scale : p.sm_scale_log2, x);
    auto exp2_chain = [](float v) { return kShortChain ? exp2_ftz(v) : exp2f(v); };
    const float m_new = !kLazy ? fmaxf(m_run, tile_max) : tile_max > m_run + kLazyLog2 ? tile_max : m_run;
    // Nothing valid so far (m_new = -inf): p = 0, state unchanged. Selects, not a branch, so that
    // ptxas may interleave this chain with the P V MMAs beside it.
    const bool any = m_new != -INFINITY;
    // Lazy kernels: alpha is exactly 1 where the maximum stays, whatever the SFU gives for 2^0,
    // for the vote in pv. The others never vote: 2^0 as the SFU gives it, 4 instructions fewer.
    const float alpha = any && (!kLazy || m_new != m_run) ? exp2_chain(m_run - m_new) : 1.f;
    float psum = 0.f;
    float pr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      pr[i] = any ? exp2_chain(x[i] - m_new) : 0.f;
      psum += pr[i];
    }
    l_run = l_run * alpha + psum;
    m_run = m_new;
    *reinterpret_cast<uint2*>(sP + stage * (kBlockH * kPPitch) + sm_h * kPPitch + p_chunk(sm_h, sm_k / 8) * 8 + sm_k % 8) =
        make_uint2(pack2<Element>(pr[0], pr[1]), pack2<Element>(pr[2], pr[3]));
    if ((tid % 8) == 0) sAlpha[stage * kBlockH + sm_h] = alpha;
  };

  // Per tile: barrier (tile landed; the stage of the tile before it, sS and the other P buffer
  // are free), the tile before's P and alpha into registers, S (the next tile's gather issued
  // halfway), barrier, this tile's softmax beside the tile before's P V, and this tile's V into
  // registers.
  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % 2;
    // Tile it is the latest group in flight (the first tile also waits for the second): a branch
    // here would make every warp wait for its V ldmatrix loads before the barrier.
    cp_async_wait<0>();
    __syncthreads();
    const uint8_t* sK_bytes = sKV + stage * Traits::kSmemKVStageBytes;
    load_p(stage ^ 1);
    scores(sK_bytes, it);
    if constexpr (kPreDecode) {
      __syncthreads_or(predecode() == 0u);  // the result is not needed, only the operand
    } else {
      __syncthreads();
    }
    pv();  // the tile before's P V, whose MMAs interleave with the softmax
    softmax(stage);
    load_v(sK_bytes);
  }
  if (num_tiles > 0) {
    __syncthreads();  // the last tile's P and alpha
    load_p((num_tiles - 1) % 2);
    if constexpr (kPreDecode) predecode();
    pv();
  }
  cp_async_wait<0>();  // nothing may be in flight when the block exits
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // see the main kernel
#endif

  // Epilogue (fwd_common.cuh): as the main kernel's; fp8_ds_mla's O times the warp's last norm.
  write_lse(p, sL, t, h0, split, tid, sm_h, m_run, l_run);
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m * 16 + lane / 4 + half * 8;
      const int h = h0 + r;
      if (h >= p.num_heads) continue;
      const float l = sL[r];
      const float inv = l > 0.f ? (kDs ? ds_norm : tensor_scale) / l : 0.f;
      write_o_row<QElement, kRaw>(p, t, h, split, warp * kDvPerWarp + (lane % 4) * (kRaw ? 4 : 2), half, acc_o[m], inv);
    }
  }
}

}  // namespace sparse_mla
