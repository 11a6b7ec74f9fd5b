// emulate.h's emulate_fwd, for the per-configuration translation units.
#pragma once

#include <string>

#include "combine_kernel.cuh"
#include "emulate.h"
#include "sparse_mla_fwd_kernel.cuh"

namespace sparse_mla {

template <typename Traits>
void emulate_fwd(const SparseMlaFwdParams& p, emu::Schedule schedule) {
  with_variant<Traits>(
      p.variant,
      [&](auto traits) {
        using T = decltype(traits);
        emu::run_grid(fwd_grid<T>(p), dim3(T::kNumThreads), smem, T::kSmemBytes,
                      [&] { sparse_mla_fwd_kernel<T, T::kSmemBytes>(p); }, schedule);
      },
      [&] {
        throw emu::EmulationError("variant " + std::to_string(static_cast<int>(p.variant)) +
                                  " (params.h FwdVariant) does not exist for this configuration");
      });
  if (p.num_splits == 1) return;
  with_combine_kernel<typename Traits::QElement>(p, [&](auto kernel, dim3 grid, dim3 block) {
    emu::run_grid(grid, block, smem, 0, [&] { kernel(p); }, schedule);
    return 0;
  });
}

}  // namespace sparse_mla
