#include "ceilings.h"

#include <type_traits>

#include "../sparse_mla/mma_utils.cuh"

namespace sparse_mla {

namespace {

constexpr int kGatherThreads = 256;
constexpr int kGatherRowsPerBlock = 32;

__global__ void __launch_bounds__(kGatherThreads)
    gather_rows_kernel(const uint8_t* rows, int64_t row_stride, int row_bytes, const int32_t* indices,
                       int topk, uint32_t* checksum, int checksum_len) {
  const int t = blockIdx.y;
  const int j0 = blockIdx.x * kGatherRowsPerBlock;
  const int chunks = row_bytes / 16;
  uint32_t acc = 0;
  // The block's rows x chunks as one flat range: consecutive threads read consecutive chunks.
  for (int i = threadIdx.x; i < kGatherRowsPerBlock * chunks; i += kGatherThreads) {
    const int j = j0 + i / chunks;
    if (j >= topk) break;
    const int64_t r = __ldg(indices + static_cast<int64_t>(t) * topk + j);
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(rows + r * row_stride) + i % chunks);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) checksum[(blockIdx.y * gridDim.x + blockIdx.x) % checksum_len] = acc;  // ~never
}

template <MmaPeakType kType>
__global__ void __launch_bounds__(kPeakWarpsPerBlock * 32) mma_peak_kernel(float* sink, int iters) {
  // Operands come from the thread index so the compiler cannot fold them.
  const uint32_t x = 0x3f803f80u ^ (threadIdx.x & 1);
  uint32_t a[4] = {x, x ^ 1u, x ^ 2u, x ^ 3u};
  float acc[kPeakMmasPerIter][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int m = 0; m < kPeakMmasPerIter; ++m) {
      if constexpr (kType == MmaPeakType::kE4m3) {
        // sm_90 has no e4m3 MMA: ptxas emulates it (e4m3 -> f16, two HMMA.16816, FADD) and hoists
        // repeated products out of the loop, so every MMA gets operands of its own (bytes XORed with
        // less than 0x40: never NaN).
        const uint32_t v = m | (it & 63) << 8;
        const uint32_t am[4] = {a[0] ^ v, a[1] ^ v, a[2] ^ v, a[3] ^ v};
        mma_16832_e4m3(acc[m], am, x ^ 4u ^ v, x ^ 5u ^ v);
      } else {
        mma_16816<std::conditional_t<kType == MmaPeakType::kFp16, __half, __nv_bfloat16>>(acc[m], a, x, x ^ 4u);
      }
    }
  }
  float s = 0.f;
#pragma unroll
  for (int m = 0; m < kPeakMmasPerIter; ++m) s += acc[m][0] + acc[m][1] + acc[m][2] + acc[m][3];
  if (s == 1.2345f) sink[blockIdx.x * kPeakWarpsPerBlock + threadIdx.x / 32] = s;  // keeps acc live
}

// Whether the current GPU can run the e4m3 loop: the instruction needs sm_89+, and the image the
// GPU loads must be compiled for such a target (a build for sm_80 alone also runs on an sm_89).
cudaError_t check_e4m3_mma() {
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  if (10 * major + minor < 89) return cudaErrorNotSupported;
  return check_e4m3_mma_image(mma_peak_kernel<MmaPeakType::kE4m3>);
}

}  // namespace

cudaError_t launch_gather_rows(const uint8_t* rows, int64_t row_stride, int row_bytes, const int32_t* indices,
                               int num_tokens, int topk, uint32_t* checksum, int checksum_len,
                               cudaStream_t stream) {
  const dim3 grid((topk + kGatherRowsPerBlock - 1) / kGatherRowsPerBlock, num_tokens);
  gather_rows_kernel<<<grid, kGatherThreads, 0, stream>>>(rows, row_stride, row_bytes, indices, topk, checksum,
                                                          checksum_len);
  return cudaGetLastError();
}

cudaError_t launch_mma_sync_peak(float* sink, int num_blocks, int iters, MmaPeakType type, cudaStream_t stream) {
  if (type == MmaPeakType::kE4m3) {
    const cudaError_t err = check_e4m3_mma();
    if (err != cudaSuccess) return err;
    mma_peak_kernel<MmaPeakType::kE4m3><<<num_blocks, kPeakWarpsPerBlock * 32, 0, stream>>>(sink, iters);
  } else if (type == MmaPeakType::kFp16) {
    mma_peak_kernel<MmaPeakType::kFp16><<<num_blocks, kPeakWarpsPerBlock * 32, 0, stream>>>(sink, iters);
  } else {
    mma_peak_kernel<MmaPeakType::kBf16><<<num_blocks, kPeakWarpsPerBlock * 32, 0, stream>>>(sink, iters);
  }
  return cudaGetLastError();
}

}  // namespace sparse_mla
