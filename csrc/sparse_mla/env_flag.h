// The library's switches (SPARSE_MLA_*): on where the variable's value starts with 1. The Python
// package reads them by the same rule (envs.flag).
#pragma once

#include <cstdlib>

namespace sparse_mla {

inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '1';
}

}  // namespace sparse_mla
