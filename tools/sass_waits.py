#!/usr/bin/env python3
"""Forward-kernel MMAs that wait on a global load they do not read, found in the binary's SASS.

Every SASS instruction of sm_70 and later carries control bits: the scoreboard (0-5) its result
sets, and the scoreboards it waits for before it issues. This reads them from ``cuobjdump
-sass`` and reports, per forward kernel and target, each HMMA whose wait mask holds a
scoreboard last set (in program order) by a global load (LDG). ptxas reuses scoreboards, so
such a wait can make a tile's MMAs wait for the next tile's index load: the kernels whose q
type is the MMA type waited there in every tile on the H200 (ncu: 20-23 % of all stall samples
of the bf16 32-head kernels; bench/HISTORY.md v26). A static heuristic: program order, not the
loop's control flow. Exit 1 if any MMA is reported.

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


def mma_waits_on_loads(instructions: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """(address, instruction, scoreboard) of each HMMA waiting on a scoreboard an LDG set last."""
    last_writer: dict[int, str] = {}
    found = []
    for address, instruction, control in instructions:
        op = opcode(instruction)
        write_sb, wait_mask = (control >> 5) & 7, (control >> 11) & 0x3F
        if op.startswith("HMMA"):
            found += [(address, instruction, sb) for sb in range(6)
                      if wait_mask >> sb & 1 and last_writer.get(sb, "").startswith("LDG.")]
        if write_sb != 7:
            last_writer[write_sb] = op
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--cuobjdump", help="path of cuobjdump (default: searched for)")
    args = ap.parse_args()
    sass = subprocess.run([find_cuobjdump(args.cuobjdump), "-sass", args.binary],
                          capture_output=True, text=True, check=True).stdout
    fwd = [k for k in kernels(sass) if "sparse_mla_fwd_kernel" in k[1]]
    if not fwd:
        print(f"sass_waits: no forward kernels found in {args.binary}", file=sys.stderr)
        return 1
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
