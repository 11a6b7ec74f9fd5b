// The forward launch of one kernel configuration, emulated on the host (emulate_fwd.h), one
// translation unit per configuration (instantiation.cpp.in).
#pragma once

#include <cstdint>

#include "params.h"
#include "runtime.h"

namespace sparse_mla {

// Dynamic shared memory of the emulated block (sm_90's largest, above every kernel's).
constexpr size_t kEmulatedSmemBytes = 232448;
extern uint8_t smem[];

// The planned variant's kernel over its grid, then the combine kernel of a split launch
// (launch_template.cuh's launch_fwd, without CUDA), blocks in `schedule`. Throws
// emu::EmulationError.
template <typename Traits>
void emulate_fwd(const SparseMlaFwdParams& p, emu::Schedule schedule);

}  // namespace sparse_mla

// The argument structs, as tests/emulation/__init__.py mirrors them (ctypes).
// A host tensor as the checks see it (api.h TensorDesc). `defined` 0: absent (an empty tensor has
// a null data pointer, so that cannot tell).
struct EmuTensor {
  int32_t defined;
  const void* data;
  int32_t dtype;  // api.h ScalarType
  int32_t dim;
  int64_t sizes[4];
  int64_t strides[4];  // elements
  int64_t element_size;
};

struct EmuFwdArgs {
  EmuTensor q, q_pe, kv_cache, indices, topk_len, k_scale, out, lse;
  double sm_scale;
  int64_t topk;  // -1: indices.size(1)
  const char* kv_cache_dtype;
  int64_t block_heads;  // 16 or 32 (0: planned)
  int32_t variant;      // params.h FwdVariant
  int32_t num_splits;   // >= 1: splits of the top-k axis (the combine runs when > 1)
  int32_t combine_split_groups;  // 1 or kCombineDecodeSplitGroups, for split launches
  int32_t schedule;              // runtime.h emu::Schedule
};

struct EmuCacheArgs {
  EmuTensor kv_c, k_pe, kv_cache, slot_mapping, k_scale;
  const char* kv_cache_dtype;
  int32_t schedule;  // runtime.h emu::Schedule
};

extern "C" {
// emulate.cpp: 0, or 1 with a message in `error`.
int sparse_mla_emulate_fwd(const EmuFwdArgs* args, char* error, int error_size);
int sparse_mla_emulate_concat_and_cache(const EmuCacheArgs* args, char* error, int error_size);
}
