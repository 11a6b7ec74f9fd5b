// The ceilings the benchmark reports against, measured with the project's own
// small kernels in the same run: random-row gather bandwidth, and the mma.sync bf16, fp16 and e4m3
// peaks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sparse_mla {

// Reads rows[indices[t, j]] (row_bytes each, 16-byte aligned) for every t < num_tokens,
// j < topk with 16-byte loads, as the attention kernel's gather does, and folds them into one
// checksum word per block (so nothing is optimised away and almost nothing is written).
cudaError_t launch_gather_rows(const uint8_t* rows, int64_t row_stride, int row_bytes, const int32_t* indices,
                               int num_tokens, int topk, uint32_t* checksum, int checksum_len,
                               cudaStream_t stream);

// The MMA a peak is measured for: bf16 m16n8k16 (sm_80+), e4m3 m16n8k32 (sm_89+), or fp16
// m16n8k16 (sm_80+: the fp16 cache's and the fp8 caches' MMA, beside bf16's).
enum class MmaPeakType { kBf16, kE4m3, kFp16 };
constexpr int64_t peak_flop_per_mma(MmaPeakType type) {
  return type == MmaPeakType::kE4m3 ? 2 * 16 * 8 * 32 : 2 * 16 * 8 * 16;  // 2 * m * n * k
}

// Register-only loop of mma.sync (fp32 accumulators) of `type` on every SM; each warp performs
// iters * 8 MMAs. `sink` (one float per warp) keeps the results live. kE4m3 returns
// cudaErrorNotSupported on a GPU below compute capability 8.9, and cudaErrorNoKernelImageForDevice
// where the image this GPU runs was compiled for an older target (its MMA is a trap), both before
// launching anything.
cudaError_t launch_mma_sync_peak(float* sink, int num_blocks, int iters, MmaPeakType type, cudaStream_t stream);
constexpr int kPeakWarpsPerBlock = 8;
constexpr int kPeakMmasPerIter = 8;

}  // namespace sparse_mla
