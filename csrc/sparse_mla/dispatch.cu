// Run-time (dtype, format, head_size, heads) -> the instantiated kernel configuration.
#include "kernel_traits.h"
#include "launch.h"
#include "static_switch.h"

namespace sparse_mla {

namespace {

// Calls f(Traits{}) with the SparseMlaFwdTraits of (dtype, format, head_size, num_heads);
// head_size must be 512 or 576.
template <typename F>
auto with_fwd_traits(DType dtype, KvFormat format, int head_size, int num_heads, F&& f) {
  return SPARSE_MLA_DTYPE_SWITCH(dtype, Element, [&] {
    return SPARSE_MLA_FORMAT_SWITCH(format, kFormat, [&] {
      return SPARSE_MLA_HEADDIM_SWITCH(head_size, kHeadDim, [&] {
        return SPARSE_MLA_HEADGROUPS_SWITCH(head_groups_for(num_heads), kHeadGroups, [&] {
          return f(SparseMlaFwdTraits<Element, kFormat, kHeadDim, kHeadGroups>{});
        });
      });
    });
  });
}

bool instantiated_head_size(int head_size) { return head_size == kHeadSizeNoPE || head_size == kHeadSizeRoPE; }

}  // namespace

cudaError_t dispatch_sparse_mla_fwd(const SparseMlaFwdParams& p, DType dtype, KvFormat format,
                                    cudaStream_t stream) {
  if (!instantiated_head_size(p.head_size)) return cudaErrorInvalidValue;
  return with_fwd_traits(dtype, format, p.head_size, p.num_heads,
                         [&](auto traits) { return run_sparse_mla_fwd<decltype(traits)>(p, stream); });
}

int fwd_blocks_per_sm(DType dtype, KvFormat format, int head_size, int num_heads, FwdVariant variant) {
  if (!instantiated_head_size(head_size)) return variant == FwdVariant::kMain ? 1 : 0;
  return with_fwd_traits(dtype, format, head_size, num_heads,
                         [&](auto traits) { return sparse_mla_fwd_blocks_per_sm<decltype(traits)>(variant); });
}

}  // namespace sparse_mla
