// C entry point of the kernel emulation, for tests/emulation/__init__.py (ctypes): the torch
// binding's path (argument checks and plan by api.cpp) with the launch emulated on the host, and
// the variant, split and combine layout chosen by the caller instead of the planner.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "api.h"
#include "cache_write_kernel.cuh"
#include "emulate.h"
#include "static_switch.h"

namespace sparse_mla {
alignas(128) uint8_t smem[kEmulatedSmemBytes];
}  // namespace sparse_mla

namespace {

sparse_mla::TensorDesc tensor_desc(const EmuTensor& t) {
  sparse_mla::TensorDesc d;
  d.defined = t.defined != 0;
  d.data = t.data;
  d.dtype = static_cast<sparse_mla::ScalarType>(t.dtype);
  d.dim = t.dim;
  for (int i = 0; i < 4; ++i) {
    d.sizes[i] = t.sizes[i];
    d.strides[i] = t.strides[i];
  }
  d.element_size = t.element_size;
  return d;
}

emu::Schedule checked_schedule(int32_t schedule) {
  if (schedule < 0 || schedule > 2) throw sparse_mla::ArgumentError("schedule must be 0, 1 or 2");
  return static_cast<emu::Schedule>(schedule);
}

}  // namespace

extern "C" {

// Runs the forward on host tensors: 0, or 1 with a message in `error` (a bad argument, named as
// the GPU path names it; a variant the configuration lacks; what the emulation found).
[[gnu::visibility("default")]] int sparse_mla_emulate_fwd(const EmuFwdArgs* args, char* error, int error_size) {
  using namespace sparse_mla;
  return emu::report_errors(error, error_size, [&] {
    SparseMlaFwdArgs a;
    a.q = tensor_desc(args->q);
    a.q_pe = tensor_desc(args->q_pe);
    a.kv_cache = tensor_desc(args->kv_cache);
    a.indices = tensor_desc(args->indices);
    a.topk_len = tensor_desc(args->topk_len);
    a.k_scale = tensor_desc(args->k_scale);
    a.out = tensor_desc(args->out);
    a.lse = tensor_desc(args->lse);
    a.sm_scale = args->sm_scale;
    a.topk = args->topk;
    a.kv_cache_dtype = args->kv_cache_dtype;
    a.block_heads = args->block_heads;
    const SparseMlaFwdLaunch launch = plan_sparse_mla_fwd(a, /*require_cuda=*/false, /*num_sms=*/1);
    if (launch.empty) return;
    SparseMlaFwdParams p = launch.params;
    p.variant = static_cast<FwdVariant>(args->variant);
    std::vector<float> partial_out, partial_lse;
    if (args->num_splits < 1 || args->num_splits > kMaxSplits)
      throw ArgumentError("num_splits must be in [1, " + std::to_string(kMaxSplits) + "]");
    if (args->num_splits > 1) {
      if (args->combine_split_groups != 1 && args->combine_split_groups != kCombineDecodeSplitGroups)
        throw ArgumentError("combine_split_groups must be 1 or " + std::to_string(kCombineDecodeSplitGroups));
      const int tiles = (p.topk + 31) / 32;
      p.num_splits = args->num_splits;
      p.tiles_per_split = (tiles + p.num_splits - 1) / p.num_splits;
      p.combine_split_groups = args->combine_split_groups;
      const size_t rows = static_cast<size_t>(p.num_tokens) * p.num_heads * p.num_splits;
      partial_out.assign(rows * kHeadSizeV, __builtin_nanf(""));
      partial_lse.assign(rows, __builtin_nanf(""));
      p.partial_out = partial_out.data();
      p.partial_lse = partial_lse.data();
    }
    const auto schedule = checked_schedule(args->schedule);
    with_fwd_traits(launch.dtype, launch.format, p.head_size, p.head_groups, [&](auto traits) {
      emulate_fwd<decltype(traits)>(p, schedule);
      return 0;
    });
  });
}

// The cache writer on host tensors (the torch binding's checks, cache_write_kernel.cuh's kernel,
// one block of 128 threads per token): 0, or 1 with a message in `error`.
[[gnu::visibility("default")]] int sparse_mla_emulate_concat_and_cache(const EmuCacheArgs* args, char* error, int error_size) {
  using namespace sparse_mla;
  return emu::report_errors(error, error_size, [&] {
    ConcatAndCacheArgs a;
    a.kv_c = tensor_desc(args->kv_c);
    a.k_pe = tensor_desc(args->k_pe);
    a.kv_cache = tensor_desc(args->kv_cache);
    a.slot_mapping = tensor_desc(args->slot_mapping);
    a.k_scale = tensor_desc(args->k_scale);
    a.kv_cache_dtype = args->kv_cache_dtype;
    const ConcatAndCacheLaunch launch = check_concat_and_cache(a, /*require_cuda=*/false);
    const ConcatAndCacheParams& p = launch.params;
    if (p.num_tokens == 0) return;
    const auto schedule = checked_schedule(args->schedule);
    SPARSE_MLA_DTYPE_SWITCH(launch.dtype, Element, [&] {
      SPARSE_MLA_FORMAT_SWITCH(launch.format, kFormat, [&] {
        emu::run_grid(dim3(p.num_tokens), dim3(kConcatAndCacheThreads), nullptr, 0,
                      [&] { concat_and_cache_kernel<Element, kFormat>(p); }, schedule);
      });
    });
  });
}

}  // extern "C"
