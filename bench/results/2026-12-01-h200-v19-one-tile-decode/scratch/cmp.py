import json, sys
a1, b, a2 = (json.load(open(f)) for f in sys.argv[1:4])
print(f"{'shape':28s} {'A1(20)':>8s} {'B(16)':>8s} {'A2(20)':>8s} {'B/meanA':>8s}")
rs = []
for k in a1:
    r = b[k] / ((a1[k] + a2[k]) / 2); rs.append(r)
    print(f"{k:28s} {a1[k]:8.2f} {b[k]:8.2f} {a2[k]:8.2f} {r:8.3f}")
print(f"B/meanA range {min(rs):.3f}-{max(rs):.3f}")
