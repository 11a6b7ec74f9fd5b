exec(open('scratch/fit/ev.py').read())
REL={"bf16":1.0,"fp16":0.64,"fp8_e4m3":0.69,"fp8_ds_mla":0.78}
def plan2(T,H,groups,topk,bps,kv,mintiles=4,cotime=0.7,cfix=1.0,cbytes=64*1024,R=1.0,rel=True):
    tiles=(topk+31)//32; base=T*math.ceil(H/(16*groups))
    per_split=T*H*513*4; r=REL[kv] if rel else 1.0
    def rounds(s):
        if T*H<=SMS: return 1 if s<=68 else math.ceil(s/64)
        return math.ceil(s/8)
    def cost(tps,s):
        per_sm=(base*s+SMS-1)//SMS
        c=per_sm*tps
        if bps>1 and per_sm>1 and tps>=mintiles: c*=cotime
        if s>1: c+=(cfix+per_split*s/SMS/cbytes+R*(rounds(s)-1))/r
        return c
    best=(1,tiles); bc=cost(tiles,1)
    one=T*H<=16 and tiles<=68
    mx=min(128,tiles//(1 if one else 2))
    for s in range(2,mx+1):
        tps=(tiles+s-1)//s; sp=(tiles+tps-1)//tps
        if base*sp>3*SMS: break
        if per_split*sp>WS: break
        c=cost(tps,sp)
        if c<bc-1e-9: bc=c; best=(sp,tps)
    return best
def evaluate2(kw, show=True):
    out=[]
    for k,p in plans.items():
        model,H,T,kv=k.split(); H=int(H[1:]);T=int(T[1:])
        topk=2176 if model=="GLM" else 2048
        bps=p['b1'] if p['groups']==1 else p['b2']
        s,_=plan2(T,H,p['groups'],topk,bps,kv,**kw)
        d=data[k]; ts=t(d,s)
        if ts is None: out.append((0,k,p['splits'],s)); continue
        out.append((d['median3']['0']/ts,k,p['splits'],s))
    if show:
        for r,k,a,b in sorted(out):
            if abs(r-1)>0.02 or a!=b: print(f"{k:26s} {a:3d} -> {b:3d}  {r:.3f}")
    rs=[o[0] for o in out]
    print(kw, "min %.3f max %.3f changed %d"%(min(rs),max(rs),sum(a!=b for _,_,a,b in out)))
