// Definition of run_sparse_mla_fwd<Traits>: sets the dynamic shared-memory size, launches the
// forward kernel and, for a split launch, the combine kernel. Included only by the generated
// per-configuration .cu files, so each configuration compiles in its own translation unit.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>

#include "combine_kernel.cuh"
#include "launch.h"
#include "sparse_mla_fwd_kernel.cuh"

namespace sparse_mla {

// A positive value per CUDA device, computed once by query(device) (which returns 0 when it
// fails: nothing is cached and `fallback` is returned).
constexpr int kMaxCachedDevices = 64;
template <typename Query>
int cached_per_device(int (&cache)[kMaxCachedDevices], int fallback, Query&& query) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxCachedDevices) return fallback;
  if (cache[device] == 0) cache[device] = query(device);
  return cache[device] > 0 ? cache[device] : fallback;
}

// Whether the current device runs programmatic dependent launches (compute capability >= 9.0),
// unless SPARSE_MLA_DISABLE_PDL=1 is set (a plain second launch, for comparison or a driver
// that mishandles them).
inline bool device_has_programmatic_launch() {
  static const bool disabled = [] {
    const char* v = std::getenv("SPARSE_MLA_DISABLE_PDL");
    return v != nullptr && v[0] == '1';
  }();
  static int major_of[kMaxCachedDevices] = {};
  return !disabled && cached_per_device(major_of, 0, [](int device) {
           int major = 0;
           return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess ? major : 0;
         }) >= 9;
}

// Dynamic shared memory of a forward launch: the kernel's own, or with SPARSE_MLA_SM120_OCCUPANCY=1
// (a measuring aid) enough more that an SM with more shared memory than sm_120's 100 KB (sm_90:
// 228 KB) holds as many blocks of it as an sm_120 SM would, 1 KB reserved per block on both. The
// planner's occupancy query asks with the same size. Used to measure on a Hopper what a tile
// configuration's occupancy costs on the consumer cards (bench/NOTES.md v11).
inline int fwd_launch_smem_bytes(int smem) {
  static const bool emulate = [] {
    const char* v = std::getenv("SPARSE_MLA_SM120_OCCUPANCY");
    return v != nullptr && v[0] == '1';
  }();
  if (!emulate) return smem;
  constexpr int64_t kSm120SmemPerSm = 102400, kReservedPerBlock = 1024;
  static int per_sm_of[kMaxCachedDevices] = {};
  const int64_t per_sm = cached_per_device(per_sm_of, 0, [](int device) {
    int bytes = 0;
    return cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) == cudaSuccess ? bytes : 0;
  });
  if (per_sm <= kSm120SmemPerSm) return smem;
  return static_cast<int>((smem + kReservedPerBlock) * per_sm / kSm120SmemPerSm - kReservedPerBlock);
}

template <typename Traits>
cudaError_t run_sparse_mla_fwd(const SparseMlaFwdParams& p, cudaStream_t stream) {
  const int smem = fwd_launch_smem_bytes(Traits::kSmemBytes);
  auto kernel = sparse_mla_fwd_kernel<Traits, Traits::kSmemBytes>;
  // Above 48 KB dynamic shared memory must be opted into, per device; the call is cheap, legal
  // during stream capture, and repeating it keeps multi-GPU processes simple.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const int head_blocks = (p.num_heads + Traits::kBlockH - 1) / Traits::kBlockH;
  const dim3 grid(static_cast<unsigned>(p.num_tokens) * head_blocks, p.num_splits);
  kernel<<<grid, Traits::kNumThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1) return err;
  // The combine pass is launched as a programmatic dependent of the forward kernel where the GPU
  // has it (sm_90+): its blocks are scheduled while the forward kernel drains and wait in
  // griddepcontrol.wait for its results, which hides one launch latency (a few us at decode).
  // Its layout was planned (api.cpp combine_split_groups): four thread groups over the splits
  // at decode, one when the (token, head) rows fill the GPU.
  constexpr int kWide = kCombineDecodeSplitGroups;
  const bool wide = p.combine_split_groups == kWide;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(static_cast<int64_t>(p.num_tokens) * p.num_heads));
  config.blockDim = dim3(wide ? CombineConfig<kWide>::kThreads : CombineConfig<1>::kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  const bool pdl = device_has_programmatic_launch();
  config.attrs = pdl ? &attribute : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  using QElement = typename Traits::QElement;
  return wide ? cudaLaunchKernelEx(&config, sparse_mla_combine_kernel<QElement, kWide>, p)
              : cudaLaunchKernelEx(&config, sparse_mla_combine_kernel<QElement, 1>, p);
}

template <typename Traits>
int sparse_mla_fwd_blocks_per_sm() {
  static int blocks_of[kMaxCachedDevices] = {};
  return cached_per_device(blocks_of, 1, [](int) {
    const int smem = fwd_launch_smem_bytes(Traits::kSmemBytes);
    auto kernel = sparse_mla_fwd_kernel<Traits, Traits::kSmemBytes>;
    int blocks = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Traits::kNumThreads, smem) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; planning falls back to one block per SM
      return 0;
    }
    return blocks;
  });
}

}  // namespace sparse_mla
