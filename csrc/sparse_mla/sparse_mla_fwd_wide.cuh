// The WideWarps kernel body: 32-head blocks of 16-bit caches with q in one MMA part
// (kernel_traits.h kWideWarps; the family's fp8 blocks run sparse_mla_fwd_pingpong.cuh). Same
// grid, gather, shared-memory layout, softmax and epilogue contract as the main kernel
// (sparse_mla_fwd_kernel.cuh); what differs is who computes what:
//   S = Q K^T   warp (dq = warp % 4, kh = warp / 4): both head groups x keys 16 kh .. 16 kh + 15
//               over quarter dq of D, Q of 32 heads in registers (each K fragment feeds 2 MMAs).
//   softmax     as in the main kernel, the 4 partial scores of a (head, key) from the 4 quarters.
//   O += P V    warp w: both head groups x output columns 64 w .. 64 w + 63 (each V fragment
//               feeds 2 MMAs), one tile late: beside the next tile's softmax.
// Per tile, each warp reads half the K and V fragment bytes of the main kernel's warps, for the
// same MMAs; the price is that the phases of a tile synchronise the whole block (two barriers).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fwd_common.cuh"
#include "kernel_traits.h"
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
  constexpr int kQuarters = 4;
  constexpr int kMTiles = kBlockH / 16;
  constexpr int kDvPerWarp = kHeadSizeV / Traits::kNumWarps;
  constexpr int kLineChunks = 8;  // cp.async: 8 threads per row, whole 128-byte lines per warp
  static_assert(!Traits::kRawFp8 && !Traits::kPingPong, "16-bit tiles");
  // fp16 P: the FlashAttention-4 lazy rescale. A row's reference maximum moves only when a tile's
  // maximum passes it by more than 8 (base 2, so p <= 2^8; online_softmax_step), and O is
  // rescaled only in the tiles where some row's did (a warp vote). Under a lazy maximum the
  // largest p, otherwise exactly 1, is rounded like the rest: bf16 P would spend up to 1.3e-3 of
  // its 4e-3 bar (tools/lazy_rescale_rounding.py), so it keeps the exact maximum.
  constexpr bool kLazy = std::is_same_v<Element, __half>;
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

  // Gather by every thread: thread (g_row, g_sub) copies chunks g_sub, g_sub + 8, ... of row g_row.
  const int g_row = tid / kLineChunks;
  const int g_sub = tid % kLineChunks;
  const TileGather<Traits, kLineChunks> gather{
      p, sKV, sValid, p.indices + static_cast<int64_t>(t) * p.indices_stride_t, tile_begin, num_tiles, topk_t,
      g_row, g_sub};
  // Q of both head groups as m16n8k16 A fragments over this warp's k-steps. q goes through stage
  // 1, which tile 1 takes after: whole 128-byte lines per warp instead of each thread's 4-byte
  // loads of its fragments (72 at D = 576), whose issue was most of the prologue (bench/HISTORY.md
  // v36). Tile 0's gather is in flight meanwhile. Rows at the tiles' pitch: ldmatrix reads them
  // without bank conflicts.
  const int32_t first = gather.row_index(0), second = gather.row_index(1);
  // [head][kPitch], q as given (QElement), converted after the load where the cache's type
  // differs.
  Element* sQ = reinterpret_cast<Element*>(sKV + Traits::kSmemKVStageBytes);
  static_assert(sizeof(QElement) == sizeof(Element), "q's rows at the pitch of a 16-bit tile");
  static_assert(kBlockH * kPitch * sizeof(Element) <= Traits::kSmemKVStageBytes, "q of the block fits in stage 1");
  stage_q<Traits, Traits::kNumThreads>(p, reinterpret_cast<QElement*>(sQ), t, h0, tid);
  gather.issue(first, 0);
  cp_async_wait<1>();  // q's group; tile 0's may still be in flight
  __syncthreads();
  uint32_t q_frag[kSteps][kMTiles][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      ldmatrix_x4(q_frag[s][m], sQ + (m * 16 + lane % 16) * kPitch + step_col<Traits>(dq, s) + (lane / 16) * 8);
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
  gather.issue(second, 1);
  int32_t next_row = gather.row_index(2);  // the thread's row of the next tile to issue

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
  constexpr int kVCols = 16;
  uint32_t v_frag[kBlockN / 16][kDvPerWarp / kVCols][4];
  // Offset of this lane's ldmatrix address in a stage, in elements.
  const int v_key = (lane % 8) + ((lane >> 3) & 1) * 8;
  const int v_off = v_key * kPitch + warp * kDvPerWarp + (lane >> 4) * 8;
  auto load_v = [&](const uint8_t* sV_bytes) {
    const Element* sV = reinterpret_cast<const Element*>(sV_bytes);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int n2 = 0; n2 < kDvPerWarp / kVCols; ++n2) ldmatrix_x4_trans(v_frag[kk][n2], sV + v_off + kk * 16 * kPitch + n2 * 16);
    }
  };
  // The pending tile's P (A fragments) and alpha, read during the next tile's S: written before
  // that turn's first barrier, they are ready then, and the P V after the second barrier then
  // starts on registers while the softmax's loads are in flight.
  uint32_t p_frag[kBlockN / 16][kMTiles][4];
  float alpha_r[kMTiles][2];
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
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          mma_16816<Element>(acc_o[m][2 * n2], p_frag[kk][m], v_frag[kk][n2][0], v_frag[kk][n2][1]);
          mma_16816<Element>(acc_o[m][2 * n2 + 1], p_frag[kk][m], v_frag[kk][n2][2], v_frag[kk][n2][3]);
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
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      // The next tile's gather is issued here, not at the loop top: ptxas cannot tell the stages
      // apart, so it keeps this tile's ldmatrix loads behind those cp.async writes, and ~115 issue
      // slots would precede the first S MMA.
      if (s == kSteps / 2 && it > 0 && it + 1 < num_tiles) {
        gather.issue(next_row, (it + 1) % 2);  // into the stage of tile it - 1, whose V is in registers
        next_row = gather.row_index(it + 2);
      }
      uint32_t b[4];  // keys 0-7 (b0, b1) and 8-15 (b2, b3) of the half
      ldmatrix_x4(b, k_base + step_col<Traits>(dq, s));
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) mma_16816<Element>(acc_s[m][nt], q_frag[s][m], b[2 * nt], b[2 * nt + 1]);
      }
    }
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

  // Online softmax over the tile in `stage` (base 2, fp32): its P, rounded once to the MMA type,
  // and alpha into buffer `stage`.
  auto softmax = [&](int stage) {
    const float* s_in = sS + sm_h * kSPitch + sm_k;
    // The shorter chain (sums from quarter 0, a tree maximum, the SFU's 2^x) gained 2-3 % at
    // D = 512; at D = 576 ptxas then ordered S and P V so that it lost 1.5 % (v35).
    constexpr bool kShortChain = Traits::kHeadDim == kHeadSizeNoPE;
    float x[4];
    const float tile_max = tile_scores<kQuarters, kBlockH * kSPitch, kBlockN, kShortChain, kLazy>(
        s_in, sValid, stage, sm_k, p.sm_scale_log2, m_run, x);
    float pr[4];
    const float alpha = online_softmax_step<kLazy, kShortChain>(x, tile_max, m_run, l_run, pr);
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
    __syncthreads();
    pv();  // the tile before's P V, whose MMAs interleave with the softmax
    softmax(stage);
    load_v(sK_bytes);
  }
  if (num_tiles > 0) {
    __syncthreads();  // the last tile's P and alpha
    load_p((num_tiles - 1) % 2);
    pv();
  }
  cp_async_wait<0>();  // nothing may be in flight when the block exits
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // see the main kernel
#endif

  // Epilogue (fwd_common.cuh): as the main kernel's.
  write_lse(p, sL, t, h0, split, tid, sm_h, m_run, l_run);
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m * 16 + lane / 4 + half * 8;
      const int h = h0 + r;
      if (h >= p.num_heads) continue;
      const float l = sL[r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      write_o_row<QElement, false>(p, t, h, split, warp * kDvPerWarp + (lane % 4) * 2, half, acc_o[m], inv);
    }
  }
}

}  // namespace sparse_mla
