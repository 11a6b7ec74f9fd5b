"""Where the warps of a profiled kernel wait: ncu's per-instruction stall samples summed by
opcode, and the most-sampled instructions. How the v9 stall in bench/HISTORY.md was found:

    ncu --clock-control none -k regex:sparse_mla_fwd -c 1 --section SourceCounters \\
        --section WarpStateStats -o rep python bench/profile_shape.py --heads 128 --tokens 256 --calls 1
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv
    python bench/ncu_stalls.py rep.csv

A stall sample is counted at the instruction the warp waits to issue, e.g. the first user of a
load's result.
"""

from __future__ import annotations

import argparse
import collections
import csv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=25, help="instructions to list")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if any(c.startswith("Source") for c in r) and any("Sampl" in c for c in r))
    header = rows[head]
    src = next(i for i, c in enumerate(header) if c.startswith("Source"))
    sampled = [i for i, c in enumerate(header) if "Sampl" in c]
    col = next((i for i in sampled if "All" in header[i] and "Not" not in header[i]), sampled[0])
    by_op: collections.Counter[str] = collections.Counter()
    per_instruction = []
    for r in rows[head + 1:]:
        try:
            n = float(r[col].replace(",", ""))
        except (IndexError, ValueError):
            continue
        words = r[src].split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        by_op[op.split(".")[0]] += n
        per_instruction.append((n, r[src].strip()))
    total = sum(by_op.values())
    if total == 0:
        raise SystemExit(f"no stall samples in column '{header[col]}'")
    print(f"{header[col]}: {total:.0f} samples")
    for op, n in by_op.most_common(15):
        print(f"  {op:10s} {100 * n / total:5.1f} %")
    for n, ins in sorted(per_instruction, reverse=True)[: args.top]:
        print(f"  {100 * n / total:5.1f} %  {ins[:100]}")


if __name__ == "__main__":
    main()
