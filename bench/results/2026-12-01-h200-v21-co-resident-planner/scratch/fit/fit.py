exec(open('scratch/fit/data2.py').read())
SMS=132; WS=3*132*32*513*4
groups={}
for m in re.finditer(r"^(\w+ H\d+ T\d+ \w+): PLAN T\d+ H\d+ groups (\d)",log1+"\n"+log2,re.M): groups[m[1]]=int(m[2])
def planR(k, P):
    model,H,T,kv=k.split(); H=int(H[1:]);T=int(T[1:])
    topk=2176 if model=="GLM" else 2048; g=groups[k]
    bps=1 if g==2 else (3 if (kv=="fp8_e4m3" and model=="GLM") else 2)
    tiles=(topk+31)//32; base=T*math.ceil(H/(16*g)); per_split=T*H*513*4
    short_ok = kv=="bf16" or T*H<=SMS
    def cost(tps,s):
        per_sm=(base*s+SMS-1)//SMS; c=per_sm*tps
        if bps>1 and per_sm>1:
            nb=min(per_sm,bps)
            if nb>=3 and tps>=P['co3_min']: c*=P['co3']
            elif tps>=8: c*=0.7
            elif tps>=P['short_min'] and short_ok: c*=P['co_short']
        if s>1: c+=1.0+per_split*s/SMS/(64*1024)
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
    return best[0]
def ev(P, show=False):
    res=[];unk=[]
    for k,m in meas.items():
        s=planR(k,P)
        if 'ab' in m:
            sa,ta,sb,tb=m['ab']
            if s==sa: r=1.0
            elif s==sb: r=ta/tb
            else: unk.append((k,sa,sb,s)); continue
        else:
            old=plan1[k]
            if s not in m: unk.append((k,old,None,s)); continue
            r=m[old]/m[s]
        res.append((r,k,s))
    rs=[r for r,_,_ in res]
    print(P, "min %.3f max %.3f  n>1.02: %d  n<0.98: %d  geo %.4f unknown %d"%(min(rs),max(rs),sum(r>1.02 for r in rs),sum(r<0.98 for r in rs), math.exp(sum(math.log(r) for r in rs)/len(rs)), len(unk)))
    if show:
        for r,k,s in sorted(res):
            if abs(r-1)>0.02: print(f"   {k:26s} s{s:<3d} {r:.3f}")
        for u in unk: print("   unknown",u)
