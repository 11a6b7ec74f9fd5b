import json, sys, statistics
def load(p): return {(r['model'][:4], r['num_heads'], r['num_tokens'], r['kv_cache_dtype']): r for r in json.load(open(p))['rows']}
A = load(sys.argv[1]); Bs = [load(p) for p in sys.argv[2:]]
for k, a in A.items():
    bs = [B[k]['us'] for B in Bs if k in B]
    if not bs: continue
    b = statistics.mean(bs)
    print(f"{k[0]} H{k[1]:<4d} T{k[2]:<5d} {k[3]:10s} A {a['us']:9.1f}  B {b:9.1f} ({' '.join(f'{x:.1f}' for x in bs)})  A/B {a['us']/b:.3f}")
