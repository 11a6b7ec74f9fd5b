// Run-time value -> compile-time constant, for the dispatch (after FlashAttention-2's
// static_switch.h). Each macro runs its lambda with the constant bound to the given name.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "formats.h"
#include "kernel_traits.h"

#define SPARSE_MLA_DTYPE_SWITCH(DTYPE, NAME, ...)                  \
  [&] {                                                           \
    if ((DTYPE) == ::sparse_mla::DType::kBFloat16) {              \
      using NAME = __nv_bfloat16;                                 \
      return __VA_ARGS__();                                       \
    } else {                                                      \
      using NAME = __half;                                        \
      return __VA_ARGS__();                                       \
    }                                                             \
  }()

#define SPARSE_MLA_FORMAT_SWITCH(FORMAT, NAME, ...)                                  \
  [&] {                                                                             \
    switch (FORMAT) {                                                               \
      case ::sparse_mla::KvFormat::kBFloat16: {                                     \
        constexpr ::sparse_mla::KvFormat NAME = ::sparse_mla::KvFormat::kBFloat16;  \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      case ::sparse_mla::KvFormat::kFloat16: {                                      \
        constexpr ::sparse_mla::KvFormat NAME = ::sparse_mla::KvFormat::kFloat16;   \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      case ::sparse_mla::KvFormat::kFp8E4m3: {                                      \
        constexpr ::sparse_mla::KvFormat NAME = ::sparse_mla::KvFormat::kFp8E4m3;   \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      default: {                                                                    \
        constexpr ::sparse_mla::KvFormat NAME = ::sparse_mla::KvFormat::kFp8DsMla;  \
        return __VA_ARGS__();                                                       \
      }                                                                             \
    }                                                                               \
  }()

#define SPARSE_MLA_HEADDIM_SWITCH(HEAD_SIZE, NAME, ...)       \
  [&] {                                                      \
    if ((HEAD_SIZE) == ::sparse_mla::kHeadSizeRoPE) {        \
      constexpr int NAME = ::sparse_mla::kHeadSizeRoPE;      \
      return __VA_ARGS__();                                  \
    } else {                                                 \
      constexpr int NAME = ::sparse_mla::kHeadSizeNoPE;      \
      return __VA_ARGS__();                                  \
    }                                                        \
  }()

#define SPARSE_MLA_HEADGROUPS_SWITCH(HEAD_GROUPS, NAME, ...) \
  [&] {                                                     \
    if ((HEAD_GROUPS) == 2) {                               \
      constexpr int NAME = 2;                               \
      return __VA_ARGS__();                                 \
    } else {                                                \
      constexpr int NAME = 1;                               \
      return __VA_ARGS__();                                 \
    }                                                       \
  }()

namespace sparse_mla {

// Calls f(Traits{}) with the SparseMlaFwdTraits of (dtype, format, head_size, head_groups);
// head_size must be 512 or 576, head_groups 1 or 2.
template <typename F>
auto with_fwd_traits(DType dtype, KvFormat format, int head_size, int head_groups, F&& f) {
  return SPARSE_MLA_DTYPE_SWITCH(dtype, Element, [&] {
    return SPARSE_MLA_FORMAT_SWITCH(format, kFormat, [&] {
      return SPARSE_MLA_HEADDIM_SWITCH(head_size, kHeadDim, [&] {
        return SPARSE_MLA_HEADGROUPS_SWITCH(head_groups, kHeadGroups, [&] {
          return f(SparseMlaFwdTraits<Element, kFormat, kHeadDim, kHeadGroups>{});
        });
      });
    });
  });
}

}  // namespace sparse_mla
