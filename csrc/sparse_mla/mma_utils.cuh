// Warp-level primitives of the sm_80+ path: cp.async, ldmatrix, mma.sync.m16n8k16 (and the sm_89+
// e4m3 m16n8k32). Inline PTX so the same source builds for sm_80 .. sm_121a without CUTLASS.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace sparse_mla {

// The inline-PTX wrappers here are defined on the host instead by tests/emulation/cuda_emulation.h
// for the CPU emulation of the kernels (SPARSE_MLA_EMULATION).
#ifndef SPARSE_MLA_EMULATION
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination and reads nothing from src.
// .ca (through L1) rather than .cg: 4-7 % faster on the H200 for the gathered rows
// (bench/HISTORY.md, v4).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

// D (16x8 fp32) += A (16x16, row) * B (16x8, col).
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// D (16x8 fp32) += A (16x32 e4m3, row) * B (32x8 e4m3, col): the fp8 MMA, twice mma_16816's k per
// instruction. PTX has it from sm_89 only; older targets compile a trap, so callers check the GPU
// (and the image it runs) first.
__device__ __forceinline__ void mma_16832_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

#endif  // SPARSE_MLA_EMULATION

// Whether the device runs `kernel`, which calls mma_16832_e4m3, from an image compiled for
// sm_89+: cudaSuccess, cudaErrorNoKernelImageForDevice where the image is older (sm_80 code, or
// its PTX JIT-compiled for a newer GPU: the MMA would trap), or the attribute query's own error,
// which is then cleared so that it does not fail a later, unrelated launch check.
template <typename Kernel>
cudaError_t check_e4m3_mma_image(Kernel* kernel) {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  return attr.ptxVersion >= 89 && attr.binaryVersion >= 89 ? cudaSuccess : cudaErrorNoKernelImageForDevice;
}

#ifndef SPARSE_MLA_EMULATION
// 2^x by the SFU alone (ex2.approx.ftz): exp2f adds a range check and a squaring for results below
// 2^-126, which the softmax never needs (such a p is below bf16's and fp16's resolution of the row
// sum, which is at least 1). -inf gives 0, as exp2f.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Elementwise product of two packed fp16 pairs, rounded to nearest.
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Barrier of kThreads threads (whole warps) at named barrier kId (0 is __syncthreads').
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// As named_barrier_sync, for warps that reach the barrier from different places in the code (the
// roles of a warp-specialized body): bar.sync and __syncthreads are barrier.sync.aligned, which
// PTX leaves undefined unless every waiting warp executes the same instruction.
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync_unaligned() {
  asm volatile("barrier.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// Arrival at named barrier kId of kThreads threads, without waiting: the other side of a
// producer / consumer pair, whose waiting warps' bar.sync sees this thread's earlier shared-memory
// accesses performed (PTX ISA, bar / barrier).
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// mbarrier (sm_80+) in shared memory: init by one thread before a block barrier; arrive (release)
// and wait for the completion of the phase of parity `parity` (acquire) (PTX ISA, mbarrier).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, int parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SPARSE_MLA_MBARRIER_WAIT "try_wait"
#else  // sm_80-89: test_wait (try_wait is sm_90's)
#define SPARSE_MLA_MBARRIER_WAIT "test_wait"
#endif
  asm volatile("{\n.reg .pred done;\nwait_%=:\nmbarrier." SPARSE_MLA_MBARRIER_WAIT
               ".parity.shared::cta.b64 done, [%0], %1;\n@!done bra wait_%=;\n}\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(parity)
               : "memory");
#undef SPARSE_MLA_MBARRIER_WAIT
}
#endif  // SPARSE_MLA_EMULATION

// Two floats -> packed pair of Element (round to nearest).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

}  // namespace sparse_mla
