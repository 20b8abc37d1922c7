#!/usr/bin/env python3
"""Samples utime+stime (ticks) of every tenure/loadgen process once a second until the deadline.
Usage: cpu-sampler.py OUT.jsonl SECONDS"""
import os, sys, time, json
out, secs = sys.argv[1], float(sys.argv[2])
tick = os.sysconf('SC_CLK_TCK')
end = time.time() + secs
with open(out, 'w') as f:
    while time.time() < end:
        now = time.time(); rows = []
        for pid in os.listdir('/proc'):
            if not pid.isdigit(): continue
            try:
                comm = open(f'/proc/{pid}/comm').read().strip()
                if comm not in ('tenure', 'loadgen'): continue
                args = open(f'/proc/{pid}/cmdline').read().split('\0')
                st = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
                cpu = (int(st[11]) + int(st[12])) / tick
                rows.append({'pid': int(pid), 'comm': comm, 'args': ' '.join(args)[:200], 'cpu_s': cpu})
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
        # whole-machine busy time
        cpu = open('/proc/stat').readline().split()[1:]
        vals = list(map(int, cpu)); idle = vals[3] + vals[4]
        f.write(json.dumps({'t': now, 'procs': rows, 'sys_busy_s': (sum(vals) - idle) / tick, 'sys_total_s': sum(vals) / tick}) + '\n')
        f.flush()
        time.sleep(1)
