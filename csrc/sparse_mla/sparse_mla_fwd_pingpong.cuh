// The PingPong kernel body: the WideWarps family's 32-head blocks of fp8 caches (kernel_traits.h
// kPingPong), whose tiles stay raw in shared memory and are decoded per MMA fragment, with 16
// warps in two roles, so that one tile's S and the tile before's softmax and P V run at once in
// different warps (FlashAttention-3's ping-pong, here on mma.sync), one block barrier per tile:
//   S warps 0-7      (dq = warp % 4, kh = warp / 4): 32 heads x keys 16 kh .. 16 kh + 15 of tile
//                    k over quarter dq of D, into the partial-score buffer; they also gather.
//   P V warps 8-15   the softmax of tile k - 1 (8 threads per head, 4 keys each), a barrier of
//                    their own, then O += P V over output columns 64 (warp - 8) .. + 63.
// Three raw stages: the gather of tile k + 1 goes into the stage whose tile the P V of phase k - 1
// finished. One partial-score buffer (two would take 101,504 B with sm_90 / 120's reserved 1 KB
// at fp8_e4m3's D = 576, 105,344 at fp8_ds_mla's): the P V warps hand it over once they hold
// their scores, by an mbarrier (arrive / wait for the phase's parity), and the S warps wait for
// that before writing theirs. The roles reach the block barrier from different places, so it is
// barrier.sync, not __syncthreads' aligned bar.sync (undefined there). Every warp reaches each
// block barrier having passed as many barriers, since racecheck orders two warps' accesses by
// the barriers each has passed: the S warps' two q barriers are block barriers, and the S warps
// pass one of their own per tile as the P V warps do. fp8_ds_mla: the S warps scale each
// quarter's latent scores by the keys' scales of that tile before the bf16 rope step adds in; the
// P V warps scale their P fragments by their scale tile's key scales.
// 128 registers a thread.
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
__device__ __forceinline__ void sparse_mla_fwd_pingpong_block(const SparseMlaFwdParams& p) {
  static_assert(Traits::kPingPong && Traits::kRawFp8);
  using Element = typename Traits::Element;
  using QElement = typename Traits::QElement;
  static_assert(std::is_same_v<Element, __half>);
  constexpr bool kDs = Traits::kDsMla;
  // The FlashAttention-4 lazy rescale (sparse_mla_fwd_wide.cuh), with fp8_ds_mla's norm kept
  // within 2^3 of the tile's largest scale; but fp8_ds_mla with fp16 out, whose P' is rounded
  // twice already, keeps the exact maximum (the lazy one would add ~3.4e-4 to fp16's 1e-3 bar).
  constexpr bool kLazy = !(kDs && std::is_same_v<QElement, __half>);
  constexpr int kBlockH = Traits::kBlockH;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kPitch = Traits::kSmemPitch;
  constexpr int kSPitch = Traits::kSPitch;
  constexpr int kPPitch = Traits::kPPitch;
  constexpr int kSteps = Traits::kStepsPerWarp;
  constexpr int kLatentSteps = Traits::kLatentStepsPerWarp;
  constexpr int kStages = Traits::kStages;
  constexpr int kRowBytes = Traits::kSmemRowBytes;
  constexpr int kStageBytes = Traits::kSmemKVStageBytes;
  constexpr int kQuarters = 4;
  constexpr int kMTiles = kBlockH / 16;
  constexpr int kRoleThreads = 256;
  constexpr int kDvPerWarp = kHeadSizeV / 8;
  constexpr int kLineChunks = 8;
  static_assert(kBlockH == 32 && kBlockN == 32 && Traits::kNumThreads == 2 * kRoleThreads && kStages == 3 &&
                kPPitch == kBlockN && Traits::kStatsArrays == 2);
  static_assert(Traits::kHeadGroups * Traits::kSBuffersPerGroup * Traits::kSmemSPartElems ==
                    kQuarters * kBlockH * kSPitch &&
                Traits::kHeadGroups * Traits::kPBuffers * Traits::kSmemPBufferElems == kBlockH * kPPitch,
                "partial scores as [quarter][head][key], one P buffer");

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sKV = smem + Traits::kSmemKVOffset;
  float* sS = reinterpret_cast<float*>(smem + Traits::kSmemSOffset);
  Element* sP = reinterpret_cast<Element*>(smem + Traits::kSmemPOffset);
  float* sAlpha = reinterpret_cast<float*>(smem + Traits::kSmemStatsOffset);
  float* sL = sAlpha + kBlockH;
  int* sValid = reinterpret_cast<int*>(smem + Traits::kSmemValidOffset);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const bool s_role = warp < 8;
  // The partial-score buffer's hand-over: the P V warps' 256 arrivals per tile complete a phase.
  uint64_t* scores_free = reinterpret_cast<uint64_t*>(smem + Traits::kSmemBarrierOffset);
  if (tid == kRoleThreads) mbarrier_init(scores_free, kRoleThreads);
  const BlockWork work = block_work<kBlockH, kBlockN>(p);
  const int t = work.t, h0 = work.h0, split = work.split, topk_t = work.topk_t;
  const int tile_begin = work.tile_begin, num_tiles = work.num_tiles;

  // Gather by the S warps: thread (g_row, g_sub) copies chunks g_sub, g_sub + 8, ... of row g_row.
  const int g_row = (tid % kRoleThreads) / kLineChunks;
  const int g_sub = tid % kLineChunks;
  const TileGather<Traits, kLineChunks> gather{
      p, sKV, sValid, p.indices + static_cast<int64_t>(t) * p.indices_stride_t, tile_begin, num_tiles, topk_t,
      g_row, g_sub};

  float tensor_scale = 1.f;  // fp8_e4m3: S and O carry the per-tensor scale, applied in fp32
  if constexpr (!kDs) {
    if (p.k_scale != nullptr) tensor_scale = __ldg(p.k_scale);
  }

  if (s_role) {
    const int dq = warp % kQuarters;
    const int kh = warp / kQuarters;
    // q through stages 1 and 2 while tile 0's gather is in flight; its A fragments take the raw
    // tiles' column order (kv_convert.cuh), but for fp8_ds_mla's bf16 rope.
    const int32_t first = gather.row_index(0);
    Element* sQ = reinterpret_cast<Element*>(sKV + kStageBytes);
    static_assert(kBlockH * kPitch * sizeof(Element) <= 2 * kStageBytes, "q fits in stages 1 and 2");
    stage_q<Traits, kRoleThreads>(p, reinterpret_cast<QElement*>(sQ), t, h0, tid);
    gather.issue(first, 0);
    cp_async_wait<1>();
    named_barrier_sync_unaligned<0, Traits::kNumThreads>();  // q in shared memory (the S warps' copies)
    uint32_t q_frag[kSteps][kMTiles][4];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          q_frag[s][m][i] = *reinterpret_cast<const uint32_t*>(
              sQ + (m * 16 + lane / 4 + (i & 1) * 8) * kPitch + step_col<Traits>(dq, s) +
              a_frag_col(lane, i, !(kDs && s >= kLatentSteps)));
        if constexpr (!std::is_same_v<QElement, Element>) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const QElement* v = reinterpret_cast<const QElement*>(&q_frag[s][m][i]);
            q_frag[s][m][i] = pack2<Element>(static_cast<float>(v[0]), static_cast<float>(v[1]));
          }
        }
      }
    }
    named_barrier_sync_unaligned<0, Traits::kNumThreads>();  // stages 1 and 2 are free
    int32_t next_row = gather.row_index(1);

    // Phase k: S of tile k (stage k % 3), the gather of tile k + 1 into stage (k + 1) % 3, whose
    // tile k - 2 the P V warps finished in phase k - 1.
    for (int k = 0; k <= num_tiles; ++k) {
      cp_async_wait<0>();
      named_barrier_sync_unaligned<0, Traits::kNumThreads>();
      if (k == num_tiles) break;
      // Racecheck's count (above): one of their own per tile after the first, as the P V warps'.
      if (k > 0) named_barrier_sync<1, kRoleThreads>();
      const uint8_t* sK_bytes = sKV + (k % kStages) * kStageBytes;
      float acc_s[kMTiles][2][4] = {};
      // fp8_ds_mla: the latent part times the key's scale of tile dq, before the rope adds in.
      auto scale_by_keys = [&]() {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = kh * 16 + nt * 8 + (lane % 4) * 2 + e;
            const float sc = *reinterpret_cast<const float*>(sK_bytes + key * kRowBytes + kDsMlaScaleOffset + dq * 4);
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
        // The next tile's gather before S's first load, its stage being free from the phase's start
        // (fp8_e4m3 1.04-1.10x over k-step kSteps / 2 at 32-128 heads, an H100; HISTORY.md v49).
        if (s == 0 && k + 1 < num_tiles) {
          gather.issue(next_row, (k + 1) % kStages);
          next_row = gather.row_index(k + 2);
        }
        uint32_t b[4];
        if (kDs && s == kLatentSteps) {  // fp8_ds_mla's bf16 rope step (D = 576), as fp16
          scale_by_keys();
          uint32_t r[4];
          ldmatrix_x4(r, sK_bytes + (kh * 16 + (lane % 8) + ((lane >> 3) & 1) * 8) * kRowBytes + kDsMlaRopeOffset +
                             (step_col<Traits>(dq, s) - kKvLoraRank) * 2 + (lane >> 4) * 16);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            b[2 * nt] = bf16x2_to_half2(r[nt]);
            b[2 * nt + 1] = bf16x2_to_half2(r[2 + nt]);
          }
        } else {
          uint32_t r[2];
          ldmatrix_x2(r, sK_bytes + (kh * 16 + lane % 16) * kRowBytes + step_col<Traits>(dq, s));
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            b[2 * nt] = e4m3x2_to_half2(r[nt]);
            b[2 * nt + 1] = e4m3x2_hi_to_half2(r[nt]);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int m = 0; m < kMTiles; ++m) mma_16816<Element>(acc_s[m][nt], q_frag[s][m], b[2 * nt], b[2 * nt + 1]);
        }
      }
      if constexpr (kDs && kSteps == kLatentSteps) scale_by_keys();  // D = 512: no rope
      // The P V warps read tile k - 1's scores until they arrive.
      if (k > 0) mbarrier_wait_parity(scores_free, (k - 1) & 1);
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
    }
    // Nothing in flight: the last phase waited before its barrier.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    return;
  }

  // The P V warps.
  const int ptid = tid - kRoleThreads;
  const int pw = warp - 8;
  const int sm_h = ptid / 8;
  const int sm_k = (ptid % 8) * 4;
  const float score_scale = p.sm_scale_log2 * tensor_scale;
  float m_run = -INFINITY, l_run = 0.f;
  float acc_o[kMTiles][kDvPerWarp / 8][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < kDvPerWarp / 8; ++n) acc_o[m][n][0] = acc_o[m][n][1] = acc_o[m][n][2] = acc_o[m][n][3] = 0.f;
  }
  // P rows of 64 bytes, 16-byte chunk c of row h at c ^ ((h >> 1) & 3) (as in the WideWarps body):
  // the 8 rows an ldmatrix reads at one chunk hit 8 bank groups.
  auto p_chunk = [](int h, int c) { return c ^ ((h >> 1) & 3); };
  const int v_key = (lane % 8) + ((lane >> 3) & 1) * 8;
  const int v_off = v_key * kRowBytes + pw * kDvPerWarp + (lane >> 4) * 16;
  const Element* p_row = sP + (lane % 16) * kPPitch;
  // fp8_ds_mla: this warp's scale tile (its 64 columns are half of one); acc_o holds O / ds_norm,
  // the norm of the last tile it took.
  const int ds_tile = pw * kDvPerWarp / kDsMlaTile;
  float ds_norm = 1.f;

  // The P V warps pass the q barriers and the block barrier of phase 0 with nothing to do.
  for (int i = 0; i < 3; ++i) named_barrier_sync_unaligned<0, Traits::kNumThreads>();
  for (int k = 1; k <= num_tiles; ++k) {
    named_barrier_sync_unaligned<0, Traits::kNumThreads>();
    const int tile = k - 1;
    const int stage = tile % kStages;
    // Softmax of the tile (base 2, fp32; fwd_common.cuh).
    float x[4];
    const float tile_max = tile_scores<kQuarters, kBlockH * kSPitch, kBlockN, Traits::kHeadDim == kHeadSizeNoPE, kLazy>(
        sS + sm_h * kSPitch + sm_k, sValid, stage, sm_k, score_scale, m_run, x);
    if (k < num_tiles) mbarrier_arrive(scores_free);  // the scores are read
    float pr[4];
    const float alpha = online_softmax_step<kLazy, Traits::kHeadDim == kHeadSizeNoPE>(x, tile_max, m_run, l_run, pr);
    *reinterpret_cast<uint2*>(sP + sm_h * kPPitch + p_chunk(sm_h, sm_k / 8) * 8 + sm_k % 8) =
        make_uint2(pack2<Element>(pr[0], pr[1]), pack2<Element>(pr[2], pr[3]));
    if ((ptid % 8) == 0) sAlpha[sm_h] = alpha;
    named_barrier_sync<2, kRoleThreads>();  // P and alpha of the tile
    const uint8_t* sV_bytes = sKV + stage * kStageBytes;
    float alpha_r[kMTiles][2];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      alpha_r[m][0] = sAlpha[m * 16 + lane / 4];
      alpha_r[m][1] = sAlpha[m * 16 + lane / 4 + 8];
    }
    // fp8_ds_mla (the main kernel's register P): P' = p x key scale / norm, norm a power of two
    // near the tile's largest scale of this warp's scale tile (lazy: within 2^3 of it); O / norm =
    // alpha (norm_prev / norm) O / norm_prev + P' V. ds_pair holds this lane's key pair's scales.
    uint32_t ds_pair = 0;
    if constexpr (kDs) {
      const float key_scale = *reinterpret_cast<const float*>(sV_bytes + lane * kRowBytes + kDsMlaScaleOffset + ds_tile * 4);
      const float smax = __int_as_float(__reduce_max_sync(~0u, __float_as_int(key_scale)));
      const float norm = kLazy && smax >= ds_norm * 0.125f && smax < ds_norm * 8.f ? ds_norm : ds_scale_norm(smax);
      const float inv_norm = pow2_reciprocal(norm);
      const float ratio = ds_norm * inv_norm;
      ds_norm = norm;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        alpha_r[m][0] *= ratio;
        alpha_r[m][1] *= ratio;
      }
      const float sc = key_scale * inv_norm;
      ds_pair = pack2<Element>(sc, __shfl_down_sync(~0u, sc, 1));
    }
    bool keep = true;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) keep = keep && alpha_r[m][0] == 1.f && alpha_r[m][1] == 1.f;
    if (!kLazy || !__all_sync(~0u, keep)) {
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
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t p_frag[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
        ldmatrix_x4(p_frag[m], p_row + m * 16 * kPPitch + p_chunk(lane % 16, 2 * kk + lane / 16) * 8);
      if constexpr (kDs) {  // register i holds keys 16 kk + 8 (i / 2) + 2 (lane % 4) + {0, 1}
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t sc = __shfl_sync(~0u, ds_pair, kk * 16 + h * 8 + (lane % 4) * 2);
#pragma unroll
          for (int m = 0; m < kMTiles; ++m) {
            p_frag[m][2 * h] = hmul2(p_frag[m][2 * h], sc);
            p_frag[m][2 * h + 1] = hmul2(p_frag[m][2 * h + 1], sc);
          }
        }
      }
#pragma unroll
      for (int n2 = 0; n2 < kDvPerWarp / 32; ++n2) {
        uint32_t v[4];
        ldmatrix_x4_trans(v, sV_bytes + v_off + kk * 16 * kRowBytes + n2 * 32);
        // As the main kernel's raw P V: matrices (keys 0-7, 8-15) x (bytes 0-15, 16-31),
        // transposed as b16; even bytes the B fragment of 16-column chunk c's even columns, odd
        // bytes of its odd ones: acc_o[m][2 (2 n2 + c) + odd], the epilogue's order.
#pragma unroll
        for (int c = 0; c < 2; ++c) {
#pragma unroll
          for (int odd = 0; odd < 2; ++odd) {
            const uint32_t b0 = e4m3_trans_column_to_half2(v[2 * c], odd);
            const uint32_t b1 = e4m3_trans_column_to_half2(v[2 * c + 1], odd);
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) mma_16816<Element>(acc_o[m][2 * (2 * n2 + c) + odd], p_frag[m], b0, b1);
          }
        }
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif

  // Epilogue (fwd_common.cuh), the P V warps alone: the S warps have exited.
  write_lse<2, kRoleThreads>(p, sL, t, h0, split, ptid, sm_h, m_run, l_run);
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m * 16 + lane / 4 + half * 8;
      const int h = h0 + r;
      if (h >= p.num_heads) continue;
      const float l = sL[r];
      const float inv = l > 0.f ? (kDs ? ds_norm : tensor_scale) / l : 0.f;
      write_o_row<QElement, true>(p, t, h, split, pw * kDvPerWarp + (lane % 4) * 4, half, acc_o[m], inv);
    }
  }
}

}  // namespace sparse_mla
