#!/usr/bin/env python3
"""CPU per window from cpu-sampler.py samples and rebalance.sh's summary.json.
Usage: cpu-windows.py samples.jsonl OUT_DIR"""
import json, sys, re
rows = [json.loads(l) for l in open(sys.argv[1])]
summ = json.load(open(sys.argv[2] + '/summary.json'))
fg = summ['foreground_started_unix_s']; add = summ['add_started_unix_s']
bal = add + summ['rebalance_s'] if summ.get('rebalance_s') else None
def label(args, comm):
    if comm == 'loadgen':
        m = re.search(r'--scenario (\w+)', args); return 'loadgen-' + (m[1] if m else '?')
    m = re.search(r'node-(\d+)', args)
    if 'serve' in args and m: return 'node' + m[1]
    return 'tenure-' + args.split(' ')[1] if ' ' in args else comm
def at(t):
    return min(rows, key=lambda r: abs(r['t'] - t))
def window(name, lo, hi):
    a, b = at(lo), at(hi); dt = b['t'] - a['t']
    pa = {p['pid']: p for p in a['procs']}; out = {}
    for p in b['procs']:
        if p['pid'] in pa:
            k = label(p['args'], p['comm'])
            out[k] = out.get(k, 0) + (p['cpu_s'] - pa[p['pid']]['cpu_s'])
        else:
            k = label(p['args'], p['comm']); out[k] = out.get(k, 0) + p['cpu_s']
    busy = (b['sys_busy_s'] - a['sys_busy_s']) / (b['sys_total_s'] - a['sys_total_s'])
    nodes = sum(v for k, v in out.items() if k.startswith('node'))
    print(f"{name}: {dt:.0f} s, machine busy {busy*100:.0f}% of 2 cores; node processes {nodes/dt:.2f} cores; " +
          ", ".join(f"{k} {v/dt:.2f}" for k, v in sorted(out.items())))
    return dt, out, busy
window('before', fg + 5, add)
if bal:
    window('during', add, bal); window('after', bal, min(bal + 200, rows[-1]['t']))
else:
    window('after add (never balanced)', add, rows[-1]['t'])
