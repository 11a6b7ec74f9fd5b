"""Scratch: compare runs of builds named on the command line: cmp3.py DIR base A AB (files DIR/<name>_<round>.json)."""
import glob, json, statistics, sys
d, names = sys.argv[1], sys.argv[2:]
runs = {n: [json.load(open(f)) for f in sorted(glob.glob(f"{d}/{n}_*.json"))] for n in names}
base = names[0]
print(f"{'shape':26s} " + " ".join(f"{n:>8s}" for n in names) + " " + " ".join(f"{base+'/'+n:>9s}" for n in names[1:]))
ratios = {n: [] for n in names[1:]}
for k in runs[base][0]:
    med = {n: statistics.median(r[k] for r in runs[n]) for n in names}
    for n in names[1:]: ratios[n].append((med[base] / med[n], k))
    print(f"{k:26s} " + " ".join(f"{med[n]:8.2f}" for n in names) + " " + " ".join(f"{med[base]/med[n]:9.3f}" for n in names[1:]))
for n in names[1:]:
    r = sorted(ratios[n])
    print(f"{base}/{n} (>1: {n} faster): min {r[0][0]:.3f} ({r[0][1]}), median {statistics.median(x for x, _ in r):.3f}, max {r[-1][0]:.3f} ({r[-1][1]})")
