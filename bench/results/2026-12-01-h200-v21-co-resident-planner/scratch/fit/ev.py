exec(open('scratch/fit/model.py').read())
def t(d,s):
    m=d['median3']; r=d['round1']
    return m.get(str(s), r.get(str(s)))
def evaluate(rule, show=True):
    out=[]
    for k,p in plans.items():
        model,H,T,kv=k.split(); H=int(H[1:]);T=int(T[1:])
        topk=2176 if model=="GLM" else 2048
        bps=p['b1'] if p['groups']==1 else p['b2']
        s,_=plan(T,H,p['groups'],topk,bps,**rule(kv,T,H))
        d=data[k]; ts=t(d,s)
        if ts is None: print("no data",k,s); continue
        r=d['median3']['0']/ts
        best=min(v for n,v in d['round1'].items() if n!='0')
        out.append((r,k,p['splits'],s))
    if show:
        for r,k,a,b in sorted(out):
            if abs(r-1)>0.02 or a!=b: print(f"{k:26s} {a:3d} -> {b:3d}  {r:.3f}")
    rs=[o[0] for o in out]
    print("min %.3f max %.3f changed %d"%(min(rs),max(rs),sum(a!=b for _,_,a,b in out)))
