#!/usr/bin/env python3
"""Busy share of each node's tokio worker thread in 20 ms slices, from `perf script` output
(flat.txt of prof-a: perf record -a -g -F 997): one digit per slice, tenths of a core."""
import re, collections, sys
hdr = re.compile(r'^\s*(\S.*?)\s+(\d+)/(\d+)\s+([\d.]+):')
S = []
for l in open(sys.argv[1], errors='replace'):
    m = hdr.match(l)
    if m:
        S.append((float(m.group(4)), int(m.group(2)), int(m.group(3))))
t0 = S[0][0]
nodes = collections.Counter(p for _, p, _ in S)
for pid in [p for p, _ in nodes.most_common(4) if p != 0][:3]:
    worker = collections.Counter(t for _, p, t in S if p == pid).most_common(1)[0][0]
    b = collections.Counter(int((t - t0) * 50) for t, p, tid in S if tid == worker)
    for start in (2.0, 3.2, 4.4, 5.6):
        print(pid, worker, '%.1f' % start,
              ''.join(str(min(9, b[k] // 2)) for k in range(int(start * 50), int((start + 1.2) * 50))))
print('digit = tenths of a core in a 20 ms slice (997 Hz: 20 samples = a whole core); the storm '
      'ran from about 3.25 s to 6.5 s')
