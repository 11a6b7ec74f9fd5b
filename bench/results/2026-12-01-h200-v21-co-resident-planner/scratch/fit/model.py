import json, math, re, sys
SMS=132; WS=3*132*32*513*4
def plan(T,H,groups,topk,bps,mintiles=8,cotime=0.7,cfix=1.0,cbytes=64*1024, short_co=None):
    tiles=(topk+31)//32; base=T*math.ceil(H/(16*groups))
    per_split=T*H*513*4
    def cost(tps,s):
        per_sm=(base*s+SMS-1)//SMS
        c=per_sm*tps
        if bps>1 and per_sm>1 and tps>=mintiles: c*=cotime
        elif short_co and bps>1 and per_sm>1: c*=short_co
        if s>1: c+=cfix+per_split*s/SMS/cbytes
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
log=open('call1_split_sweep.txt').read()
plans={}
for m in re.finditer(r"^(\w+) H(\d+) T(\d+) (\w+): PLAN T\d+ H\d+ groups (\d) splits (\d+) tps (\d+) decoded (\d) one_stage \d blocks/sm (\d) (\d)",log,re.M):
    key=f"{m[1]} H{m[2]} T{m[3]} {m[4]}"; plans[key]=dict(groups=int(m[5]),splits=int(m[6]),dec=int(m[8]),b1=int(m[9]),b2=int(m[10]))
data=json.load(open('call1_sweep.json'))
