// Device helpers shared by the forward kernel bodies (sparse_mla_fwd_kernel.cuh,
// sparse_mla_fwd_wide.cuh, sparse_mla_fwd_pingpong.cuh).
#pragma once

#include <cmath>
#include <cstdint>

#include "formats.h"
#include "mma_utils.cuh"
#include "params.h"

namespace sparse_mla {

// Number of slots token t may use: topk, cut by topk_len[t] when given.
__device__ __forceinline__ int token_topk(const SparseMlaFwdParams& p, int t) {
  if (p.topk_len == nullptr) return p.topk;
  const int len = __ldg(p.topk_len + t);
  return len < 0 ? 0 : (len < p.topk ? len : p.topk);
}

// Thread sub of the kTpr threads that copy one row of kRowBytes, dst and src at the row's chunk
// sub: chunks sub, sub + kTpr, ... from those two addresses, so that sm_90's ptxas emits immediate
// offsets instead of an address per chunk (bench/HISTORY.md v32 and v39). valid = false zero-fills.
template <int kRowBytes, int kTpr>
__device__ __forceinline__ void cp_async_row(uint8_t* dst, const uint8_t* src, bool valid) {
  static_assert(kRowBytes % (16 * kTpr) == 0, "whole 16-byte chunks for every thread");
#pragma unroll
  for (int k = 0; k < kRowBytes / (16 * kTpr); ++k) cp_async_16(dst + k * 16 * kTpr, src + k * 16 * kTpr, valid);
}

// Whether index entry r names a row of the KV cache (-1 and out-of-range entries are skipped slots).
__device__ __forceinline__ bool valid_kv_row(const SparseMlaFwdParams& p, int32_t r) {
  return r >= 0 && r < p.num_kv_rows;
}

// Row r of the KV cache (zero-filled where r < 0 or r >= num_kv_rows) into row g_row of `stage`
// of a block's tile ring, by its kTpr threads (g_sub = 0 .. kTpr - 1: chunks g_sub, g_sub + kTpr,
// ...), and its valid flag into s_valid[stage][g_row]; one cp.async group. Raw fp8 rows (32-41
// chunks) take the main kernel's loop (bench/HISTORY.md v26).
template <typename Traits, int kTpr>
__device__ __forceinline__ void gather_row(const SparseMlaFwdParams& p, uint8_t* s_kv, int* s_valid, int32_t r,
                                           int stage, int g_row, int g_sub) {
  const bool valid = valid_kv_row(p, r);
  const uint8_t* src = p.kv + (valid ? static_cast<int64_t>(r) : 0) * p.kv_row_stride + g_sub * 16;
  uint8_t* dst = s_kv + stage * Traits::kSmemKVStageBytes + g_row * Traits::kSmemRowBytes + g_sub * 16;
  if constexpr (!Traits::kRawFp8) {
    cp_async_row<Traits::kGatherRowBytes, kTpr>(dst, src, valid);
  } else {
    constexpr int kChunks = Traits::kGatherRowBytes / 16;
#pragma unroll
    for (int c = 0; c < (kChunks + kTpr - 1) / kTpr; ++c) {
      if (g_sub + c * kTpr < kChunks) cp_async_16(dst + c * 16 * kTpr, src + c * 16 * kTpr, valid);
    }
  }
  if (g_sub == 0) s_valid[stage * Traits::kBlockN + g_row] = valid;
  cp_async_commit();
}

// A 32-head block's tile gather by one thread: row g_row of each kBlockN-key tile, chunks g_sub,
// g_sub + kTpr, ... (gather_row). Indices are read a tile ahead and checked where the row is
// issued (gather_row's valid), not where it is read.
template <typename Traits, int kTpr>
struct TileGather {
  const SparseMlaFwdParams& p;
  uint8_t* s_kv;
  int* s_valid;
  const int32_t* idx;  // token t's row of p.indices
  int tile_begin, num_tiles, topk_t, g_row, g_sub;

  // The thread's row of `tile` as stored; -1 past the block's tiles or the token's slots.
  __device__ __forceinline__ int32_t row_index(int tile) const {
    const int j = (tile_begin + tile) * Traits::kBlockN + g_row;
    return tile < num_tiles && j < topk_t ? __ldg(idx + j) : -1;
  }
  __device__ __forceinline__ void issue(int32_t r, int stage) const {
    gather_row<Traits, kTpr>(p, s_kv, s_valid, r, stage, g_row, g_sub);
  }
};

// First column of k-step s of the D quarter `quarter` (one warp's share of QK): its latent
// steps, then its rope step (D = 576).
template <typename Traits>
__device__ __forceinline__ int step_col(int quarter, int s) {
  constexpr int kLatentSteps = Traits::kLatentStepsPerWarp;
  return s < kLatentSteps ? (quarter * kLatentSteps + s) * 16
                          : kKvLoraRank + (quarter * Traits::kRopeStepsPerWarp + s - kLatentSteps) * 16;
}

// q of token t, heads h0 .. h0 + kBlockH - 1 (rows past num_heads zero-filled), into s_q
// [head][kSmemPitch] as given (QElement), q_nope then q_pe, by kThreads threads in 16-byte
// cp.async chunks; one cp.async group.
template <typename Traits, int kThreads>
__device__ __forceinline__ void stage_q(const SparseMlaFwdParams& p, typename Traits::QElement* s_q, int t, int h0,
                                        int tid) {
  using QElement = typename Traits::QElement;
  constexpr int kChunkElems = 16 / sizeof(QElement);
  constexpr int kQChunks = Traits::kHeadDim / kChunkElems;
  static_assert(Traits::kBlockH * kQChunks % kThreads == 0);
#pragma unroll
  for (int k = 0; k < Traits::kBlockH * kQChunks / kThreads; ++k) {
    const int c = tid + k * kThreads;
    const int r = c / kQChunks, col = (c % kQChunks) * kChunkElems;
    const int h = h0 + r;
    const bool ok = h < p.num_heads;
    const int64_t hh = ok ? h : h0;
    const QElement* qn = static_cast<const QElement*>(p.q_nope) + t * p.q_nope_stride_t + hh * p.q_nope_stride_h;
    const QElement* qp = p.q_pe == nullptr ? qn
                         : static_cast<const QElement*>(p.q_pe) + t * p.q_pe_stride_t + hh * p.q_pe_stride_h;
    cp_async_16(s_q + r * Traits::kSmemPitch + col, col < p.q_nope_dim ? qn + col : qp + (col - p.q_nope_dim), ok);
  }
  cp_async_commit();
}

// Column, within a k-step, of this lane's m16n8k16 A fragment register i: pairs (c, c + 8) with
// c = 2 (lane % 4); with raw fp8 tiles, whose B fragments hold columns (4j, 4j + 1) and (4j + 2,
// 4j + 3), j = lane % 4, pairs (c, c + 2) with c = 4 (lane % 4).
__device__ __forceinline__ int a_frag_col(int lane, int i, bool permuted) {
  return permuted ? (lane % 4) * 4 + (i >> 1) * 2 : (lane % 4) * 2 + (i >> 1) * 8;
}

// fp8_ds_mla in fp16: the P of column tile w (p x key scale) is divided by a power of two near
// the tile's largest scale of column tile w, 2^floor(log2 smax), which keeps p * scale / norm in
// [0, 2) (1 for subnormal or zero scales); under the WideWarps lazy rescale, p <= 2^8 and the
// norm may lag the largest scale by 2^3.
__device__ __forceinline__ float ds_scale_norm(float smax) {
  const float norm = __uint_as_float(__float_as_uint(smax) & 0x7f800000u);
  return norm > 0.f ? norm : 1.f;
}

// 1 / x for x = 2^e, e in [-126, 126], exactly and without a division: the exponent negated.
// fp8_ds_mla scales are amax / 448 <= 2^120, so their norms are in range.
__device__ __forceinline__ float pow2_reciprocal(float x) {
  return __uint_as_float((254u << 23) - (__float_as_uint(x) & 0x7f800000u));
}

// What one block of either family works on: token t, heads h0 .. h0 + kBlockH - 1 and, of the
// token's topk_t slots, the kBlockN-row tiles tile_begin .. tile_begin + num_tiles - 1 (split
// blockIdx.y; none where the split lies past the token's slots). The grid is x = token *
// head_blocks + head block, y = split (launch_template.cuh).
struct BlockWork {
  int t, h0, split, topk_t, tile_begin, num_tiles;
};

template <int kBlockH, int kBlockN>
__device__ __forceinline__ BlockWork block_work(const SparseMlaFwdParams& p) {
  BlockWork w;
  const int head_blocks = (p.num_heads + kBlockH - 1) / kBlockH;
  w.t = blockIdx.x / head_blocks;
  w.h0 = (blockIdx.x % head_blocks) * kBlockH;
  w.split = blockIdx.y;
  w.topk_t = token_topk(p, w.t);
  const int num_tiles_t = (w.topk_t + kBlockN - 1) / kBlockN;
  w.tile_begin = w.split * p.tiles_per_split;
  const int tile_end = min(w.tile_begin + p.tiles_per_split, num_tiles_t);
  w.num_tiles = tile_end > w.tile_begin ? tile_end - w.tile_begin : 0;
  return w;
}

// The lazy rescale's margin (online_softmax_step), base 2.
constexpr float kLazyLog2 = 8.f;

// The softmax's first step, the same in both families: a thread's 4 keys (key .. key + 3 of the
// tile in `stage`) summed over the kParts partial-score buffers (kPartStride floats apart),
// scaled to base 2, -inf where s_valid says the slot is invalid, and the tile's maximum over the 8
// threads of the head. kShortChain starts the sums from buffer 0 and takes a tree maximum (a
// shorter dependent chain, v35-v36). `valid` is formed after the sums: ptxas then keeps the
// loops' SASS as it was before this was shared.
// The maximum only matters where it moves the head's running maximum m_run (past m_run, or under
// kLazy past m_run + kLazyLog2; online_softmax_step): where no thread of the warp holds such a
// score, a vote skips the 3 dependent shuffles (a long wait in the chain; HISTORY.md v52) and
// the thread's own maximum, which moves nothing either, is returned: the outputs are the same.
template <int kParts, int kPartStride, int kBlockN, bool kShortChain, bool kLazy>
__device__ __forceinline__ float tile_scores(const float* s_in, const int* s_valid, int stage, int key, float scale,
                                             float m_run, float (&x)[4]) {
  if constexpr (kShortChain) {
    const float4 s0 = *reinterpret_cast<const float4*>(s_in);
    x[0] = s0.x;
    x[1] = s0.y;
    x[2] = s0.z;
    x[3] = s0.w;
  } else {
    x[0] = x[1] = x[2] = x[3] = 0.f;
  }
#pragma unroll
  for (int q = kShortChain ? 1 : 0; q < kParts; ++q) {
    const float4 s4 = *reinterpret_cast<const float4*>(s_in + q * kPartStride);
    x[0] += s4.x;
    x[1] += s4.y;
    x[2] += s4.z;
    x[3] += s4.w;
  }
  const int* valid = s_valid + stage * kBlockN + key;
  float tile_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[i] = valid[i] ? x[i] * scale : -INFINITY;
    if constexpr (!kShortChain) tile_max = fmaxf(tile_max, x[i]);
  }
  if constexpr (kShortChain) tile_max = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
  if (__any_sync(~0u, tile_max > (kLazy ? m_run + kLazyLog2 : m_run))) {
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(~0u, tile_max, o));
  }
  return tile_max;
}

// The softmax's second step, the same in both 32-head bodies: the running maximum m_run, the
// tile's p = 2^(x - m) (the thread's 4 keys) and the running sum l_run, updated for the tile whose
// maximum is tile_max (tile_scores); returns alpha = 2^(m_old - m_new), O's factor. kLazy: the
// FlashAttention-4 lazy rescale, m moved only when tile_max passes it by more than kLazyLog2 = 8
// (base 2, so p <= 2^8), and alpha exactly 1 where it stays, whatever the SFU gives for 2^0, for
// the warp vote that skips O's rescale; the others never vote (2^0 as the SFU gives it, 4
// instructions fewer). Nothing valid so far (m = -inf): p = 0, state unchanged, by selects rather
// than a branch, so that ptxas may interleave the chain with MMAs beside it. kShortChain: the
// SFU's 2^x without denormals (v35).
template <bool kLazy, bool kShortChain>
__device__ __forceinline__ float online_softmax_step(const float (&x)[4], float tile_max, float& m_run, float& l_run,
                                                     float (&pr)[4]) {
  auto exp2_chain = [](float v) { return kShortChain ? exp2_ftz(v) : exp2f(v); };
  const float m_new = !kLazy ? fmaxf(m_run, tile_max) : tile_max > m_run + kLazyLog2 ? tile_max : m_run;
  const bool any = m_new != -INFINITY;
  const float alpha = any && (!kLazy || m_new != m_run) ? exp2_chain(m_run - m_new) : 1.f;
  float psum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    pr[i] = any ? exp2_chain(x[i] - m_new) : 0.f;
    psum += pr[i];
  }
  l_run = l_run * alpha + psum;
  m_run = m_new;
  return alpha;
}

// The epilogue's first half, the same in both families: each head's row sum l, summed over its 8
// softmax threads (thread tid serves head tid / 8), goes to sL for the output rows; its first
// thread writes lse, in natural log ((m + log2 l) ln 2 of the base-2 running maximum m; -inf where
// no slot of this range was valid), to lse, or to this split's partial_lse. Ends on a barrier
// (the block's, or named barrier kBarrier of kThreads threads), after which sL holds every head's l.
template <int kBarrier = 0, int kThreads = 0>
__device__ __forceinline__ void write_lse(const SparseMlaFwdParams& p, float* sL, int t, int h0, int split, int tid,
                                          int sm_h, float m_run, float l_run) {
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) l_run += __shfl_xor_sync(~0u, l_run, o);
  if ((tid % 8) == 0) {
    sL[sm_h] = l_run;
    const int h = h0 + sm_h;
    if (h < p.num_heads) {
      const float lse = l_run > 0.f ? (m_run + log2f(l_run)) * 0.69314718055994531f : -INFINITY;
      if (p.num_splits == 1)
        p.lse[t * p.lse_stride_t + h * p.lse_stride_h] = lse;
      else
        p.partial_lse[(static_cast<int64_t>(t) * p.num_heads + h) * p.num_splits + split] = lse;
    }
  }
  if constexpr (kBarrier == 0) __syncthreads();
  else named_barrier_sync<kBarrier, kThreads>();
}

// The epilogue's second half: this thread's share of O's row h (< num_heads), its accumulators
// times inv, to out in q's dtype, or to this split's partial_out in fp32. Runs of kRun columns,
// one vector store each, from column col0 of the row (+ 4 kRun n: run n). Raw fp8 tiles' P V
// leaves acc[2 n + odd][2 half + e] at column 4 (lane % 4) + 2 e + odd of 16-column chunk n, so
// there a run is four columns and one store covers 64 contiguous bytes of a row (two half-width
// stores would each leave every other 8 bytes unwritten; bench/HISTORY.md v23); otherwise
// acc[n][2 half + k] is column 8 n + 2 (lane % 4) + k, runs of two.
template <typename QElement, bool kRawOrder, int kNTiles>
__device__ __forceinline__ void write_o_row(const SparseMlaFwdParams& p, int t, int h, int split, int col0, int half,
                                            const float (&acc)[kNTiles][4], float inv) {
  constexpr int kRun = kRawOrder ? 4 : 2;
  constexpr int kRuns = kNTiles * 8 / (4 * kRun);
  auto val = [&](int n, int k) { return (kRawOrder ? acc[2 * n + k % 2][2 * half + k / 2] : acc[n][2 * half + k]) * inv; };
  if (p.num_splits == 1) {
    QElement* out = static_cast<QElement*>(p.out) + t * p.out_stride_t + static_cast<int64_t>(h) * p.out_stride_h;
#pragma unroll
    for (int n = 0; n < kRuns; ++n) {
      const uint32_t w0 = pack2<QElement>(val(n, 0), val(n, 1));
      if constexpr (kRun == 4)
        *reinterpret_cast<uint2*>(out + col0 + n * 4 * kRun) = make_uint2(w0, pack2<QElement>(val(n, 2), val(n, 3)));
      else
        *reinterpret_cast<uint32_t*>(out + col0 + n * 4 * kRun) = w0;
    }
  } else {
    float* out = p.partial_out + ((static_cast<int64_t>(t) * p.num_heads + h) * p.num_splits + split) * kHeadSizeV;
#pragma unroll
    for (int n = 0; n < kRuns; ++n) {
      if constexpr (kRun == 4)
        *reinterpret_cast<float4*>(out + col0 + n * 4 * kRun) = make_float4(val(n, 0), val(n, 1), val(n, 2), val(n, 3));
      else
        *reinterpret_cast<float2*>(out + col0 + n * 4 * kRun) = make_float2(val(n, 0), val(n, 1));
    }
  }
}

}  // namespace sparse_mla
