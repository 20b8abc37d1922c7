#!/usr/bin/env python3
import json, sys, re
for run in sys.argv[1:]:
    try:
        d = json.load(open(f'{run}/scale.json'))
    except Exception as e:
        print(run, 'no json', e); continue
    det = d['details']; st = det['storm']
    fb, fd = st['foreground_before'], st['foreground_during']
    # worst storm second from progress
    worst = (0, 0)
    lines = open(f'{run}/scale.progress').read().split('\n')
    secs = [l for l in lines if l.endswith('[storm]')]
    for l in secs:
        m = re.search(r'p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms', l)
        if m and float(m.group(2)) > worst[1]: worst = (float(m.group(1)), float(m.group(2)))
    # node cpu
    peak = '-'
    try:
        pts = [tuple(map(float, l.split()[:3])) for l in open(f'{run}/node-cpu.log') if l.strip()]
        rates = [(pts[i][1]-pts[i-1][1])/pts[i][2]/(pts[i][0]-pts[i-1][0]) for i in range(1, len(pts))]
        rates = [r for r in rates if 0 <= r < 3]
        peak = '%.2f' % max(rates[-60:])
    except Exception:
        pass
    snaps = det['snapshots']
    f = lambda x: '-' if x is None else '%.1f' % (x * 1000)
    print(f"{run.split('/')[-1]:14s} p99 {fb['p99_us']/1000:6.1f} / {fd['p99_us']/1000:6.1f} ms ({st['p99_during_over_before']:.2f}x)  second with the highest p99: p50/p99 {worst[0]:.1f}/{worst[1]:.1f}  reclaim {st['all_ended_after_latest_end_s']:.2f} s  peak {peak}  builds {snaps.get('builds')}  freeze {f(snaps.get('apply_pause_seconds_max'))} (-wait {f(snaps.get('apply_pause_less_core_wait_seconds_max'))}) shared {f(snaps.get('shared_apply_seconds_max'))} (-wait {f(snaps.get('shared_apply_less_core_wait_seconds_max'))}, cpu {f(snaps.get('shared_apply_cpu_seconds_max'))})")
