import sys,collections
rows=collections.defaultdict(list)
for l in open(sys.argv[1]):
    p=l.split()
    if len(p)<5: continue
    rows[p[1]].append((float(p[0]),float(p[2]),float(p[3]),float(p[4])))
# align by timestamps: sum over pids per timestamp
byts=collections.defaultdict(lambda:[0,0,0])
for pid,s in rows.items():
    for (t0,r0,w0,n0),(t1,r1,w1,n1) in zip(s,s[1:]):
        if r1<r0: continue
        k=round(t1,1)
        byts[k][0]+=(r1-r0)/(t1-t0)/1e9; byts[k][1]+=(w1-w0)/(t1-t0)/1e9; byts[k][2]+=(n1-n0)/(t1-t0)
ks=sorted(byts)
a=float(sys.argv[2]) if len(sys.argv)>2 else ks[0]; z=float(sys.argv[3]) if len(sys.argv)>3 else ks[-1]
for k in ks:
    if a<=k<=z:
        r,w,n=byts[k]
        print('%.1f cpu %.2f cores  rq-wait %.2f thread-s/s  switches %6.0f/s  wait per switch %.2f ms'%(k%10000,r,w,n,(w/n*1000 if n else 0)))
