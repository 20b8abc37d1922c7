#!/usr/bin/env python3
"""perf script (with callchains) -> buckets per process and top leaf/user frames per window."""
import sys, re, collections
text = open(sys.argv[1], errors='replace').read().split('\n\n')
hdr = re.compile(r'^\s*(\S.*?)\s+(\d+)/(\d+)\s+([\d.]+):')
samples = []
for block in text:
    lines = [l for l in block.split('\n') if l.strip()]
    if not lines: continue
    m = hdr.match(lines[0])
    if not m: continue
    comm, pid, tid, t = m.groups()
    frames = []
    for l in lines[1:]:
        parts = l.strip().split(' ', 1)
        if len(parts) < 2: continue
        sym = parts[1]
        sym = re.sub(r'\+0x[0-9a-f]+', '', sym)
        frames.append(sym)
    leaf = frames[0] if frames else '?'
    user = next((f for f in frames if 'kernel.kallsyms' not in f), '?')
    samples.append((float(t), int(pid), int(tid), comm, leaf, user, frames))
t0 = samples[0][0]
pids = collections.Counter(s[1] for s in samples)
names = {}
for s in samples: names.setdefault(s[1], s[3])
top = [p for p, _ in pids.most_common(6)]
print('pids:', [(p, names[p], c) for p, c in pids.most_common(6)])
b = collections.defaultdict(collections.Counter)
for s in samples: b[int((s[0]-t0)*4)][s[1]] += 1
print('t(s)  ' + ' '.join('%7d' % p for p in top))
for k in sorted(b):
    print('%5.2f ' % (k/4) + ' '.join('%7d' % b[k][p] for p in top))
for w in sys.argv[2:]:
    a, z = map(float, w.split(':'))
    leafc = collections.Counter(); userc = collections.Counter(); n = 0
    for s in samples:
        if a <= s[0]-t0 < z and s[1] != 0:
            n += 1
            leafc[s[4][:90]] += 1
            userc[s[5][:90]] += 1
    print('\n== window %s: %d samples; top leaf' % (w, n))
    for k, v in leafc.most_common(30): print('%6d %5.1f%% %s' % (v, 100.0*v/n, k))
    print('-- top first user frame')
    for k, v in userc.most_common(30): print('%6d %5.1f%% %s' % (v, 100.0*v/n, k))
