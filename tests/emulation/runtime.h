// The host side of the kernel emulation (cuda_emulation.h): running a grid of fibers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>

#include "cuda_emulation.h"

namespace emu {

// What the emulation found wrong: a hang, disagreeing lanes, copies in flight at exit, __trap.
class EmulationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The order in which a block's warps go on between barriers. kLockstep: every thread to its next
// barrier or warp operation, warp after warp, then those complete (every warp at the same pace).
// kWarpsAhead: warp 0 on until it waits at a barrier, then warp 1, ...; kWarpsAheadReversed the
// last warp first. The two make a warp read what others have not yet written where a barrier is
// missing between them, which in lockstep the others have already written. In kWarpsAhead a
// thread that arrives at a named barrier (bar.arrive) waits there until the barrier completes and
// the waiting warps have gone on (a legal interleaving), so that accesses placed after an arrival
// that should precede it meet the waiting warps' writes; elsewhere it goes on at once.
enum class Schedule { kLockstep = 0, kWarpsAhead = 1, kWarpsAheadReversed = 2 };

// Runs `body` as every thread of every block of `grid` (blocks one after another); the block's
// `smem_bytes` of `smem` are NaN bytes (0xff) when it starts. Throws EmulationError.
void run_grid(dim3 grid, dim3 block, uint8_t* smem, size_t smem_bytes, const std::function<void()>& body,
              Schedule schedule);

// The C entry points' convention: 0 after `body`, or 1 with what it threw in `error`.
int report_errors(char* error, int error_size, const std::function<void()>& body);

}  // namespace emu
