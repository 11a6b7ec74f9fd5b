// Run-time (dtype, format, head_size, head groups) -> the instantiated kernel configuration.
#include "kernel_traits.h"
#include "launch.h"
#include "static_switch.h"

namespace sparse_mla {

namespace {

bool instantiated(int head_size, int head_groups) {
  const bool d_ok = head_size == kHeadSizeNoPE || head_size == kHeadSizeRoPE;
  return d_ok && head_groups >= 1 && head_groups <= kMaxHeadGroups;
}

}  // namespace

cudaError_t dispatch_sparse_mla_fwd(const SparseMlaFwdParams& p, DType dtype, KvFormat format,
                                    cudaStream_t stream) {
  if (!instantiated(p.head_size, p.head_groups)) return cudaErrorInvalidValue;
  return with_fwd_traits(dtype, format, p.head_size, p.head_groups,
                         [&](auto traits) { return run_sparse_mla_fwd<decltype(traits)>(p, stream); });
}

int fwd_blocks_per_sm(DType dtype, KvFormat format, int head_size, int head_groups, FwdVariant variant) {
  if (!instantiated(head_size, head_groups)) return variant == FwdVariant::kMain ? 1 : 0;
  return with_fwd_traits(dtype, format, head_size, head_groups,
                         [&](auto traits) { return sparse_mla_fwd_blocks_per_sm<decltype(traits)>(variant); });
}

}  // namespace sparse_mla
