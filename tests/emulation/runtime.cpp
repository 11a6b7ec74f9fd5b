// The scheduler behind cuda_emulation.h: a block's threads are fibers (ucontext) on one host
// thread; each runs until it reaches a barrier or a warp operation, and those complete once every
// thread they need is there. Blocks of a grid run one after another.
#include "runtime.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace emu {

// ThreadSanitizer's view of the emulation (a -fsanitize=thread build, tests/emulation/race_check.cpp):
// every thread is a TSan fiber; the kernel's memory accesses are checked, the runtime's own
// bookkeeping (and the scheduler's) is not; a barrier, warp operation or mbarrier phase is an
// object that its arrivals release and its waiters acquire (one per generation), so TSan reports
// two threads' accesses that no barrier orders, as racecheck would on the GPU. Nothing otherwise.
namespace {
namespace tsan {
#if defined(__SANITIZE_THREAD__)
struct Ignore {
  Ignore() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~Ignore() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
};
void release(const void* sync) { __tsan_release(const_cast<void*>(sync)); }
void acquire(const void* sync) { __tsan_acquire(const_cast<void*>(sync)); }
void* create_fiber() { return __tsan_create_fiber(0); }
void destroy_fiber(void* fiber) { __tsan_destroy_fiber(fiber); }
void* current_fiber() { return __tsan_get_current_fiber(); }
void switch_to(void* fiber) { __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync); }
#else
struct Ignore {
  Ignore() {}  // user-provided: no unused-variable warning where it is all a guard does
};
void release(const void*) {}
void acquire(const void*) {}
void* create_fiber() { return nullptr; }
void destroy_fiber(void*) {}
void* current_fiber() { return nullptr; }
void switch_to(void*) {}
#endif
}  // namespace tsan
}  // namespace

void check_shared_16(const void* p, const char* what);

namespace {

enum class Wait { kNone, kBarrier, kWarp, kArrived, kMbarrier, kDone };

struct Copy {
  uint8_t* dst;
  const uint8_t* src;
  int bytes;  // 0: zero-fill
};

struct Fiber {
  ucontext_t context;
  ThreadIndex index;
  Wait wait = Wait::kNone;
  bool started = false;
  int barrier_id = 0, barrier_count = 0, predicate = 0, barrier_result = 0;
  bool barrier_aligned = true;  // bar.sync (.aligned) rather than barrier.sync
  int barriers_passed = 0;       // bar.sync / barrier.sync waits completed (racecheck's order)
  bool held_after_arrival = false;  // kArrived, released once the waiting warps have gone on
  // kMbarrier: the mbarrier waited at and the parity of the phase awaited; kArrived at an
  // mbarrier (barrier_id -1): it and the phase arrived in.
  const void* mbarrier = nullptr;
  int awaited_parity = 0;
  int arrival_phase = 0;
  Site site{"", 0};  // of the barrier or warp operation it waits at
  WarpOp* op = nullptr;
  void* tsan_fiber = nullptr;
  const void* sync = nullptr;  // the generation of the barrier or warp operation it waits at
  std::vector<Copy> open;                  // cp.async since the last commit
  std::deque<std::vector<Copy>> groups;    // committed, oldest first
};

constexpr size_t kStackBytes = 256 * 1024;

struct Block {
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;
  ucontext_t scheduler;
  Fiber* running = nullptr;
  const std::function<void()>* body = nullptr;
  std::string error;
  uint8_t* smem = nullptr;  // the block's dynamic shared memory
  size_t smem_bytes = 0;
  bool reversed_lanes = false;
  bool lagging_arrivals = false;  // Schedule::kWarpsAhead: bar.arrive waits (runtime.h)
  // bar.arrive: per named barrier, the lanes of each warp that arrived since it last completed,
  // and the thread count they gave (0: none arrived).
  uint32_t arrived[16][32] = {};
  int arrive_count[16] = {};
  struct Mbarrier {
    int count, pending, phase;
    const void* phase_sync = nullptr;            // the phase in progress
    const void* completed_sync[2] = {nullptr, nullptr};  // the last completed phase of each parity
  };
  std::map<const void*, Mbarrier> mbarriers;  // by address, from mbarrier.init
  // TSan sync objects: a new one per generation (stable addresses), of each named barrier and
  // each warp's warp operations; the scheduler's fiber.
  std::deque<char> sync_pool;
  const void* barrier_sync[16] = {};
  std::vector<const void*> warp_sync;
  void* scheduler_fiber = nullptr;
};

Block g_block;
char g_block_start, g_block_end;  // TSan: what came before a block, and what it did, in order

const void* new_sync() {
  g_block.sync_pool.push_back(0);
  return &g_block.sync_pool.back();
}

[[noreturn]] void abort_block(const std::string& what) { throw EmulationError(what); }

std::string where(const Fiber& f) {
  return "block (" + std::to_string(f.index.block_idx.x) + ", " + std::to_string(f.index.block_idx.y) + ") thread " +
         std::to_string(f.index.thread_idx.x);
}

void suspend(Wait wait) {
  Fiber* f = g_block.running;
  f->wait = wait;
  tsan::switch_to(g_block.scheduler_fiber);
  swapcontext(&f->context, &g_block.scheduler);
  if (!g_block.error.empty()) throw EmulationError(g_block.error);  // unwinding a failed block
}

void trampoline() {
  Fiber* f = g_block.running;
  tsan::acquire(&g_block_start);
  try {
    (*g_block.body)();
    tsan::Ignore ignore;
    if ((!f->open.empty() || !f->groups.empty()) && g_block.error.empty())
      g_block.error = "cp.async copies still in flight when " + where(*f) + " exited";
  } catch (const std::exception& e) {  // anything else would end the host process
    tsan::Ignore ignore;
    if (g_block.error.empty()) g_block.error = e.what();
  }
  tsan::release(&g_block_end);
  {
    tsan::Ignore ignore;
    f->wait = Wait::kDone;
  }
  tsan::switch_to(g_block.scheduler_fiber);
  swapcontext(&f->context, &g_block.scheduler);
}

uint16_t half_bits_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

float element_to_float(uint16_t v, bool bf16) {
  if (bf16) return from_bits(static_cast<uint32_t>(v) << 16);
  __half h;
  std::memcpy(&h, &v, 2);
  return __half2float(h);
}

// ldmatrix: lane l's address is row l % 8 of matrix l / 8; lane l receives, of each matrix, the
// b16 pair (row l / 4, columns 2 (l % 4) + {0, 1}), or with .trans (rows 2 (l % 4) + {0, 1},
// column l / 4).
void complete_ldmatrix(Fiber* lanes) {
  const int matrices = lanes[0].op->matrices;
  for (int l = 0; l < 32; ++l) {
    if (lanes[l].op->matrices != matrices || lanes[l].op->trans != lanes[0].op->trans)
      abort_block("ldmatrix: the lanes of a warp disagree on its shape (" + where(lanes[l]) + ")");
  }
  for (int l = 0; l < 8 * matrices; ++l) check_shared_16(lanes[l].op->address, "ldmatrix");
  for (int l = 0; l < 32; ++l) {
    const int row = l / 4, col = 2 * (l % 4);
    for (int m = 0; m < matrices; ++m) {
      uint16_t e[2];
      for (int k = 0; k < 2; ++k) {
        const int r = lanes[0].op->trans ? col + k : row;
        const int c = lanes[0].op->trans ? row : col + k;
        const uint8_t* base = static_cast<const uint8_t*>(lanes[m * 8 + r].op->address);
        e[k] = half_bits_at(base + 2 * c);
      }
      lanes[l].op->regs[m] = e[0] | (static_cast<uint32_t>(e[1]) << 16);
    }
  }
}

// mma.m16n8k16.row.col, g = lane / 4, t = lane % 4: A registers (g, 2t), (g + 8, 2t), (g, 2t + 8),
// (g + 8, 2t + 8), each with the next column; B registers (k 2t, n g), (k 2t + 8, n g), each with
// the next k; C/D (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). Products exact, summed in
// double, rounded once to fp32.
void complete_mma(Fiber* lanes) {
  const bool bf16 = lanes[0].op->bf16;
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const WarpOp& op = *lanes[l].op;
    if (op.bf16 != bf16) abort_block("mma: the lanes of a warp disagree on its type (" + where(lanes[l]) + ")");
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int r = g + (i & 1) * 8, c = 2 * t + (i >> 1) * 8;
      A[r][c] = element_to_float(op.a[i] & 0xffff, bf16);
      A[r][c + 1] = element_to_float(op.a[i] >> 16, bf16);
    }
    for (int i = 0; i < 2; ++i) {
      const int k = 2 * t + i * 8;
      B[k][g] = element_to_float(op.b[i] & 0xffff, bf16);
      B[k + 1][g] = element_to_float(op.b[i] >> 16, bf16);
    }
    C[g][2 * t] = op.d[0];
    C[g][2 * t + 1] = op.d[1];
    C[g + 8][2 * t] = op.d[2];
    C[g + 8][2 * t + 1] = op.d[3];
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int r = g + (i >> 1) * 8, c = 2 * t + (i & 1);
      double acc = C[r][c];
      for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[r][k]) * B[k][c];
      lanes[l].op->d[i] = static_cast<float>(acc);
    }
  }
}

void complete_warp(Fiber* lanes) {
  const WarpOpKind kind = lanes[0].op->kind;
  const bool aligned = kind == WarpOpKind::kLdmatrix || kind == WarpOpKind::kMma;
  for (int l = 1; l < 32; ++l) {
    if (lanes[l].op->kind != kind || (aligned && lanes[l].site != lanes[0].site))
      abort_block("the lanes of a warp wait at different warp operations (" + where(lanes[0]) + ", " +
                  where(lanes[l]) + ")");
  }
  switch (kind) {
    case WarpOpKind::kShfl: {
      uint32_t v[32];
      for (int l = 0; l < 32; ++l) v[l] = lanes[l].op->value;
      for (int l = 0; l < 32; ++l) *lanes[l].op->result = v[lanes[l].op->src_lane & 31];
      break;
    }
    case WarpOpKind::kAll: {
      uint32_t all = 1;
      for (int l = 0; l < 32; ++l) all &= lanes[l].op->value;
      for (int l = 0; l < 32; ++l) *lanes[l].op->result = all;
      break;
    }
    case WarpOpKind::kReduceMax: {
      int32_t m = static_cast<int32_t>(lanes[0].op->value);
      for (int l = 1; l < 32; ++l) m = std::max(m, static_cast<int32_t>(lanes[l].op->value));
      for (int l = 0; l < 32; ++l) *lanes[l].op->result = static_cast<uint32_t>(m);
      break;
    }
    case WarpOpKind::kLdmatrix:
      complete_ldmatrix(lanes);
      break;
    case WarpOpKind::kMma:
      complete_mma(lanes);
      break;
  }
  for (int l = 0; l < 32; ++l) lanes[l].wait = Wait::kNone;
  g_block.warp_sync[(lanes - g_block.fibers.data()) / 32] = new_sync();
}

// Completes warp w's operation if all its lanes wait at one; returns whether it did.
bool complete_warp_op(size_t w) {
  Fiber* lanes = &g_block.fibers[w * 32];
  for (int l = 0; l < 32; ++l) {
    if (lanes[l].wait != Wait::kWarp) return false;
  }
  complete_warp(lanes);
  return true;
}

// Releases the barriers that have every warp they need; returns whether any was. As bar.sync: a
// warp arrives when all its threads that have not exited are there (at one call site), barrier 0
// (__syncthreads) needs every warp with such threads, a named barrier count / 32 warps. An aligned
// barrier (bar.sync, __syncthreads) is one instruction for every warp that waits at it: PTX leaves
// warps that wait at one generation from different places undefined.
bool complete_barriers() {
  auto& fibers = g_block.fibers;
  const size_t warps = fibers.size() / 32;
  bool progressed = false;
  for (int id = 0; id < 16; ++id) {
    int arrived = 0, live_warps = 0, count = g_block.arrive_count[id] > 0 ? g_block.arrive_count[id] : -1, any = 0;
    const Fiber* first = nullptr;  // a waiting thread of the first warp that waits, for the aligned check
    for (size_t w = 0; w < warps; ++w) {
      int live = 0, here = 0;
      uint32_t done = 0;
      Site site{"", 0};
      for (size_t t = w * 32; t < w * 32 + 32; ++t) {
        const Fiber& f = fibers[t];
        if (f.wait == Wait::kDone) {
          done |= 1u << (t % 32);
          continue;
        }
        ++live;
        if (f.wait != Wait::kBarrier || f.barrier_id != id) continue;
        if (count >= 0 && f.barrier_count != count)
          abort_block("barrier " + std::to_string(id) + " reached with different thread counts");
        if (here > 0 && f.site != site)
          abort_block("the lanes of a warp wait at barrier " + std::to_string(id) + " from different call sites (" +
                      where(f) + ")");
        if (first == nullptr) {
          first = &f;
        } else if (here == 0 && f.site != first->site && (f.barrier_aligned || first->barrier_aligned)) {
          abort_block("warps wait at aligned barrier " + std::to_string(id) + " from different call sites (" +
                      where(*first) + " at line " + std::to_string(first->site.line) + "; " + where(f) +
                      " at line " + std::to_string(f.site.line) + ")");
        }
        count = f.barrier_count;
        site = f.site;
        ++here;
      }
      const uint32_t arrive_mask = g_block.arrived[id][w];
      if (arrive_mask != 0 && here > 0)
        abort_block("warp " + std::to_string(w) + " both arrives at and waits at barrier " + std::to_string(id));
      live_warps += live > 0;
      arrived += (live > 0 && here == live) || (arrive_mask != 0 && (arrive_mask | done) == ~0u);
    }
    if (count < 0) continue;
    const int need = count == 0 ? live_warps : count / 32;
    if (arrived > need) abort_block("barrier " + std::to_string(id) + ": more warps than its count");
    if (arrived < need) continue;
    // racecheck orders two warps' accesses by the barriers each has passed, so that a barrier of
    // every live warp orders what it should only if they all arrive having passed as many.
    const Fiber* waiter = nullptr;
    for (const Fiber& f : fibers) {
      if (f.wait != Wait::kBarrier || f.barrier_id != id) continue;
      any |= f.predicate;
      if (need == live_warps && waiter != nullptr && f.barriers_passed != waiter->barriers_passed)
        abort_block("warps reach barrier " + std::to_string(id) + ", which every warp waits at, having passed " +
                    std::to_string(waiter->barriers_passed) + " and " + std::to_string(f.barriers_passed) +
                    " barriers (" + where(*waiter) + "; " + where(f) +
                    "): racecheck reads accesses on either side of it as unordered");
      waiter = &f;
    }
    for (Fiber& f : fibers) {
      if (f.wait == Wait::kBarrier && f.barrier_id == id) {
        f.wait = Wait::kNone;
        f.barrier_result = any;
        ++f.barriers_passed;
      }
      // Lagging arrivals go on only in the next round, after the released waiters.
      if (f.wait == Wait::kArrived && f.barrier_id == id) f.held_after_arrival = true;
    }
    for (uint32_t& m : g_block.arrived[id]) m = 0;
    g_block.arrive_count[id] = 0;
    g_block.barrier_sync[id] = new_sync();
    progressed = true;
  }
  return progressed;
}

// Releases the threads whose mbarrier phase completed (waiters) and marks the lagging arrivals
// of completed phases (released in the next round); returns whether any waiter was released.
bool complete_mbarriers() {
  bool progressed = false;
  for (Fiber& f : g_block.fibers) {
    if (f.wait == Wait::kMbarrier && (g_block.mbarriers.at(f.mbarrier).phase & 1) != f.awaited_parity) {
      f.wait = Wait::kNone;
      progressed = true;
    }
    if (f.wait == Wait::kArrived && f.barrier_id < 0 && !f.held_after_arrival &&
        g_block.mbarriers.at(f.mbarrier).phase > f.arrival_phase)
      f.held_after_arrival = true;
  }
  return progressed;
}

// Lets the lagging arrivals of barriers that completed before this round go on; returns whether
// any did. The released waiters have had this round to run on.
bool release_arrivals() {
  bool any = false;
  for (Fiber& f : g_block.fibers) {
    if (f.wait == Wait::kArrived && f.held_after_arrival) {
      f.wait = Wait::kNone;
      f.held_after_arrival = false;
      any = true;
    }
  }
  return any;
}

// Runs each lane of warp w that can go on until it waits or exits; returns whether any ran.
bool run_lanes(size_t w) {
  bool ran = false;
  for (size_t i = 0; i < 32; ++i) {
    Fiber& f = g_block.fibers[w * 32 + (g_block.reversed_lanes ? 31 - i : i)];
    if (f.wait != Wait::kNone) continue;
    f.started = true;
    g_block.running = &f;
    tsan::switch_to(f.tsan_fiber);
    swapcontext(&g_block.scheduler, &f.context);
    g_block.running = nullptr;
    ran = true;
    if (!g_block.error.empty()) throw EmulationError(g_block.error);
  }
  return ran;
}

// One round of the schedule; returns whether any thread went on or any wait completed.
bool step(Schedule schedule) {
  const size_t warps = g_block.fibers.size() / 32;
  bool progressed = false;
  if (schedule == Schedule::kLockstep) {
    for (size_t w = 0; w < warps; ++w) progressed |= run_lanes(w);
    for (size_t w = 0; w < warps; ++w) progressed |= complete_warp_op(w);
  } else {
    for (size_t i = 0; i < warps; ++i) {
      const size_t w = schedule == Schedule::kWarpsAhead ? i : warps - 1 - i;
      for (;;) {
        const bool ran = run_lanes(w);
        if (!complete_warp_op(w) && !ran) break;
        progressed = true;
      }
    }
  }
  progressed |= release_arrivals();
  progressed |= complete_mbarriers();
  return complete_barriers() || progressed;
}

std::string describe_waits() {
  std::string s;
  int shown = 0;
  for (const Fiber& f : g_block.fibers) {
    if (f.wait == Wait::kDone || shown++ >= 8) continue;
    s += "; " + where(f) +
         (f.wait == Wait::kBarrier   ? " at barrier " + std::to_string(f.barrier_id)
          : f.wait == Wait::kMbarrier ? std::string(" at an mbarrier")
          : f.wait == Wait::kArrived && f.barrier_id < 0 ? std::string(" after its arrival at an mbarrier")
          : f.wait == Wait::kArrived ? " after its arrival at barrier " + std::to_string(f.barrier_id)
                                     : " at a warp op");
  }
  return s;
}

}  // namespace

const ThreadIndex& current() {
  tsan::Ignore ignore;
  return g_block.running->index;
}

[[noreturn]] void fail(const char* what) {
  tsan::Ignore ignore;
  abort_block(std::string(what) + (g_block.running ? " (" + where(*g_block.running) + ")" : ""));
}

int barrier(int id, int count, int predicate, const Site& site, bool aligned) {
  tsan::Ignore ignore;
  Fiber* f = g_block.running;
  f->site = site;
  f->barrier_aligned = aligned;
  f->barrier_id = id;
  f->barrier_count = count;
  f->predicate = predicate;
  f->sync = g_block.barrier_sync[id];
  tsan::release(f->sync);
  suspend(Wait::kBarrier);
  tsan::acquire(f->sync);
  return f->barrier_result;
}

void barrier_arrive(int id, int count) {
  tsan::Ignore ignore;
  Fiber* f = g_block.running;
  const unsigned t = f->index.thread_idx.x;
  if (id <= 0 || id >= 16 || count <= 0) fail("bar.arrive: a named barrier (1-15) with a thread count");
  if (g_block.arrive_count[id] != 0 && g_block.arrive_count[id] != count)
    fail(("barrier " + std::to_string(id) + " reached with different thread counts").c_str());
  uint32_t& mask = g_block.arrived[id][t / 32];
  if (mask & (1u << (t % 32)))
    fail(("arrived twice at barrier " + std::to_string(id) + " before it completed").c_str());
  mask |= 1u << (t % 32);
  g_block.arrive_count[id] = count;
  tsan::release(g_block.barrier_sync[id]);
  if (g_block.lagging_arrivals) {
    f->barrier_id = id;
    suspend(Wait::kArrived);
  }
}

namespace {
Block::Mbarrier& mbarrier_at(const void* bar) {
  const auto it = g_block.mbarriers.find(bar);
  if (it == g_block.mbarriers.end()) fail("mbarrier: used before mbarrier.init");
  return it->second;
}
}  // namespace

void mbarrier_init(void* bar, int count) {
  tsan::Ignore ignore;
  const auto* b = static_cast<const uint8_t*>(bar);
  if (reinterpret_cast<uintptr_t>(bar) % 8 != 0 || b < g_block.smem || b + 8 > g_block.smem + g_block.smem_bytes)
    fail("mbarrier.init: 8 bytes of the block's shared memory, 8-byte aligned");
  if (count <= 0) fail("mbarrier.init: a positive arrival count");
  std::memset(bar, 0, 8);  // its bytes are the barrier's, not NaN poison
  g_block.mbarriers[bar] = {count, count, 0, new_sync()};
}

void mbarrier_arrive(void* bar) {
  tsan::Ignore ignore;
  Block::Mbarrier& m = mbarrier_at(bar);
  Fiber* f = g_block.running;
  const int phase = m.phase;
  tsan::release(m.phase_sync);
  if (--m.pending == 0) {
    m.pending = m.count;
    m.completed_sync[m.phase & 1] = m.phase_sync;
    m.phase_sync = new_sync();
    ++m.phase;
  }
  if (g_block.lagging_arrivals) {
    f->barrier_id = -1;
    f->mbarrier = bar;
    f->arrival_phase = phase;
    suspend(Wait::kArrived);
  }
}

void mbarrier_wait_parity(void* bar, int parity) {
  tsan::Ignore ignore;
  Fiber* f = g_block.running;
  const Block::Mbarrier& m = mbarrier_at(bar);  // std::map: stays valid while the block runs
  if ((m.phase & 1) == (parity & 1)) {  // that phase has not completed
    f->mbarrier = bar;
    f->awaited_parity = parity & 1;
    suspend(Wait::kMbarrier);
  }
  tsan::acquire(m.completed_sync[parity & 1]);
}

void warp_op(WarpOp& op, const Site& site) {
#if defined(__SANITIZE_THREAD__)
  // ldmatrix: the lanes whose address is a row read it here, where TSan sees the reader (the
  // scheduler, which copies the rows out, is not checked).
  if (op.kind == WarpOpKind::kLdmatrix && current().thread_idx.x % 32 < 8u * static_cast<unsigned>(op.matrices)) {
    check_shared_16(op.address, "ldmatrix");
    for (int i = 0; i < 4; ++i) (void)*(static_cast<const volatile uint32_t*>(op.address) + i);
  }
#endif
  tsan::Ignore ignore;
  Fiber* f = g_block.running;
  f->site = site;
  f->op = &op;
  f->sync = g_block.warp_sync[f->index.thread_idx.x / 32];
  tsan::release(f->sync);
  suspend(Wait::kWarp);
  tsan::acquire(f->sync);
}

void check_shared_16(const void* p, const char* what) {
  tsan::Ignore ignore;
  const auto* b = static_cast<const uint8_t*>(p);
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0 || b < g_block.smem || b + 16 > g_block.smem + g_block.smem_bytes)
    fail((std::string(what) + ": a 16-byte row outside the block's shared memory or not 16-byte aligned").c_str());
}

// The destination holds NaN bytes (0xff: NaN in bf16, fp16 and e4m3) until the copy lands.
void cp_async(void* dst, const void* src, int bytes) {
  check_shared_16(dst, "cp.async");
  if (bytes != 0 && reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async: a source not 16-byte aligned");
  std::memset(dst, 0xff, 16);  // checked as a write at issue, and again where it lands
  tsan::Ignore ignore;
  g_block.running->open.push_back({static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes});
}

void cp_async_commit() {
  tsan::Ignore ignore;
  Fiber* f = g_block.running;
  f->groups.push_back(std::move(f->open));
  f->open.clear();
}

void cp_async_wait(int pending) {
  Fiber* f = g_block.running;
  while (static_cast<int>(f->groups.size()) > pending) {
    for (const Copy& c : f->groups.front()) {
      if (c.bytes == 0) std::memset(c.dst, 0, 16);
      else std::memcpy(c.dst, c.src, 16);
    }
    f->groups.pop_front();
  }
}

int report_errors(char* error, int error_size, const std::function<void()>& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, static_cast<size_t>(error_size), "%s", e.what());
    return 1;
  }
}

void run_grid(dim3 grid, dim3 block, uint8_t* smem, size_t smem_bytes, const std::function<void()>& body,
              Schedule schedule) {
  tsan::Ignore ignore;  // the scheduler's accesses: fibers' state, not the kernel's
  const unsigned threads = block.x * block.y * block.z;
  if (block.y != 1 || block.z != 1 || threads % 32 != 0 || threads > 1024 || grid.z != 1)
    throw EmulationError("run_grid: blocks of whole warps along x, grids along x and y only");
  g_block.smem = smem;
  g_block.smem_bytes = smem_bytes;
  g_block.reversed_lanes = schedule == Schedule::kWarpsAheadReversed;
  g_block.lagging_arrivals = schedule == Schedule::kWarpsAhead;
  auto& fibers = g_block.fibers;
  fibers.assign(threads, Fiber{});
  g_block.stacks.resize(threads);
  for (auto& s : g_block.stacks) s.resize(kStackBytes);
  g_block.body = &body;
  g_block.scheduler_fiber = tsan::current_fiber();
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      if (smem_bytes > 0) std::memset(smem, 0xff, smem_bytes);  // NaN until written
      g_block.error.clear();
      for (auto& ids : g_block.arrived)
        for (uint32_t& m : ids) m = 0;
      for (int& c : g_block.arrive_count) c = 0;
      g_block.mbarriers.clear();
      g_block.sync_pool.clear();
      for (const void*& b : g_block.barrier_sync) b = new_sync();
      g_block.warp_sync.assign(threads / 32, nullptr);
      for (const void*& w : g_block.warp_sync) w = new_sync();
      tsan::release(&g_block_start);
      for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = fibers[t];
        f = Fiber{};
        f.index = ThreadIndex{make_uint3(t, 0, 0), make_uint3(bx, by, 0), block, grid};
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = g_block.stacks[t].data();
        f.context.uc_stack.ss_size = kStackBytes;
        f.context.uc_link = nullptr;
        makecontext(&f.context, trampoline, 0);
        f.tsan_fiber = tsan::create_fiber();
      }
      for (;;) {
        bool progressed = false;
        try {
          progressed = step(schedule);
        } catch (const EmulationError& e) {
          if (g_block.error.empty()) g_block.error = e.what();
        }
        if (!g_block.error.empty()) break;
        bool done = true;
        for (const Fiber& f : fibers) done &= f.wait == Wait::kDone;
        if (done) {
          for (int id = 0; id < 16; ++id) {
            if (g_block.arrive_count[id] != 0)
              g_block.error = "barrier " + std::to_string(id) + ": threads arrived that no barrier completed";
          }
          for (const auto& [bar, m] : g_block.mbarriers) {
            if (m.pending != m.count) g_block.error = "mbarrier: threads arrived that no phase completed";
          }
          break;
        }
        if (!progressed) {
          g_block.error = "deadlock: no thread can go on (a hang on the GPU)" + describe_waits();
          break;
        }
      }
      if (!g_block.error.empty()) {
        // Unwind every suspended fiber so that its stack holds nothing live, then report.
        const std::string error = g_block.error;
        for (Fiber& f : fibers) {
          if (f.wait == Wait::kDone || !f.started) continue;  // one never started has nothing to unwind
          g_block.running = &f;
          tsan::switch_to(f.tsan_fiber);
          swapcontext(&g_block.scheduler, &f.context);
        }
        g_block.running = nullptr;
        tsan::acquire(&g_block_end);
        for (Fiber& f : fibers) tsan::destroy_fiber(f.tsan_fiber);
        throw EmulationError(error);
      }
      tsan::acquire(&g_block_end);
      for (Fiber& f : fibers) tsan::destroy_fiber(f.tsan_fiber);
    }
  }
}

}  // namespace emu
