import json, sys
a1, b1, a2, b2 = (json.load(open(f)) for f in sys.argv[1:5])
print(f"{'shape':28s} {'A1':>7s} {'B1':>7s} {'A2':>7s} {'B2':>7s} {'A/B':>6s}")
rs = []
for k in a1:
    a = (a1[k] + a2[k]) / 2; b = (b1[k] + b2[k]) / 2; r = a / b; rs.append(r)
    print(f"{k:28s} {a1[k]:7.2f} {b1[k]:7.2f} {a2[k]:7.2f} {b2[k]:7.2f} {r:6.3f}")
print(f"A/B (>1: B faster) range {min(rs):.3f}-{max(rs):.3f}")
