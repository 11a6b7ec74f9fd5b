// The cache writer's launch (cache_write.h); its kernel is cache_write_kernel.cuh.
#include "cache_write.h"

#include "cache_write_kernel.cuh"
#include "static_switch.h"

namespace sparse_mla {

cudaError_t launch_concat_and_cache(const ConcatAndCacheParams& p, DType dtype, KvFormat format,
                                    cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  return SPARSE_MLA_DTYPE_SWITCH(dtype, Element, [&] {
    return SPARSE_MLA_FORMAT_SWITCH(format, kFormat, [&] {
      concat_and_cache_kernel<Element, kFormat><<<p.num_tokens, kConcatAndCacheThreads, 0, stream>>>(p);
      return cudaGetLastError();
    });
  });
}

}  // namespace sparse_mla
