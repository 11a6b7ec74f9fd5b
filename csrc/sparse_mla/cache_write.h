// Cache writer for the formats vLLM cannot write itself (fp8 with head_size 512, fp8_ds_mla
// NoPE), and for every other format too: same slot convention and (block, offset) addressing as
// vLLM's concat_and_cache_mla.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "formats.h"

namespace sparse_mla {

struct ConcatAndCacheParams {
  const void* kv_c;  // [T, 512]
  int64_t kv_c_stride;
  const void* k_pe;  // [T, 64] or null (NoPE)
  int64_t k_pe_stride;
  uint8_t* kv_cache;
  int64_t kv_row_stride;    // bytes between rows of a block
  int64_t kv_block_stride;  // bytes between blocks (may exceed block_size rows: block-outer layouts)
  int64_t block_size;       // rows per block; slot s is row s % block_size of block s / block_size
  const int64_t* slot_mapping;  // [T], -1 = skip; slots outside [0, num_rows) are skipped too
  int64_t num_rows;
  const float* k_scale;    // fp8_e4m3: stored value = x / k_scale; null = 1
  int num_tokens;
};

// One block of 128 threads per token. fp8_ds_mla scales follow vLLM: max(amax / 448, FLT_MIN)
// per 128 values; NoPE records get zero rope bytes.
cudaError_t launch_concat_and_cache(const ConcatAndCacheParams& p, DType dtype, KvFormat format,
                                    cudaStream_t stream);

}  // namespace sparse_mla
