// Device helpers shared by the forward kernel families (sparse_mla_fwd_kernel.cuh,
// sparse_mla_fwd_wide.cuh).
#pragma once

#include "params.h"

namespace sparse_mla {

// Number of slots token t may use: topk, cut by topk_len[t] when given.
__device__ __forceinline__ int token_topk(const SparseMlaFwdParams& p, int t) {
  if (p.topk_len == nullptr) return p.topk;
  const int len = __ldg(p.topk_len + t);
  return len < 0 ? 0 : (len < p.topk ? len : p.topk);
}

}  // namespace sparse_mla
