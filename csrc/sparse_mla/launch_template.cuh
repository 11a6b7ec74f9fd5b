// Definition of run_sparse_mla_fwd<Traits>: sets the dynamic shared-memory size, launches the
// forward kernel and, for a split launch, the combine kernel. Included only by the generated
// per-configuration .cu files, so each configuration compiles in its own translation unit.
#pragma once

#include <cuda_runtime.h>

#include "combine_kernel.cuh"
#include "launch.h"
#include "sparse_mla_fwd_kernel.cuh"

namespace sparse_mla {

template <typename Traits>
cudaError_t run_sparse_mla_fwd(const SparseMlaFwdParams& p, cudaStream_t stream) {
  constexpr int kSmem = Traits::kSmemBytes;
  auto kernel = sparse_mla_fwd_kernel<Traits, kSmem>;
  // Above 48 KB dynamic shared memory must be opted into, per device; the call is cheap, legal
  // during stream capture, and repeating it keeps multi-GPU processes simple.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const int num_head_groups = (p.num_heads + Traits::kBlockH - 1) / Traits::kBlockH;
  const dim3 grid(static_cast<unsigned>(p.num_tokens) * num_head_groups, p.num_splits);
  kernel<<<grid, Traits::kNumThreads, kSmem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1) return err;
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.num_heads;
  sparse_mla_combine_kernel<typename Traits::QElement>
      <<<static_cast<unsigned>(rows), kCombineThreads, p.num_splits * sizeof(float), stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sparse_mla
