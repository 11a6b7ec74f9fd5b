"""Summarise the 32-head kernels' phase clocks: where each warp's tile-loop cycles go.

A measurement build (``bench/candidates/v34-phase-clocks.diff``, never main) makes lane 0 of
every warp of the first 16 blocks print, after the tile loop, its cycles summed over the tiles
for each phase of a turn:

    phase_clocks block B warp W tiles N loop L: GATHER BAR1 S BAR2 PV_SOFTMAX V_LOADS

``clock64()`` reads are issue-ordered, so a phase ends when its last instruction has issued (S
ends with the stores of its scores, which wait for its MMAs). The reads also keep ptxas from
moving code across them: compare ``loop`` per tile with bench's time per tile to see what the
measurement costs. Usage, on a GPU, with the measurement build on PYTHONPATH:

    python3 bench/profile_shape.py --model DeepSeek-V3.2 --heads 128 --tokens 1024 --calls 1 \\
        | python3 tools/phase_clocks.py

Prints the cycles per tile of each phase averaged over blocks, per warp and for all warps. A warp
that waits less than the others at a barrier arrived there later. Thread 0 of some blocks also
prints the whole block (``%globaltimer`` in ns at its start and end, ``clock64()`` cycles before,
in and after the tile loop):

    block_clocks block B sm S start_ns T0 end_ns T1 prologue P loop L epilogue E tiles N

from which a second table gives the medians of the three parts and the SM clock they imply
(cycles / ns): the clock the kernel really ran at, which under a power limit is below the
maximum that ``nvidia-smi`` reports. The build prints with ``printf``, which spills in some
kernels that the measurement does not run: build it with
``CMAKE_ARGS=-DSPARSE_MLA_CHECK_RESOURCES=OFF``.

``--pingpong`` reads the PingPong kernel's build (``bench/candidates/pingpong-phase-clocks.diff``,
fp8 caches), whose two warp roles time different phases in the same six columns (ROLE_PHASES):
one table per role, warps 0-7 and 8-15. Its block line comes from the first P V thread, whose
role ends the block.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from statistics import fmean, median

from rich.console import Console
from rich.table import Table

PHASES = ("gather wait", "barrier 1", "S", "barrier 2", "P V + softmax", "V loads")
# The PingPong kernel's roles (sparse_mla_fwd_pingpong.cuh): S warps 0-7, P V warps 8-15.
ROLE_PHASES = {
    "S warps": ("gather wait", "block barrier", "own barrier", "S", "scores' hand-over", "score stores"),
    "P V warps": ("block barrier", "score loads + max", "softmax + P", "P barrier", "alpha + P V", "-"),
}
LINE = re.compile(r"phase_clocks block (\d+) warp (\d+) tiles (\d+) loop (\d+): " + r" ".join([r"(-?\d+)"] * len(PHASES)))


def parse(lines) -> dict[int, list[list[float]]]:
    """``{warp: [[loop, phase...], one list per (block, launch)]}`` from the printed lines, each
    value in cycles per tile (the printed sums over the block's tiles, divided by its tile count);
    blocks without tiles are left out. Raises ValueError when no line matches."""
    per_warp: dict[int, list[list[float]]] = defaultdict(list)
    for line in lines:
        m = LINE.search(line)
        if not m:
            continue
        warp, tiles = int(m.group(2)), int(m.group(3))
        if tiles == 0:
            continue
        per_warp[warp].append([int(g) / tiles for g in m.groups()[3:]])
    if not per_warp:
        raise ValueError("no 'phase_clocks' line with tiles in the input: was the measurement build on PYTHONPATH?")
    return dict(per_warp)


BLOCK_LINE = re.compile(r"block_clocks block (\d+) sm (\d+) start_ns (\d+) end_ns (\d+) "
                        r"prologue (-?\d+) loop (-?\d+) epilogue (-?\d+) tiles (\d+)")


def parse_blocks(lines) -> list[dict[str, int]]:
    """The ``block_clocks`` lines as dicts (block, sm, start_ns, end_ns, prologue, loop, epilogue,
    tiles); an empty list when there are none."""
    keys = ("block", "sm", "start_ns", "end_ns", "prologue", "loop", "epilogue", "tiles")
    return [dict(zip(keys, map(int, m.groups()))) for m in map(BLOCK_LINE.search, lines) if m]


def summarise_blocks(blocks: list[dict[str, int]]) -> dict[str, float]:
    """Medians over ``blocks`` (``parse_blocks``'s dicts, at least one) of prologue, loop and
    epilogue cycles (keys "prologue", "loop", "epilogue"), of the block's time in ns ("block ns"),
    and of the SM clock in GHz that each block's cycles over its ns imply ("GHz"; NaN when no block
    took time). Raises statistics.StatisticsError when ``blocks`` is empty."""
    ghz = [(b["prologue"] + b["loop"] + b["epilogue"]) / (b["end_ns"] - b["start_ns"])
           for b in blocks if b["end_ns"] > b["start_ns"]]
    out = {k: median(b[k] for b in blocks) for k in ("prologue", "loop", "epilogue")}
    out["block ns"] = median(b["end_ns"] - b["start_ns"] for b in blocks)
    out["GHz"] = median(ghz) if ghz else float("nan")
    return out


def summarise(per_warp: dict[int, list[list[float]]]) -> dict[str, list[float]]:
    """Mean cycles per tile ``[loop, phase...]`` per warp (keys "warp W") and over all warps ("all")."""
    def mean(rows):
        return [fmean(col) for col in zip(*rows)]

    out = {f"warp {w}": mean(rows) for w, rows in sorted(per_warp.items())}
    out["all"] = mean([r for rows in per_warp.values() for r in rows])
    return out


def split_roles(per_warp: dict[int, list[list[float]]]) -> dict[str, dict[int, list[list[float]]]]:
    """``parse``'s records of the PingPong build by role: {"S warps": warps 0-7, "P V warps":
    warps 8-15}, each a ``parse``-shaped dict (roles without records left out)."""
    roles = {"S warps": {w: r for w, r in per_warp.items() if w < 8},
             "P V warps": {w: r for w, r in per_warp.items() if w >= 8}}
    return {name: recs for name, recs in roles.items() if recs}


def print_cycles(per_warp: dict[int, list[list[float]]], phases, title: str) -> None:
    """Prints ``summarise(per_warp)`` as a table whose phase columns are named ``phases``."""
    summary = summarise(per_warp)
    table = Table(title=f"{title} ({sum(len(v) for v in per_warp.values())} warp records)")
    for name in ("", "loop", *phases, "rest"):
        table.add_column(name, justify="right")
    for name, row in summary.items():
        loop, cols = row[0], row[1:]
        table.add_row(name, f"{loop:.0f}", *(f"{c:.0f}" for c in cols), f"{loop - sum(cols):.0f}")
    Console().print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", type=argparse.FileType("r"), default=sys.stdin,
                    help="the printed output (default: standard input)")
    ap.add_argument("--pingpong", action="store_true", help="the PingPong kernel's build: a table per warp role")
    args = ap.parse_args()
    lines = args.file.readlines()
    try:
        per_warp = parse(lines)
    except ValueError as e:
        sys.exit(f"phase_clocks: {e}")
    if args.pingpong:
        for role, recs in split_roles(per_warp).items():
            print_cycles(recs, ROLE_PHASES[role], f"{role}: cycles per tile")
    else:
        print_cycles(per_warp, PHASES, "cycles per tile")
    blocks = parse_blocks(lines)
    if blocks:
        b = summarise_blocks(blocks)
        table = Table(title=f"whole blocks, medians ({len(blocks)} blocks)")
        for name in ("prologue cycles", "loop cycles", "epilogue cycles", "block ns", "SM clock GHz"):
            table.add_column(name, justify="right")
        table.add_row(*(f"{b[k]:.0f}" for k in ("prologue", "loop", "epilogue", "block ns")), f"{b['GHz']:.3f}")
        Console().print(table)


if __name__ == "__main__":
    main()
