import sys, statistics
def rates(path):
    rows=[l.split() for l in open(path)]
    out=[]; prev=None
    for t,c,hz in rows:
        t=float(t); c=int(c); hz=int(hz)
        if prev:
            out.append((c-prev[1])/hz/(t-prev[0]))
        prev=(t,c)
    return out
for path in sys.argv[1:]:
    r=rates(path)
    # last restart reset: take samples after the last negative value before the end, drop the tail after the final negative (cluster stop)
    neg=[i for i,x in enumerate(r) if x<0]
    end=neg[-1] if neg else len(r)
    # the storm precedes the new-replica phase; search the last 40 s before the end for the spike
    seg=r[max(0,end-45):end]
    base=statistics.median(seg[:20])
    peak_i=max(range(len(seg)), key=lambda i: seg[i])
    lo=peak_i
    while lo>0 and seg[lo-1]>base+0.15: lo-=1
    hi=peak_i
    while hi<len(seg)-1 and seg[hi+1]>base+0.15: hi+=1
    excess=sum(x-base for x in seg[lo:hi+1])
    print(f"{path.split('/')[-1]}: baseline {base:.2f} cores, spike {hi-lo+1} s peak {seg[peak_i]:.2f}, excess {excess:.2f} core-s, {excess*1e6/500000:.1f} us per reclaimed lease (3 nodes)")
