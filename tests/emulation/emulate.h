// The forward launch of one kernel configuration, emulated on the host (emulate_fwd.h), one
// translation unit per configuration (instantiation.cpp.in).
#pragma once

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
