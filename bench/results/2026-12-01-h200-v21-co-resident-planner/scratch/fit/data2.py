import json, re, math
# measured: key -> {splits: us}
meas={}
sw=json.load(open('call1_sweep.json'))
log1=open('call1_split_sweep.txt').read()
plan1={}
for m in re.finditer(r"^(\w+ H\d+ T\d+ \w+): PLAN T\d+ H\d+ groups (\d) splits (\d+)",log1,re.M): plan1[m[1]]=int(m[3])
for k,d in sw.items():
    mm={int(n):v for n,v in d['round1'].items() if n!='0'}
    for n,v in d['median3'].items():
        if n!='0': mm[int(n)]=v
    mm[plan1[k]]=d['median3']['0']
    meas[k]=mm
log2=open('call2_ab.txt').read()
pa={};pb={}
for m in re.finditer(r"^(\w+ H\d+ T\d+ \w+): PLAN T\d+ H\d+ groups (\d) splits (\d+) tps \d+ decoded \d one_stage \d  ?(?:blocks/sm )?\d \d\|(\w+ H\d+ T\d+ \w+): PLAN T\d+ H\d+ groups \d splits (\d+)",log2,re.M):
    pa[m[1]]=int(m[3]); pb[m[1]]=int(m[5])
a=[json.load(open(f'call2_{x}.json')) for x in ('a1','a2','b1','b2')]
for k in a[0]:
    if k not in pa: continue
    ta=(a[0][k]+a[1][k])/2; tb=(a[2][k]+a[3][k])/2
    meas.setdefault(k,{})
    meas[k]['ab']=(pa[k],ta,pb[k],tb)
print(len(pa), len(meas))
