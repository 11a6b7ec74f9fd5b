// Run-time (dtype, format, head_size, heads) -> the instantiated kernel configuration.
#include "kernel_traits.h"
#include "launch.h"
#include "static_switch.h"

namespace sparse_mla {

cudaError_t dispatch_sparse_mla_fwd(const SparseMlaFwdParams& p, DType dtype, KvFormat format,
                                    cudaStream_t stream) {
  if (p.head_size != kHeadSizeNoPE && p.head_size != kHeadSizeRoPE) return cudaErrorInvalidValue;
  return SPARSE_MLA_DTYPE_SWITCH(dtype, Element, [&] {
    return SPARSE_MLA_FORMAT_SWITCH(format, kFormat, [&] {
      return SPARSE_MLA_HEADDIM_SWITCH(p.head_size, kHeadDim, [&] {
        return SPARSE_MLA_HEADGROUPS_SWITCH(head_groups_for(p.num_heads), kHeadGroups, [&] {
          return run_sparse_mla_fwd<SparseMlaFwdTraits<Element, kFormat, kHeadDim, kHeadGroups>>(p, stream);
        });
      });
    });
  });
}

int fwd_blocks_per_sm(DType dtype, KvFormat format, int head_size, int num_heads) {
  if (head_size != kHeadSizeNoPE && head_size != kHeadSizeRoPE) return 1;
  return SPARSE_MLA_DTYPE_SWITCH(dtype, Element, [&] {
    return SPARSE_MLA_FORMAT_SWITCH(format, kFormat, [&] {
      return SPARSE_MLA_HEADDIM_SWITCH(head_size, kHeadDim, [&] {
        return SPARSE_MLA_HEADGROUPS_SWITCH(head_groups_for(num_heads), kHeadGroups, [&] {
          return sparse_mla_fwd_blocks_per_sm<SparseMlaFwdTraits<Element, kFormat, kHeadDim, kHeadGroups>>();
        });
      });
    });
  });
}

}  // namespace sparse_mla
