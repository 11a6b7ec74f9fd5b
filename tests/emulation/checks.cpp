// Small kernels that test the emulation itself (tests/test_emulation.py): its ldmatrix and MMA
// fragments against a plain matrix product, and that it reports what it exists to catch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "mma_utils.cuh"
#include "runtime.h"

namespace {

using sparse_mla::ldmatrix_x2;
using sparse_mla::ldmatrix_x4;
using sparse_mla::ldmatrix_x4_trans;
using sparse_mla::mma_16816;

alignas(128) uint8_t g_smem[64 * 1024];

// One warp: D = A B + C with A (16 x 16) row-major and B (16 x 8) stored as 16 rows of 8 (k x n,
// read with ldmatrix .trans) or as B^T (8 rows of 16, read without), C = 1. Returns the largest
// difference from the same product in double.
template <typename Element>
double mma_error(bool b_transposed_in_smem) {
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal;
  // A and B are staged here and copied into shared memory by the kernel (which starts on NaN).
  static Element hA[16 * 16], hB[16 * 8];
  Element* sA = reinterpret_cast<Element*>(g_smem);
  Element* sB = sA + 16 * 16;
  float* sD = reinterpret_cast<float*>(sB + 16 * 8);
  float A[16][16], B[16][8];
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      hA[r * 16 + c] = Element(normal(gen));
      A[r][c] = static_cast<float>(hA[r * 16 + c]);
    }
  }
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 8; ++n) {
      const Element v(normal(gen));
      B[k][n] = static_cast<float>(v);
      if (b_transposed_in_smem) hB[n * 16 + k] = v;
      else hB[k * 8 + n] = v;
    }
  }
  emu::run_grid(dim3(1), dim3(32), g_smem, 16 * 16 * 2 + 16 * 8 * 2 + 16 * 8 * 4, [&] {
    const int lane = threadIdx.x;
    if (lane == 0) {
      std::memcpy(sA, hA, sizeof(hA));
      std::memcpy(sB, hB, sizeof(hB));
    }
    __syncthreads();
    uint32_t a[4], b[2];
    // A: matrices (rows 0-7, 8-15) x (columns 0-7, 8-15), in the fragment's register order.
    ldmatrix_x4(a, sA + (lane % 16) * 16 + (lane / 16) * 8);
    if (b_transposed_in_smem) {
      ldmatrix_x2(b, sB + (lane % 8) * 16 + ((lane / 8) % 2) * 8);
    } else {
      uint32_t r[4];
      ldmatrix_x4_trans(r, sB + (lane % 16) * 8);
      b[0] = r[0];
      b[1] = r[1];
    }
    float d[4] = {1.f, 1.f, 1.f, 1.f};
    mma_16816<Element>(d, a, b[0], b[1]);
    const int g = lane / 4, t = lane % 4;
    sD[g * 8 + 2 * t] = d[0];
    sD[g * 8 + 2 * t + 1] = d[1];
    sD[(g + 8) * 8 + 2 * t] = d[2];
    sD[(g + 8) * 8 + 2 * t + 1] = d[3];
  }, emu::Schedule::kLockstep);
  double worst = 0;
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 8; ++n) {
      double ref = 1.0;
      for (int k = 0; k < 16; ++k) ref += static_cast<double>(A[r][k]) * B[k][n];
      worst = std::fmax(worst, std::fabs(ref - sD[r * 8 + n]));
    }
  }
  return worst;
}

std::string run_check(const std::string& name) {
  if (name == "mma_bf16") return std::to_string(mma_error<__nv_bfloat16>(false));
  if (name == "mma_fp16") return std::to_string(mma_error<__half>(false));
  if (name == "mma_fp16_b_rows") return std::to_string(mma_error<__half>(true));
  if (name == "shuffles") {
    int ok = 1;
    emu::run_grid(dim3(1), dim3(64), nullptr, 0, [&] {
      const int lane = threadIdx.x % 32;
      const int x = __shfl_xor_sync(~0u, lane, 5), s = __shfl_sync(~0u, lane * 3, 7);
      const int d = __shfl_down_sync(~0u, lane, 4);
      const int all = __all_sync(~0u, lane < 32), some = __all_sync(~0u, lane != 9);
      const int any = __any_sync(~0u, lane == 9), none = __any_sync(~0u, lane > 31);
      const int m = __reduce_max_sync(~0u, lane == 13 ? 100 : -lane);
      const int or_ = __syncthreads_or(threadIdx.x == 40);
      if (x != (lane ^ 5) || s != 21 || d != (lane < 28 ? lane + 4 : lane) || !all || some || !any || none || m != 100 || !or_) ok = 0;
    }, emu::Schedule::kLockstep);
    return ok ? "ok" : "wrong";
  }
  // What the emulation must refuse (each returns its message).
  auto error_of = [](emu::Schedule schedule, const std::function<void()>& body) -> std::string {
    try {
      emu::run_grid(dim3(2), dim3(64), g_smem, 1024, body, schedule);
    } catch (const emu::EmulationError& e) {
      return e.what();
    }
    return "no error";
  };
  if (name == "shuffle_after_exit") {  // half a warp gone: the GPU would hang or be undefined
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x % 32 < 16) return;
      (void)__shfl_xor_sync(~0u, 1, 1);
    });
  }
  if (name == "named_barrier_short") {
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x < 32) sparse_mla::named_barrier_sync<1, 64>();
    });
  }
  if (name == "divergent_warp_ops") {
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x % 32 < 16) {
        (void)__shfl_xor_sync(~0u, 1, 1);
      } else {
        uint32_t r[2];
        ldmatrix_x2(r, g_smem);
      }
    });
  }
  if (name == "divergent_barrier_sites") {  // bar.sync is .aligned: one call site per warp
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x % 2) {
        __syncthreads();
      } else {
        __syncthreads();
      }
    });
  }
  if (name == "barrier_sites_across_warps") {  // .aligned: one instruction for the whole block
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x < 32) {
        __syncthreads();
      } else {
        __syncthreads();
      }
    });
  }
  if (name == "unaligned_barrier_sites_across_warps") {  // barrier.sync: roles may wait apart
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x < 32) {
        sparse_mla::named_barrier_sync_unaligned<0, 64>();
      } else {
        sparse_mla::named_barrier_sync_unaligned<0, 64>();
      }
    });
  }
  if (name == "roles_pass_different_barriers") {  // racecheck's order, not PTX's
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x < 32) sparse_mla::named_barrier_sync<1, 32>();
      sparse_mla::named_barrier_sync_unaligned<0, 64>();
    });
  }
  if (name == "roles_pass_as_many_barriers") {
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x < 32) {
        sparse_mla::named_barrier_sync<1, 32>();
      } else {
        sparse_mla::named_barrier_sync<2, 32>();
      }
      sparse_mla::named_barrier_sync_unaligned<0, 64>();
    });
  }
  if (name == "named_barrier_with_exited_lanes") {  // a warp arrives with its live threads
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x >= 48) return;
      sparse_mla::named_barrier_sync<1, 64>();
    });
  }
  if (name == "barrier_arrived_twice") {  // the second arrival would count towards the same barrier
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x >= 32) {
        sparse_mla::named_barrier_arrive<1, 64>();
        sparse_mla::named_barrier_arrive<1, 64>();
      } else {
        sparse_mla::named_barrier_sync<1, 64>();
      }
    });
  }
  if (name == "barrier_arrival_never_completed") {
    return error_of(emu::Schedule::kLockstep, [] {
      if (threadIdx.x >= 32) sparse_mla::named_barrier_arrive<1, 64>();
    });
  }
  if (name == "mbarrier_before_init") {
    return error_of(emu::Schedule::kLockstep, [] { sparse_mla::mbarrier_arrive(reinterpret_cast<uint64_t*>(g_smem)); });
  }
  if (name == "mbarrier_init_misaligned" || name == "mbarrier_init_no_arrivals") {
    const bool misaligned = name == "mbarrier_init_misaligned";
    return error_of(emu::Schedule::kLockstep, [misaligned] {
      uint64_t* bar = reinterpret_cast<uint64_t*>(g_smem + (misaligned ? 4 : 0));
      if (threadIdx.x == 0) sparse_mla::mbarrier_init(bar, misaligned ? 32 : 0);
    });
  }
  if (name == "mbarrier_arrival_never_completed") {  // 32 of the 64 arrivals its phase needs
    return error_of(emu::Schedule::kLockstep, [] {
      uint64_t* bar = reinterpret_cast<uint64_t*>(g_smem);
      if (threadIdx.x == 0) sparse_mla::mbarrier_init(bar, 64);
      __syncthreads();
      if (threadIdx.x >= 32) sparse_mla::mbarrier_arrive(bar);
    });
  }
  if (name == "mbarrier_never_completes") {  // a wait for a phase that lacks an arrival: a hang
    return error_of(emu::Schedule::kLockstep, [] {
      uint64_t* bar = reinterpret_cast<uint64_t*>(g_smem);
      if (threadIdx.x == 0) sparse_mla::mbarrier_init(bar, 33);
      __syncthreads();
      if (threadIdx.x >= 32) sparse_mla::mbarrier_arrive(bar);
      else sparse_mla::mbarrier_wait_parity(bar, 0);
    });
  }
  if (name == "ldmatrix_misaligned") {
    return error_of(emu::Schedule::kLockstep, [] {
      uint32_t r[2];
      ldmatrix_x2(r, g_smem + 8 + (threadIdx.x % 16) * 16);
    });
  }
  if (name == "copy_in_flight_at_exit") {
    static uint8_t src[64 * 16];
    return error_of(emu::Schedule::kLockstep, [] {
      sparse_mla::cp_async_16(g_smem + threadIdx.x * 16, src + threadIdx.x * 16, true);
      sparse_mla::cp_async_commit();
    });
  }
  if (name == "copy_read_before_wait" || name == "copy_read_after_wait") {
    static uint8_t src[64 * 16];
    std::memset(src, 0x3c, sizeof(src));  // fp16 1.0 pairs
    const bool wait = name == "copy_read_after_wait";
    int nan = 0;
    error_of(emu::Schedule::kLockstep, [&] {
      sparse_mla::cp_async_16(g_smem + threadIdx.x * 16, src + threadIdx.x * 16, true);
      sparse_mla::cp_async_commit();
      if (wait) sparse_mla::cp_async_wait<0>();
      __syncthreads();
      const __half v = reinterpret_cast<const __half*>(g_smem)[(threadIdx.x * 8 + 24) % 512];
      if (std::isnan(static_cast<float>(v))) ++nan;
      sparse_mla::cp_async_wait<0>();
    });
    return std::to_string(nan);
  }
  // Per schedule (lockstep, warps ahead, warps ahead reversed): the stale reads counted by `read`
  // ("n "), or with `errors` also the emulation's error ("error: n; ").
  auto per_schedule = [&](bool errors, const std::function<void(float*, int&)>& read) {
    std::string seen;
    for (auto schedule : {emu::Schedule::kLockstep, emu::Schedule::kWarpsAhead, emu::Schedule::kWarpsAheadReversed}) {
      int stale = 0;
      const std::string error = error_of(schedule, [&] { read(reinterpret_cast<float*>(g_smem), stale); });
      seen += errors ? error + ": " + std::to_string(stale) + "; " : std::to_string(stale) + " ";
    }
    return seen;
  };
  auto stale_per_schedule = [&](const std::function<void(float*, int&)>& read) { return per_schedule(false, read); };
  if (name == "missing_barrier") {
    // Warp 1 reads what warp 0 writes with no barrier between: only a schedule that lets warp 1
    // run ahead shows it.
    return stale_per_schedule([](float* s, int& stale) {
      if (threadIdx.x < 32) s[threadIdx.x] = 1.f;
      (void)__shfl_xor_sync(~0u, 0, 1);
      if (threadIdx.x >= 32 && s[threadIdx.x - 32] != 1.f) ++stale;
    });
  }
  if (name == "arrive_handoff") {
    // Warp 1 writes, then arrives at barrier 1 without waiting; warp 0 waits there, then reads.
    // Two rounds, a block barrier between them: the named barrier completes and starts again.
    // Warp 1 passes a barrier of its own, so that both reach the block barrier having passed one.
    return per_schedule(true, [](float* s, int& stale) {
      for (int round = 0; round < 2; ++round) {
        if (threadIdx.x >= 32) {
          s[threadIdx.x - 32 + 32 * round] = 1.f + round;
          sparse_mla::named_barrier_arrive<1, 64>();
          sparse_mla::named_barrier_sync<2, 32>();
        } else {
          sparse_mla::named_barrier_sync<1, 64>();
          if (s[threadIdx.x + 32 * round] != 1.f + round) ++stale;
        }
        __syncthreads();
      }
    });
  }
  if (name == "arrive_before_the_read") {
    // Warp 1 arrives, then reads what warp 0 writes once its wait at the barrier is over: only
    // the schedule in which an arrival waits for the barrier's waiters shows the read too late.
    return stale_per_schedule([](float* s, int& stale) {
      s[threadIdx.x] = 1.f;
      __syncthreads();
      if (threadIdx.x >= 32) {
        sparse_mla::named_barrier_arrive<1, 64>();
        if (s[threadIdx.x - 32] != 1.f) ++stale;
      } else {
        sparse_mla::named_barrier_sync<1, 64>();
        s[threadIdx.x] = 2.f;
      }
    });
  }
  if (name == "mbarrier_handoff" || name == "mbarrier_wrong_parity") {
    // As arrive_handoff, with an mbarrier of 32 arrivals (warp 1's), three rounds: warp 0 waits
    // for the phase of parity round % 2 (or, wrongly, of the other parity, which has completed).
    const int flip = name == "mbarrier_wrong_parity";
    return per_schedule(true, [flip](float* s, int& stale) {
      uint64_t* bar = reinterpret_cast<uint64_t*>(s);
      s += 4;
      if (threadIdx.x == 0) sparse_mla::mbarrier_init(bar, 32);
      __syncthreads();
      for (int round = 0; round < 3; ++round) {
        if (threadIdx.x >= 32) {
          s[threadIdx.x - 32 + 32 * round] = 1.f + round;
          sparse_mla::mbarrier_arrive(bar);
        } else {
          sparse_mla::mbarrier_wait_parity(bar, (round + flip) % 2);
          if (s[threadIdx.x + 32 * round] != 1.f + round) ++stale;
        }
        __syncthreads();  // the writer at most one phase ahead: parity tells the phases apart
      }
    });
  }
  if (name == "mbarrier_arrive_before_the_read") {
    // As arrive_before_the_read, with an mbarrier: the arrival placed before warp 1's read.
    return stale_per_schedule([](float* s, int& stale) {
      uint64_t* bar = reinterpret_cast<uint64_t*>(s);
      s += 4;
      s[threadIdx.x] = 1.f;
      if (threadIdx.x == 0) sparse_mla::mbarrier_init(bar, 32);
      __syncthreads();
      if (threadIdx.x >= 32) {
        sparse_mla::mbarrier_arrive(bar);
        if (s[threadIdx.x - 32] != 1.f) ++stale;
      } else {
        sparse_mla::mbarrier_wait_parity(bar, 0);
        s[threadIdx.x] = 2.f;
      }
    });
  }
  if (name == "missing_warp_sync") {
    // Lane l reads what lane l - 1 wrote, with no warp operation between: only the schedule that
    // runs a warp's lanes from the last shows it.
    return stale_per_schedule([](float* s, int& stale) {
      s[threadIdx.x] = 1.f;
      if (threadIdx.x % 32 > 0 && s[threadIdx.x - 1] != 1.f) ++stale;
    });
  }
  return "unknown check " + name;
}

}  // namespace

extern "C" [[gnu::visibility("default")]] int sparse_mla_emulator_check(const char* name, char* result, int result_size) {
  return emu::report_errors(result, result_size,
                            [&] { std::snprintf(result, static_cast<size_t>(result_size), "%s", run_check(name).c_str()); });
}
