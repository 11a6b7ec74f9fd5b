// What handover.cu and ../2026-12-06-h100-racecheck-roles/roles.cu share: a CUDA error check for
// main(), the mbarrier's PTX (init, arrive, try_wait.parity on shared memory) and a busy loop.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mb_init(uint64_t* b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n) : "memory"); }
__device__ __forceinline__ void mb_arrive(uint64_t* b) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t* b, int parity) {
  asm volatile("{\n.reg .pred d;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 d, [%0], %1;\n@!d bra W_%=;\n}" ::"r"(sa(b)), "r"(parity) : "memory");
}

__device__ __noinline__ float busy(float x, int n) {
  for (int i = 0; i < n; ++i) x = x * 0.999f + 0.5f;
  return x * 1e-9f;
}
