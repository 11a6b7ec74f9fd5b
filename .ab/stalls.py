import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
# find header row
hi = next(i for i, r in enumerate(rows) if any("Source" == c or c.startswith("Source") for c in r) and any("Sampl" in c for c in r))
hdr = rows[hi]
print("columns:", [c for c in hdr][:40])
src = next(i for i, c in enumerate(hdr) if c.startswith("Source"))
cols = [i for i, c in enumerate(hdr) if "Sampl" in c]
allc = next((i for i in cols if "All" in hdr[i] and "Not" not in hdr[i]), cols[0])
print("using", hdr[allc])
by_op = collections.Counter(); tot = 0; per = []
for r in rows[hi + 1:]:
    if len(r) <= allc: continue
    try: v = float(r[allc].replace(",", ""))
    except ValueError: continue
    ins = r[src].strip(); op = ins.split()[0] if ins else "?"
    if op.startswith("@"): op = ins.split()[1]
    op = op.split(".")[0]
    by_op[op] += v; tot += v; per.append((v, ins))
print("total samples", tot)
for op, v in by_op.most_common(15): print(f"{op:10s} {100*v/tot:5.1f}%")
per.sort(reverse=True)
for v, ins in per[:25]: print(f"{100*v/tot:5.1f}%  {ins[:90]}")
