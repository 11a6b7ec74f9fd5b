import json, sys
runs = [json.load(open(f)) for f in sys.argv[1:]]
a_runs, b_runs = runs[0::2], runs[1::2]
print(f"{'shape':28s} " + " ".join(f"{'A'+str(i+1):>8s} {'B'+str(i+1):>8s}" for i in range(len(a_runs))) + f" {'A/B':>6s}")
rs = []
for k in runs[0]:
    a = sum(r[k] for r in a_runs) / len(a_runs); b = sum(r[k] for r in b_runs) / len(b_runs); rs.append(a / b)
    print(f"{k:28s} " + " ".join(f"{x[k]:8.2f} {y[k]:8.2f}" for x, y in zip(a_runs, b_runs)) + f" {a/b:6.3f}")
print(f"A/B (>1: B faster) range {min(rs):.3f}-{max(rs):.3f}")
