// Definition of run_sparse_mla_fwd<Traits>: sets the dynamic shared-memory size, launches the
// forward kernel and, for a split launch, the combine kernel. Included only by the generated
// per-configuration .cu files, so each configuration compiles in its own translation unit.
#pragma once

#include <cuda_runtime.h>

#include "combine_kernel.cuh"
#include "env_flag.h"
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

// The value of cudaDeviceGetAttribute(attribute) for the current device, cached (0 when the
// query fails).
template <cudaDeviceAttr kAttribute>
int device_attribute() {
  static int value_of[kMaxCachedDevices] = {};
  return cached_per_device(value_of, 0, [](int device) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, kAttribute, device) == cudaSuccess ? value : 0;
  });
}

// Whether the current device runs programmatic dependent launches (compute capability >= 9.0),
// unless SPARSE_MLA_DISABLE_PDL=1 is set (a plain second launch, for comparison or a driver
// that mishandles them).
inline bool device_has_programmatic_launch() {
  static const bool disabled = env_flag("SPARSE_MLA_DISABLE_PDL");
  return !disabled && device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9;
}

// Dynamic shared memory of a forward launch, in bytes: the kernel's own `smem`, or with
// SPARSE_MLA_SM120_OCCUPANCY=1 (a measuring aid, read once) enough more that an SM with more
// shared memory than sm_120's (sm_90: 228 KB) holds as many blocks of it as an sm_120 SM would,
// the reserved 1 KB per block counted on both, and never more than a block may opt into. The
// planner's occupancy query asks with the same size. Without the two device attributes, the
// kernel's own size.
inline int fwd_launch_smem_bytes(int smem) {
  static const bool emulate = env_flag("SPARSE_MLA_SM120_OCCUPANCY");
  if (!emulate) return smem;
  const int64_t per_sm = device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>();
  const int64_t per_block = device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
  if (per_sm <= kSm120SmemPerSm || per_block < smem) return smem;
  const int64_t inflated = (smem + kSmemReservedPerBlock) * per_sm / kSm120SmemPerSm - kSmemReservedPerBlock;
  return static_cast<int>(inflated < per_block ? inflated : per_block);
}

template <typename Traits>
cudaError_t launch_fwd(const SparseMlaFwdParams& p, cudaStream_t stream) {
  if (p.num_splits < 1 || p.num_splits > kMaxSplits) return cudaErrorInvalidValue;  // the combine's lse registers
  const int smem = fwd_launch_smem_bytes(Traits::kSmemBytes);
  auto kernel = sparse_mla_fwd_kernel<Traits, Traits::kSmemBytes>;
  // Above 48 KB dynamic shared memory must be opted into, per device; the call is cheap, legal
  // during stream capture, and repeating it keeps multi-GPU processes simple.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  kernel<<<fwd_grid<Traits>(p), Traits::kNumThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1) return err;
  // The combine pass is launched as a programmatic dependent of the forward kernel where the GPU
  // has it (sm_90+): its blocks are scheduled while the forward kernel drains and wait in
  // griddepcontrol.wait for its results, which hides one launch latency (a few us at decode).
  // Its kernel, grid and block follow the plan (combine_kernel.cuh with_combine_kernel).
  cudaLaunchConfig_t config = {};
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  const bool pdl = device_has_programmatic_launch();
  config.attrs = pdl ? &attribute : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  return with_combine_kernel<typename Traits::QElement>(p, [&](auto kernel, dim3 grid, dim3 block) {
    config.gridDim = grid;
    config.blockDim = block;
    return cudaLaunchKernelEx(&config, kernel, p);
  });
}

template <typename Traits>
int blocks_per_sm_of() {
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

// A variant the configuration lacks runs its main kernel: the planner asks for the decode-once
// variant by rule (planner.h decoded_fp8_plan), which 16-bit caches do not have.
template <typename Traits>
cudaError_t run_sparse_mla_fwd(const SparseMlaFwdParams& p, cudaStream_t stream) {
  const auto launch = [&](auto traits) { return launch_fwd<decltype(traits)>(p, stream); };
  return with_variant<Traits>(p.variant, launch, [&] { return launch(Traits{}); });
}

// Whether the image this device loads of an E4m3Pv kernel has e4m3 MMAs (mma_utils.cuh).
template <typename Traits>
bool native_e4m3_mma() {
  static int native_of[kMaxCachedDevices] = {};
  return cached_per_device(native_of, 0, [](int) {
           return check_e4m3_mma_image(sparse_mla_fwd_kernel<Traits, Traits::kSmemBytes>) == cudaSuccess ? 1 : -1;
         }) > 0;
}

// Blocks per SM of `variant` of the configuration Traits; 0 where it has no such variant or, for
// E4m3Pv, where the device's image has no e4m3 MMA.
template <typename Traits>
int sparse_mla_fwd_blocks_per_sm(FwdVariant variant) {
  return with_variant<Traits>(
      variant,
      [](auto traits) {
        using T = decltype(traits);
        if constexpr (T::kE4m3Pv) {
          if (!native_e4m3_mma<T>()) return 0;
        }
        return blocks_per_sm_of<T>();
      },
      [] { return 0; });
}

}  // namespace sparse_mla
