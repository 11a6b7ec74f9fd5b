// The two ceilings the benchmark reports against, measured with the project's own
// small kernels in the same run: random-row gather bandwidth, and the mma.sync bf16 peak.
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

// Register-only loop of mma.sync.m16n8k16 bf16 -> fp32 on every SM; each warp performs
// iters * 8 MMAs (4096 FLOP each). `sink` (one float per warp) keeps the results live.
cudaError_t launch_mma_sync_peak(float* sink, int num_blocks, int iters, cudaStream_t stream);
constexpr int kPeakWarpsPerBlock = 8;
constexpr int kPeakMmasPerIter = 8;

}  // namespace sparse_mla
