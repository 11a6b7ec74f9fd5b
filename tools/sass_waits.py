#!/usr/bin/env python3
"""Forward-kernel HMMAs that wait on a global load they do not read, found in the binary's SASS.

Every SASS instruction of sm_70 and later carries control bits: the scoreboard (0-5) its result
sets, the one that frees its source registers, and the scoreboards it waits for before it
issues. ptxas reuses scoreboards, so an MMA can end up waiting for an unrelated load: on the H200
each tile's first S MMA waited for the next tile's index load wherever q's type is the MMA's
(ncu: 20-23 % of the bf16 32-head kernels' stall samples; bench/HISTORY.md v26).

This reads the control bits from ``cuobjdump -sass`` and reports, per forward kernel and target,
how many HMMAs inside a loop wait on a scoreboard whose last setter before them, going round the
loop, is a global load's result (LDG), and the first of them: a wait paid on every trip. Waits on
a load's register-release scoreboard do not count (that is a register reuse), nor waits on loads
before the loop. A static heuristic: a loop is a branch back to a lower address, its body the
instructions in between; branches inside it are not followed. Exit 0 if nothing is reported, 1
if something is, 2 on an error (no cuobjdump, not a CUDA binary, no forward kernels).

The control bits are the high 64-bit word's bits 41-61 (the 128-bit encoding's 105-125):
stall 4, yield 1, write scoreboard 3 (7 = none), read scoreboard 3, wait mask 6, reuse 4.

Usage: sass_waits.py [--cuobjdump PATH] BINARY
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_resources import demangle, find_cuobjdump, short_name  # noqa: E402

_FUNCTION = re.compile(r"\s*Function : (\S+)")
_ARCH = re.compile(r"\s*arch = (sm_\w+)")
_INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s+/\* (0x[0-9a-f]+) \*/")
_HIGH_WORD = re.compile(r"\s+/\* (0x[0-9a-f]+) \*/\s*$")


def kernels(sass: str) -> list[tuple[str, str, list[tuple[int, str, int]]]]:
    """(arch, mangled name, [(address, instruction, control bits)]) per function."""
    out, arch, pending = [], None, None
    for line in sass.splitlines():
        if m := _ARCH.match(line):
            arch = m.group(1)
        elif m := _FUNCTION.match(line):
            out.append((arch, m.group(1), []))
        elif (m := _INSTRUCTION.match(line)) and out:
            pending = (int(m.group(1), 16), m.group(2))
        elif pending and (m := _HIGH_WORD.match(line)):
            out[-1][2].append((pending[0], pending[1], int(m.group(1), 16) >> 41))
            pending = None
    return out


def opcode(instruction: str) -> str:
    words = instruction.split()
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


# "BRA 0x..", and with a (uniform) predicate operand, "BRA.U !UP0, 0x..": sm_120's tile loops close so.
_BRANCH_TARGET = re.compile(r"\bBRA(?:\.[A-Z]+)*\s+(?:!?U?P[T0-9]+,\s*)?(0x[0-9a-f]+)")


def loops(instructions: list[tuple[int, str, int]]) -> list[tuple[int, int]]:
    """(first, last) instruction index of each loop: a branch back to a lower address."""
    index = {address: i for i, (address, _, _) in enumerate(instructions)}
    out = []
    for i, (address, instruction, _) in enumerate(instructions):
        m = _BRANCH_TARGET.search(instruction)
        if m and int(m.group(1), 16) < address and int(m.group(1), 16) in index:
            out.append((index[int(m.group(1), 16)], i))
    return out


def mma_waits_on_loads(instructions: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """(address, instruction, scoreboard) of each HMMA inside a loop that waits on a scoreboard
    whose last setter before it, going round the loop, is an LDG of that loop: a wait the loop
    pays on every trip. A wait on a load before the loop is paid once and is not reported."""
    found = set()
    for first, last in loops(instructions):
        body = instructions[first:last + 1]
        # Two passes over the body: after the first, setter[sb] is the last setter going round,
        # so the second sees, at each instruction, the nearest setter before it in loop order.
        setter: dict[int, str] = {}
        for trip in range(2):
            for address, instruction, control in body:
                op = opcode(instruction)
                if trip and op.startswith("HMMA"):
                    wait_mask = (control >> 11) & 0x3F
                    found.update((address, instruction, sb) for sb in range(6)
                                 if wait_mask >> sb & 1 and setter.get(sb, "").startswith("LDG."))
                if (control >> 5) & 7 != 7:
                    setter[(control >> 5) & 7] = op
    return sorted(found)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--cuobjdump", help="path of cuobjdump (default: searched for)")
    args = ap.parse_args()
    try:
        dump = subprocess.run([find_cuobjdump(args.cuobjdump), "-sass", args.binary], capture_output=True, text=True)
    except SystemExit as e:
        print(f"sass_waits: {e}", file=sys.stderr)
        return 2
    if dump.returncode != 0:
        print(f"sass_waits: cuobjdump failed on {args.binary}: {dump.stderr.strip()}", file=sys.stderr)
        return 2
    fwd = [k for k in kernels(dump.stdout) if "sparse_mla_fwd_kernel" in k[1]]
    if not fwd:
        print(f"sass_waits: no forward kernels found in {args.binary}", file=sys.stderr)
        return 2
    flagged = 0
    for (arch, _, instructions), name in zip(fwd, demangle([k[1] for k in fwd])):
        waits = mma_waits_on_loads(instructions)
        if waits:
            flagged += 1
            address, instruction, sb = waits[0]
            print(f"{arch} {short_name(name)[0]}: {len(waits)} MMA(s), first at 0x{address:x} "
                  f"({instruction}) waits on scoreboard {sb} of an LDG")
    print(f"{len(fwd)} forward kernel images checked, {flagged} with MMAs waiting on a global load.")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
