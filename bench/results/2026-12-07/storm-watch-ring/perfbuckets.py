#!/usr/bin/env python3
"""Reads `perf script -F comm,pid,tid,time,sym,dso` output; prints samples per process per
half-second, and the top symbols of chosen windows."""
import sys, re, collections
lines = open(sys.argv[1], errors='replace').read().split('\n')
samples = []
pat = re.compile(r'^\s*(\S.*?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(.*)$')
for ln in lines:
    m = pat.match(ln)
    if not m: continue
    comm, pid, tid, t, rest = m.groups()
    parts = rest.strip().rsplit(' (', 1)
    sym = parts[0].strip(); dso = parts[1].rstrip(')') if len(parts) > 1 else '?'
    sym = re.sub(r'\+0x[0-9a-f]+$', '', sym)
    samples.append((float(t), int(pid), comm, sym, dso))
t0 = samples[0][0]
pids = collections.Counter(s[1] for s in samples)
names = {}
for s in samples: names.setdefault(s[1], s[2])
top = [p for p, _ in pids.most_common(8)]
print('pids:', [(p, names[p], c) for p, c in pids.most_common(8)])
buckets = collections.defaultdict(collections.Counter)
for t, pid, comm, sym, dso in samples:
    buckets[int((t - t0) * 2)][pid] += 1
print('t(s) ' + ' '.join('%8d' % p for p in top) + '    idle')
for b in sorted(buckets):
    row = buckets[b]
    print('%5.1f ' % (b / 2) + ' '.join('%8d' % row[p] for p in top) + '%8d' % row[0])
if len(sys.argv) > 3:
    for w in sys.argv[2:]:
        a, b = map(float, w.split(':'))
        c = collections.Counter(); n = 0
        for t, pid, comm, sym, dso in samples:
            if a <= t - t0 < b and pid != 0:
                c[(names.get(pid, comm)[:10], pid, sym[:70], dso.split('/')[-1][:20])] += 1; n += 1
        print('\n== window %s: %d samples' % (w, n))
        for k, v in c.most_common(40):
            print('%6d %5.1f%% %s' % (v, 100.0 * v / n, k))
