// The CUDA built-ins the sparse-MLA kernels use, defined on the host, so that the kernels'
// own source (csrc/sparse_mla/*.cuh) runs on a CPU: each CUDA thread is a fiber, a block's
// fibers run on one host thread, and every warp-wide operation (shuffles, votes, ldmatrix,
// mma.sync) and barrier is completed by the scheduler once all the threads it needs have reached
// it (runtime.cpp). Force-included (-include) before the kernel headers, with SPARSE_MLA_EMULATION
// defined, which makes mma_utils.cuh leave its inline-PTX wrappers to this file.
//
// What it checks beyond the kernels' results: a barrier or warp operation that cannot complete
// (a hang on the GPU), warp operations whose lanes disagree, cp.async data read before its
// wait_group (the destination holds NaN bytes until then), copies still in flight when a thread
// exits. What it does not model: timing, and races beyond those (the GPU's racecheck does).
// Fragment layouts follow the PTX ISA's figures for ldmatrix and mma.m16n8k16.
#pragma once

#ifndef SPARSE_MLA_EMULATION
#error "cuda_emulation.h is for the host emulation build (SPARSE_MLA_EMULATION)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define __launch_bounds__(...)

namespace emu {

// The running CUDA thread's indices (runtime.cpp sets them per fiber).
struct ThreadIndex {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
const ThreadIndex& current();

// Where in the kernels' source an operation is called: lanes must agree on it for barriers,
// ldmatrix and mma (.aligned in PTX). From default arguments, so code the compiler duplicates
// keeps its site.
struct Site {
  const char* file;
  int line;
  bool operator!=(const Site& o) const { return line != o.line || std::strcmp(file, o.file) != 0; }
};
#define EMU_SITE_ARG ::emu::Site site = {__builtin_FILE(), __builtin_LINE()}

// Block-wide barrier `id` of `count` threads (count 0: every thread of the block that has not
// exited, as __syncthreads), reached from `site`; returns the OR of the threads' `predicate`.
// `aligned` (bar.sync, barrier.sync.aligned): every warp waiting at it must be at the same site.
int barrier(int id, int count, int predicate, const Site& site, bool aligned = true);
// bar.arrive: the calling thread counts towards named barrier `id` of `count` threads and goes on
// (in Schedule::kWarpsAhead only once the barrier completed and the waiting warps went on). A
// thread that arrives again before the barrier completed, and arrivals that no barrier completed
// by the block's end, are errors.
void barrier_arrive(int id, int count);
// mbarrier in shared memory (mbarrier.init / arrive / try_wait.parity, .cta): a phase completes
// with its `count`-th arrival; a wait for the phase of `parity` goes on once that phase completed
// (at once if it has). As with bar.arrive, in Schedule::kWarpsAhead an arriving thread goes on only
// once its phase completed and the waiting threads went on. Use before init, and arrivals that
// completed no phase by the block's end, are errors.
void mbarrier_init(void* bar, int count);
void mbarrier_arrive(void* bar);
void mbarrier_wait_parity(void* bar, int parity);

// Warp-wide operations: the calling lane posts its operands and sleeps until all 32 lanes of its
// warp have posted the same kind of operation, which the scheduler then completes for all.
enum class WarpOpKind { kShfl, kAll, kReduceMax, kLdmatrix, kMma };
struct WarpOp {
  WarpOpKind kind;
  uint32_t value = 0;       // shfl, all, reduce_max: this lane's operand
  int src_lane = 0;         // shfl: the lane to read (its own when out of range)
  uint32_t* result = nullptr;
  // ldmatrix: this lane's row address, the number of 8x8 b16 matrices, transposed or not.
  const void* address = nullptr;
  int matrices = 0;
  bool trans = false;
  uint32_t* regs = nullptr;
  // mma.m16n8k16, fp32 accumulators: this lane's A (4 registers), B (2) and D fragments.
  const uint32_t* a = nullptr;
  uint32_t b[2] = {0, 0};
  float* d = nullptr;
  bool bf16 = false;
};
// `site` must be the same in every lane for ldmatrix and mma (.aligned).
void warp_op(WarpOp& op, const Site& site = {"", 0});

// cp.async of one thread: copies queue in groups and land at cp.async.wait_group.
void cp_async(void* dst, const void* src, int bytes);
void cp_async_commit();
void cp_async_wait(int pending);

[[noreturn]] void fail(const char* what);

inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace emu

#define threadIdx (::emu::current().thread_idx)
#define blockIdx (::emu::current().block_idx)
#define blockDim (::emu::current().block_dim)
#define gridDim (::emu::current().grid_dim)

inline void __syncthreads(EMU_SITE_ARG) { emu::barrier(0, 0, 0, site); }
inline int __syncthreads_or(int predicate, EMU_SITE_ARG) { return emu::barrier(0, 0, predicate != 0, site); }
[[noreturn]] inline void __trap() { emu::fail("__trap() reached"); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

inline float __int_as_float(int x) { return emu::from_bits(static_cast<uint32_t>(x)); }
inline int __float_as_int(float x) { return static_cast<int>(emu::bits(x)); }
inline float __uint_as_float(unsigned x) { return emu::from_bits(x); }
inline unsigned __float_as_uint(float x) { return emu::bits(x); }

// Byte s of the 8 bytes {y, x} (x the low word) for each selector nibble's low 3 bits (CUDA's
// __byte_perm; PTX prmt's bit 3 would replicate the sign, which __byte_perm does not use).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}

namespace emu {
inline void require_full_mask(unsigned mask) {
  if (mask != ~0u) fail("a warp operation with a partial mask (the kernels use full warps only)");
}
template <typename T>
T shfl(unsigned mask, T var, int src_lane) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  require_full_mask(mask);
  uint32_t v, r;
  std::memcpy(&v, &var, 4);
  WarpOp op{WarpOpKind::kShfl};
  op.value = v;
  op.src_lane = src_lane;
  op.result = &r;
  warp_op(op);
  T out;
  std::memcpy(&out, &r, 4);
  return out;
}
inline int lane_id() { return static_cast<int>(current().thread_idx.x % 32); }
}  // namespace emu

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  if (width != 32) emu::fail("__shfl_sync with width != 32");
  return emu::shfl(mask, var, src_lane & 31);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  if (width != 32) emu::fail("__shfl_xor_sync with width != 32");
  return emu::shfl(mask, var, emu::lane_id() ^ lane_mask);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  if (width != 32) emu::fail("__shfl_down_sync with width != 32");
  const int src = emu::lane_id() + static_cast<int>(delta & 31);
  return emu::shfl(mask, var, src < 32 ? src : emu::lane_id());
}
inline int __all_sync(unsigned mask, int predicate) {
  emu::require_full_mask(mask);
  uint32_t r;
  emu::WarpOp op{emu::WarpOpKind::kAll};
  op.value = predicate != 0;
  op.result = &r;
  emu::warp_op(op);
  return static_cast<int>(r);
}
inline int __any_sync(unsigned mask, int predicate) { return !__all_sync(mask, predicate == 0); }
inline int __reduce_max_sync(unsigned mask, int value) {
  emu::require_full_mask(mask);
  uint32_t r;
  emu::WarpOp op{emu::WarpOpKind::kReduceMax};
  op.value = static_cast<uint32_t>(value);
  op.result = &r;
  emu::warp_op(op);
  return static_cast<int>(r);
}
// The unsigned overload is not emulated: it would order otherwise (redux.sync.max.u32).
unsigned __reduce_max_sync(unsigned mask, unsigned value) = delete;

// mma_utils.cuh's inline-PTX wrappers, on the host.
namespace sparse_mla {

inline void cp_async_16(void* smem, const void* gmem, bool valid) { emu::cp_async(smem, gmem, valid ? 16 : 0); }
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int N>
void cp_async_wait() {
  emu::cp_async_wait(N);
}

inline void ldmatrix(uint32_t* r, const void* smem, int matrices, bool trans, const emu::Site& site) {
  emu::WarpOp op{emu::WarpOpKind::kLdmatrix};
  op.address = smem;
  op.matrices = matrices;
  op.trans = trans;
  op.regs = r;
  emu::warp_op(op, site);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem, EMU_SITE_ARG) { ldmatrix(r, smem, 4, false, site); }
inline void ldmatrix_x2(uint32_t (&r)[2], const void* smem, EMU_SITE_ARG) { ldmatrix(r, smem, 2, false, site); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem, EMU_SITE_ARG) { ldmatrix(r, smem, 4, true, site); }

template <typename Element>
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, EMU_SITE_ARG) {
  emu::WarpOp op{emu::WarpOpKind::kMma};
  op.a = a;
  op.b[0] = b0;
  op.b[1] = b1;
  op.d = d;
  op.bf16 = std::is_same_v<Element, __nv_bfloat16>;
  emu::warp_op(op, site);
}
// The e4m3 MMA (sm_89+, the measuring variant E4m3Pv) is not emulated.
inline void mma_16832_e4m3(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) {
  emu::fail("mma_16832_e4m3: the e4m3 MMA is not emulated");
}

// ex2.approx.ftz: results below the smallest normal flush to zero.
inline float exp2_ftz(float x) {
  const float y = std::exp2(x);
  return std::fabs(y) < 1.17549435e-38f ? 0.f : y;
}

// mul.rn.f16x2: the product of two fp16 values is exact in fp32, so one rounding to fp16.
inline uint32_t hmul2(uint32_t a, uint32_t b) {
  __half2 x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  const float2 fx = __half22float2(x), fy = __half22float2(y);
  const __half2 r = __floats2half2_rn(fx.x * fy.x, fx.y * fy.y);
  uint32_t out;
  std::memcpy(&out, &r, 4);
  return out;
}

template <int kId, int kThreads>
void named_barrier_sync(EMU_SITE_ARG) {
  emu::barrier(kId, kThreads, 0, site);
}

template <int kId, int kThreads>
void named_barrier_sync_unaligned(EMU_SITE_ARG) {
  emu::barrier(kId, kThreads, 0, site, false);
}

template <int kId, int kThreads>
void named_barrier_arrive() {
  emu::barrier_arrive(kId, kThreads);
}

inline void mbarrier_init(uint64_t* bar, int count) { emu::mbarrier_init(bar, count); }
inline void mbarrier_arrive(uint64_t* bar) { emu::mbarrier_arrive(bar); }
inline void mbarrier_wait_parity(uint64_t* bar, int parity) { emu::mbarrier_wait_parity(bar, parity); }

// max.f32 on the GPU returns the other operand for any NaN, signalling ones too; the host's
// fmaxf returns NaN for a signalling NaN. The kernels' unqualified calls find this one first.
inline float fmaxf(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? b : a;  // +0 over -0
  return a > b ? a : b;
}

}  // namespace sparse_mla
