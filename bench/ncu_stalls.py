"""Where the warps of a profiled kernel wait: ncu's per-instruction stall samples summed by
stall reason and by opcode, and the most-sampled instructions with their main reasons. How the
v9 and v26 stalls in bench/HISTORY.md were found:

    ncu --clock-control none -k regex:sparse_mla_fwd -c 1 --section SourceCounters \\
        --section WarpStateStats -o rep python bench/profile_shape.py --heads 128 --tokens 256 --calls 1
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv
    python bench/ncu_stalls.py rep.csv

A stall sample is counted at the instruction the warp waits to issue, e.g. the first user of a
load's result. long_sb: waiting on a global / local load or a cp.async reading its registers;
short_sb: on shared memory or other MIO results; wait: a fixed-latency dependency.

``--shared`` instead sums the Source Counters' shared-memory wavefronts (ncu's "L1 Wavefronts
Shared" and "... Excessive", i.e. bank conflicts) by opcode and lists the instructions with the
most excessive wavefronts; divided by the tiles a kernel ran, they are its shared-memory traffic
per tile in 128-byte units (bench/NOTES.md, the roofline).
"""

from __future__ import annotations

import argparse
import collections
import csv
import math


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _count(row: list[str], col: int, what: str, line: int) -> float:
    """A count cell of a source-page row: empty, missing or '-' count 0; anything else must parse."""
    text = row[col].strip() if col < len(row) else ""
    if text in ("", "-"):
        return 0.0
    n = _number(text)
    if n is None or not math.isfinite(n) or n < 0:
        raise SystemExit(f"ncu_stalls: instruction row {line}, column '{what}': cannot read '{text}' as a count")
    return n


def _column(header: list[str], name: str) -> int:
    try:
        return header.index(name)
    except ValueError:
        raise SystemExit(f"ncu_stalls: no '{name}' column; profile with --section SourceCounters") from None


def _source_column(header: list[str]) -> int:
    src = next((i for i, c in enumerate(header) if c.startswith("Source")), None)
    if src is None:
        raise SystemExit("ncu_stalls: no 'Source' column; export with --print-source sass")
    return src


def shared_wavefronts(header: list[str], rows: list[list[str]]) -> tuple[collections.Counter[str], collections.Counter[str], list]:
    """Shared-memory wavefronts of a source page (``header``, its instruction ``rows``) by opcode.

    Returns (wavefronts by opcode, excessive wavefronts by opcode, [(excessive, wavefronts,
    instruction)] of the instructions with excessive ones). An opcode keeps its first modifier
    for shared loads and stores (``LDS.128``, ``STS.64``; ``.U`` dropped) and two for
    ``ldmatrix`` / ``stmatrix`` (``LDSM.16.M88``, transposed ``LDSM.16.MT88``), whose widths and
    uses differ. Raises SystemExit naming a missing column, a cell that is not a count, or a
    row with more excessive wavefronts than wavefronts.
    """
    src = _source_column(header)
    total_col = _column(header, "L1 Wavefronts Shared")
    excess_col = _column(header, "L1 Wavefronts Shared Excessive")
    total: collections.Counter[str] = collections.Counter()
    excess: collections.Counter[str] = collections.Counter()
    conflicted = []
    for line, r in enumerate(rows, start=1):
        words = r[src].split() if src < len(r) else []
        if not words:
            continue
        n = _count(r, total_col, header[total_col], line)
        e = _count(r, excess_col, header[excess_col], line)
        if e > n:
            raise SystemExit(f"ncu_stalls: instruction row {line}: {e:.0f} excessive of {n:.0f} shared wavefronts")
        if not n:
            continue
        parts = [m for m in (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".") if m != "U"]
        op = ".".join(parts[: {"LDS": 2, "STS": 2, "LDSM": 3, "STSM": 3}.get(parts[0], 1)])
        total[op] += n
        excess[op] += e
        if e:
            conflicted.append((e, n, r[src].strip()))
    return total, excess, sorted(conflicted, key=lambda x: -x[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=25, help="instructions to list")
    ap.add_argument("--shared", action="store_true", help="shared-memory wavefronts and bank conflicts instead of stalls")
    args = ap.parse_args()
    try:
        with open(args.csv, newline="", encoding="utf-8", errors="replace") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"ncu_stalls: cannot read {args.csv}: {e}") from None
    needed = "L1 Wavefronts Shared" if args.shared else "Sampl"
    heads = [i for i, r in enumerate(rows) if any(c.startswith("Source") for c in r) and any(needed in c for c in r)]
    if not heads:
        raise SystemExit(f"ncu_stalls: no 'Source' and '...{needed}...' header in {args.csv}")
    kernels = max(len(heads), sum(1 for r in rows if r and r[0] == "Kernel Name"))
    if kernels > 1:
        raise SystemExit(f"ncu_stalls: {kernels} kernels in {args.csv}; export one (ncu -c 1, or --kernel-name)")
    head = heads[0]
    header = rows[head]
    if args.shared:
        total, excess, conflicted = shared_wavefronts(header, rows[head + 1:])
        all_wavefronts = sum(total.values())
        if not all_wavefronts:
            raise SystemExit("ncu_stalls: no shared-memory wavefronts in the source page")
        print(f"shared wavefronts {all_wavefronts:.0f}, excessive {sum(excess.values()):.0f} "
              f"({100 * sum(excess.values()) / all_wavefronts:.1f} %)")
        for op, n in total.most_common():
            print(f"  {op:13s} {100 * n / all_wavefronts:5.1f} %  excessive {excess[op]:.0f}")
        for e, n, ins in conflicted[: args.top]:
            print(f"  excessive {e:.0f} of {n:.0f}  {ins[:64]}")
        return
    src = _source_column(header)
    sampled = [i for i, c in enumerate(header) if "Sampl" in c]
    col = next((i for i in sampled if "All" in header[i] and "Not" not in header[i]), sampled[0])
    reasons = [i for i, c in enumerate(header) if c.startswith("stall_") and "Not Issued" not in c]
    by_op: collections.Counter[str] = collections.Counter()
    by_reason: collections.Counter[str] = collections.Counter()
    per_instruction = []
    for r in rows[head + 1:]:
        n = _number(r[col]) if col < len(r) else None
        words = r[src].split() if src < len(r) else []
        if n is None or not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        by_op[op.split(".")[0]] += n
        why = collections.Counter({header[i][6:]: _number(r[i]) or 0.0 for i in reasons if i < len(r)})
        by_reason.update(why)
        per_instruction.append((n, r[src].strip(), why))
    total = sum(by_op.values())
    if total == 0:
        raise SystemExit(f"ncu_stalls: no stall samples in column '{header[col]}'")
    print(f"{header[col]}: {total:.0f} samples")
    reason_total = sum(by_reason.values())
    if reason_total:
        print("by reason: " + ", ".join(f"{k} {100 * v / reason_total:.1f} %" for k, v in by_reason.most_common(8)))
    print("by opcode:")
    for op, n in by_op.most_common(15):
        print(f"  {op:10s} {100 * n / total:5.1f} %")
    for n, ins, why in sorted(per_instruction, key=lambda x: -x[0])[: args.top]:
        main_reasons = ", ".join(f"{k} {100 * v / total:.1f}" for k, v in why.most_common(2) if v > 0)
        print(f"  {100 * n / total:5.1f} %  {ins[:64]:64s}  {main_reasons}")


if __name__ == "__main__":
    main()
