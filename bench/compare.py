"""Per-shape comparison of `bench` JSON files from interleaved runs of two builds (A/B).

``python bench/compare.py --a before_1.json before_2.json --b after_1.json after_2.json``
prints, for every (model, H, T, kv) the runs share, the median µs of each side, the runs behind
it, and A/B (> 1: B is faster), then the range of A/B per cache dtype. Differences under 5 %
are noise on a power-capped GPU (bench/NOTES.md, method).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def load(paths: list[str]) -> dict[tuple, list[float]]:
    """µs per shape key (model, num_heads, num_tokens, kv_cache_dtype) over the given files."""
    us: dict[tuple, list[float]] = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["rows"]:
                us[(r["model"], r["num_heads"], r["num_tokens"], r["kv_cache_dtype"])].append(r["us"])
    return us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", nargs="+", required=True, help="bench JSON files of build A")
    ap.add_argument("--b", nargs="+", required=True, help="bench JSON files of build B")
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    ratios: dict[str, list[float]] = defaultdict(list)
    for key in (k for k in a if k in b):
        model, heads, tokens, kv = key
        ma, mb = statistics.median(a[key]), statistics.median(b[key])
        ratios[kv].append(ma / mb)
        runs = " ".join(f"{x:.1f}" for x in a[key] + b[key])
        print(f"{model:14s} H{heads:<4d} T{tokens:<6d} {kv:10s} A {ma:9.1f}  B {mb:9.1f}  A/B {ma / mb:.3f}  ({runs})")
    for kv, r in ratios.items():
        print(f"{kv}: A/B {min(r):.3f} .. {max(r):.3f} over {len(r)} shapes")


if __name__ == "__main__":
    main()
