// The sparse-MLA forward kernel (SPEC §3.1) on the warp-level mma.sync path.
//
// Grid: x = token * num_head_groups + head_group (blocks of one token are adjacent, so the KV
// rows they share are read from DRAM once and from L2 after), y = split of the top-k axis.
// Per KV tile of kBlockN gathered rows:
//   1. S = Q K^T      each warp: 16 heads x 8 rows, K-dim = D, from shared Q and KV.
//   2. online softmax 8 threads per head over the tile's 32 scores (base 2, fp32).
//   3. O += P V       each warp: 16 heads x 128 columns, K-dim = 32 rows, V = the first 512
//                     columns of the same shared tile.
// A masked slot is zero-filled without a read and its score forced to -inf.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernel_traits.h"
#include "kv_convert.cuh"
#include "mma_utils.cuh"
#include "params.h"

namespace sparse_mla {

// Number of slots token t may use: topk, cut by topk_len[t] when given.
__device__ __forceinline__ int token_topk(const SparseMlaFwdParams& p, int t) {
  if (p.topk_len == nullptr) return p.topk;
  const int len = __ldg(p.topk_len + t);
  return len < 0 ? 0 : (len < p.topk ? len : p.topk);
}

// Writes x as MMA operands: x ~= hi + lo with both in Element (lo only when kSplit).
template <typename Element, bool kSplit>
__device__ __forceinline__ void store_split2(Element* hi, Element* lo, float x0, float x1) {
  const uint32_t h = pack2<Element>(x0, x1);
  *reinterpret_cast<uint32_t*>(hi) = h;
  if constexpr (kSplit) {
    const Element* he = reinterpret_cast<const Element*>(&h);
    *reinterpret_cast<uint32_t*>(lo) =
        pack2<Element>(x0 - static_cast<float>(he[0]), x1 - static_cast<float>(he[1]));
  }
}

// kSmemBytes is a template argument so that the launch size is in the kernel's name in the
// binary: tools/check_resources.py reads it back with cuobjdump (SPEC §3.2).
template <typename Traits, int kSmemBytes>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    sparse_mla_fwd_kernel(const SparseMlaFwdParams p) {
  static_assert(kSmemBytes == Traits::kSmemBytes);
  using Element = typename Traits::Element;
  using QElement = typename Traits::QElement;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kBlockH = Traits::kBlockH;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kPitch = Traits::kSmemPitch;
  constexpr int kTpr = Traits::kThreadsPerRow;
  constexpr int kStages = Traits::kStages;
  constexpr int kPParts = Traits::kPParts;

  extern __shared__ __align__(128) uint8_t smem[];
  Element* sQ = reinterpret_cast<Element*>(smem + Traits::kSmemQOffset);  // [kQParts][16][pitch]
  Element* sKV = reinterpret_cast<Element*>(smem + Traits::kSmemKVOffset);
  float* sS = reinterpret_cast<float*>(smem + Traits::kSmemSOffset);
  Element* sP = reinterpret_cast<Element*>(smem + Traits::kSmemPOffset);  // [kPBuffers][16][pitch]
  float* sAlpha = reinterpret_cast<float*>(smem + Traits::kSmemStatsOffset);
  float* sL = sAlpha + kBlockH;
  int* sValid = reinterpret_cast<int*>(smem + Traits::kSmemValidOffset);
  float* sScale = reinterpret_cast<float*>(smem + Traits::kSmemScaleOffset);  // [kBlockN][4]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int num_head_groups = (p.num_heads + kBlockH - 1) / kBlockH;
  const int t = blockIdx.x / num_head_groups;
  const int h0 = (blockIdx.x % num_head_groups) * kBlockH;
  const int split = blockIdx.y;

  // This block's KV tiles.
  const int topk_t = token_topk(p, t);
  const int num_tiles_t = (topk_t + kBlockN - 1) / kBlockN;
  const int tile_begin = split * p.tiles_per_split;
  int tile_end = tile_begin + p.tiles_per_split;
  tile_end = tile_end < num_tiles_t ? tile_end : num_tiles_t;
  const int num_tiles = tile_end > tile_begin ? tile_end - tile_begin : 0;

  // Gather role: thread (row, sub) moves chunks sub, sub + kTpr, ... of row `row` of each tile.
  const int g_row = tid / kTpr;
  const int g_sub = tid % kTpr;
  const int32_t* idx_ptr = p.indices + static_cast<int64_t>(t) * p.indices_stride_t;
  auto row_index = [&](int tile) -> int64_t {  // -1 when masked
    const int j = (tile_begin + tile) * kBlockN + g_row;
    if (j >= topk_t) return -1;
    const int64_t r = __ldg(idx_ptr + j);
    return (r >= 0 && r < p.num_kv_rows) ? r : -1;
  };

  // Q: 16 heads x D into shared memory (zeros for heads past num_heads).
  {
    const int h = tid / 8;
    const bool h_ok = h0 + h < p.num_heads;
    const int64_t hh = h_ok ? h0 + h : 0;
    const QElement* qn = static_cast<const QElement*>(p.q_nope) + t * p.q_nope_stride_t + hh * p.q_nope_stride_h;
    const QElement* qp = p.q_pe == nullptr ? qn
                         : static_cast<const QElement*>(p.q_pe) + t * p.q_pe_stride_t + hh * p.q_pe_stride_h;
#pragma unroll
    for (int c = tid % 8; c < kD / 8; c += 8) {
      const int col = c * 8;
      const QElement* src = col < p.q_nope_dim ? qn + col : qp + (col - p.q_nope_dim);
      Element* dst = sQ + h * kPitch + col;
      if constexpr (!Traits::kQConvert) {
        cp_async_16(dst, src, h_ok);
      } else {
        // 8 values: bf16 -> fp16, or fp16 -> bf16 hi + lo (second Q copy).
        const uint4 raw = h_ok ? __ldg(reinterpret_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
        const QElement* v = reinterpret_cast<const QElement*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; i += 2)
          store_split2<Element, Traits::kQSplit>(dst + i, dst + Traits::kBlockH * kPitch + i,
                                                 static_cast<float>(v[i]), static_cast<float>(v[i + 1]));
      }
    }
  }

  // fp8_e4m3: S and O carry the per-tensor scale, applied in fp32.
  float tensor_scale = 1.f;
  if constexpr (Traits::kFormat == KvFormat::kFp8E4m3) {
    if (p.k_scale != nullptr) tensor_scale = __ldg(p.k_scale);
  }
  const float score_scale = p.sm_scale_log2 * tensor_scale;

  // fp8 register path: the tile in flight.
  using Loader = std::conditional_t<Traits::kDirectCopy, int, Fp8RowLoader<Traits>>;
  Loader loader;
  int64_t next_row = num_tiles > 0 ? row_index(0) : -1;
  // Issue the gather of `tile` into `stage` (cp.async) or into registers.
  auto issue_tile = [&](int tile, int stage) {
    const int64_t r = next_row;
    next_row = tile + 1 < num_tiles ? row_index(tile + 1) : -1;
    const bool valid = tile < num_tiles && r >= 0;
    const uint8_t* row = p.kv + (valid ? r : 0) * p.kv_row_stride;
    if constexpr (Traits::kDirectCopy) {
      Element* dst = sKV + stage * (kBlockN * kPitch) + g_row * kPitch;
#pragma unroll
      for (int c = g_sub; c < kD / 8; c += kTpr) cp_async_16(dst + c * 8, row + c * 16, valid);
      if (g_sub == 0) sValid[stage * kBlockN + g_row] = valid;
    } else {
      loader.load(row, valid, g_sub);
    }
  };
  auto store_tile = [&]() {  // fp8 path: decode the tile held in registers into stage 0
    if constexpr (!Traits::kDirectCopy) {
      loader.store(sKV + g_row * kPitch, sScale + g_row * 4, g_sub);
      if (g_sub == 0) sValid[g_row] = loader.valid;
    }
  };

  // Softmax role: thread owns head tid / 8 and 4 scores of each tile; keeps the running max (m,
  // base-2 scaled) and sum (l) in registers.
  const int sm_h = tid / 8;
  const int sm_k = (tid % 8) * 4;
  float m_run = -INFINITY, l_run = 0.f;

  float acc_o[Traits::kDvPerWarp / 8][4];
#pragma unroll
  for (int n = 0; n < Traits::kDvPerWarp / 8; ++n) acc_o[n][0] = acc_o[n][1] = acc_o[n][2] = acc_o[n][3] = 0.f;

  // Prologue.
  if constexpr (Traits::kDirectCopy) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      issue_tile(s, s);
      cp_async_commit();
    }
  } else {
    cp_async_commit();  // Q
    issue_tile(0, 0);
    store_tile();
    issue_tile(1, 0);
  }

  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % kStages;
    if constexpr (Traits::kDirectCopy) cp_async_wait<kStages - 1>();
    else cp_async_wait<0>();
    __syncthreads();
    const Element* sK = sKV + stage * (kBlockN * kPitch);

    // 1. S = Q K^T for this warp's 8 rows. fp8_ds_mla: one partial sum per 128-column scale
    //    tile, scaled per row (key) in fp32; the bf16 rope part has scale 1.
    {
      float acc_s[4] = {0.f, 0.f, 0.f, 0.f};
      const Element* q_base = sQ + (lane % 16) * kPitch + (lane / 16) * 8;
      const Element* k_base = sK + (warp * 8 + lane % 8) * kPitch + (lane / 8) * 8;
      constexpr int kSegment = Traits::kDsMla ? kDsMlaTile / 16 : kD / 16;  // k-steps per segment
#pragma unroll
      for (int seg = 0; seg < kD / 16; seg += kSegment) {
        float part[4] = {0.f, 0.f, 0.f, 0.f};
        const int seg_end = seg + kSegment < kD / 16 ? seg + kSegment : kD / 16;
#pragma unroll 4
        for (int kk = seg; kk < seg_end; kk += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, k_base + kk * 16);
#pragma unroll
          for (int part_q = 0; part_q < Traits::kQParts; ++part_q) {
            uint32_t a0[4], a1[4];
            ldmatrix_x4(a0, q_base + part_q * kBlockH * kPitch + kk * 16);
            ldmatrix_x4(a1, q_base + part_q * kBlockH * kPitch + kk * 16 + 16);
            mma_16816<Element>(part, a0, b[0], b[1]);
            mma_16816<Element>(part, a1, b[2], b[3]);
          }
        }
        if constexpr (Traits::kDsMla) {
          const int key = warp * 8 + (lane % 4) * 2;
          const int tile = seg * 16 / kDsMlaTile;
          const float s0 = tile < 4 ? sScale[key * 4 + tile] : 1.f;
          const float s1 = tile < 4 ? sScale[(key + 1) * 4 + tile] : 1.f;
          acc_s[0] += s0 * part[0];
          acc_s[1] += s1 * part[1];
          acc_s[2] += s0 * part[2];
          acc_s[3] += s1 * part[3];
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc_s[i] += part[i];
        }
      }
      const int r = lane / 4, c = warp * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(sS + r * Traits::kSPitch + c) = make_float2(acc_s[0], acc_s[1]);
      *reinterpret_cast<float2*>(sS + (r + 8) * Traits::kSPitch + c) = make_float2(acc_s[2], acc_s[3]);
    }
    __syncthreads();

    // 2. Online softmax over the tile.
    {
      const float4 s4 = *reinterpret_cast<const float4*>(sS + sm_h * Traits::kSPitch + sm_k);
      const int* valid = sValid + stage * kBlockN + sm_k;
      float x[4] = {s4.x, s4.y, s4.z, s4.w};
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[i] = valid[i] ? x[i] * score_scale : -INFINITY;
        tile_max = fmaxf(tile_max, x[i]);
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(~0u, tile_max, o));
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
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) psum += __shfl_xor_sync(~0u, psum, o);
      l_run = l_run * alpha + psum;
      m_run = m_new;
      // P for the MMA: fp8_ds_mla folds each row's scale for warp w's columns into P copy w.
#pragma unroll
      for (int w = 0; w < (Traits::kDsMla ? Traits::kNumWarps : 1); ++w) {
        float q4[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) q4[i] = Traits::kDsMla ? pr[i] * sScale[(sm_k + i) * 4 + w] : pr[i];
        Element* hi = sP + (w * kPParts) * Traits::kSmemPBufferElems + sm_h * Traits::kPPitch + sm_k;
        Element* lo = hi + Traits::kSmemPBufferElems;
        store_split2<Element, Traits::kPSplit>(hi, lo, q4[0], q4[1]);
        store_split2<Element, Traits::kPSplit>(hi + 2, lo + 2, q4[2], q4[3]);
      }
      if ((tid % 8) == 0) sAlpha[sm_h] = alpha;
    }
    __syncthreads();

    // 3. O = alpha * O + P V for this warp's 128 columns.
    {
      const float alpha0 = sAlpha[lane / 4], alpha1 = sAlpha[lane / 4 + 8];
#pragma unroll
      for (int n = 0; n < Traits::kDvPerWarp / 8; ++n) {
        acc_o[n][0] *= alpha0;
        acc_o[n][1] *= alpha0;
        acc_o[n][2] *= alpha1;
        acc_o[n][3] *= alpha1;
      }
      const Element* p_base = sP + ((Traits::kDsMla ? warp : 0) * kPParts) * Traits::kSmemPBufferElems +
                              (lane % 16) * Traits::kPPitch + (lane / 16) * 8;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[kPParts][4];
#pragma unroll
        for (int part = 0; part < kPParts; ++part)
          ldmatrix_x4(a[part], p_base + part * Traits::kSmemPBufferElems + kk * 16);
        const Element* v_base = sK + (kk * 16 + (lane % 8) + ((lane >> 3) & 1) * 8) * kPitch +
                                warp * Traits::kDvPerWarp + (lane >> 4) * 8;
#pragma unroll
        for (int n2 = 0; n2 < Traits::kDvPerWarp / 16; ++n2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_base + n2 * 16);
#pragma unroll
          for (int part = 0; part < kPParts; ++part) {
            mma_16816<Element>(acc_o[2 * n2], a[part], b[0], b[1]);
            mma_16816<Element>(acc_o[2 * n2 + 1], a[part], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with this stage, sS and sP

    if constexpr (Traits::kDirectCopy) {
      issue_tile(it + kStages, stage);
      cp_async_commit();
    } else if (it + 1 < num_tiles) {
      store_tile();
      issue_tile(it + 2, 0);
    }
  }
  cp_async_wait<0>();  // nothing may be in flight when the block exits

  // Epilogue: normalise and write out/lse, or the split's partial result.
  if ((tid % 8) == 0) {
    sL[sm_h] = l_run;
    const int h = h0 + sm_h;
    if (h < p.num_heads) {
      // lse in natural log: (m + log2 l) * ln 2, -inf when no slot of this range was valid.
      const float lse = l_run > 0.f ? (m_run + log2f(l_run)) * 0.69314718055994531f : -INFINITY;
      if (p.num_splits == 1)
        p.lse[t * p.lse_stride_t + h * p.lse_stride_h] = lse;
      else
        p.partial_lse[(static_cast<int64_t>(split) * p.num_tokens + t) * p.num_heads + h] = lse;
    }
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = lane / 4 + half * 8;
    const int h = h0 + r;
    if (h >= p.num_heads) continue;
    const float l = sL[r];
    const float inv = l > 0.f ? tensor_scale / l : 0.f;
    const int col0 = warp * Traits::kDvPerWarp + (lane % 4) * 2;
    if (p.num_splits == 1) {
      QElement* out = static_cast<QElement*>(p.out) + t * p.out_stride_t + static_cast<int64_t>(h) * p.out_stride_h;
#pragma unroll
      for (int n = 0; n < Traits::kDvPerWarp / 8; ++n)
        *reinterpret_cast<uint32_t*>(out + col0 + n * 8) =
            pack2<QElement>(acc_o[n][2 * half] * inv, acc_o[n][2 * half + 1] * inv);
    } else {
      float* out = p.partial_out + ((static_cast<int64_t>(split) * p.num_tokens + t) * p.num_heads + h) * kHeadSizeV;
#pragma unroll
      for (int n = 0; n < Traits::kDvPerWarp / 8; ++n)
        *reinterpret_cast<float2*>(out + col0 + n * 8) =
            make_float2(acc_o[n][2 * half] * inv, acc_o[n][2 * half + 1] * inv);
    }
  }
}

}  // namespace sparse_mla
