#!/usr/bin/env bash
# Issue 23's figure: the same leases held two ways on a fresh `tenure dev` cluster each (3 node
# processes, RocksDB with fsync, on loopback):
#   renewer    every lease renewed by the client library's coalescing renewer (one renewal per
#              lease per third of the ttl, packed into Batch requests per group)
#   sessions   the leases acquired in $SESSIONS sessions: one keep-alive per (session, group) per
#              third of the ttl, whatever the number of leases
# For each: the leases held at the start and the end of a $HOLD_S-second hold and how many were
# lost, the requests and operations per second that kept them, and the nodes' CPU (all three
# processes, from /proc, sampled every second) during the hold. Prints one table, writes
# $OUT/table.txt, $OUT/<mode>.json (loadgen's reports), $OUT/<mode>-cpu.csv and
# $OUT/node-cpu.svg (node CPU over time for both modes).
#
#   ./bench/sessions-hold.sh                                   # 1,000,000 leases, 1,000 sessions
#   LEASES=100000 SESSIONS=100 HOLD_S=60 ./bench/sessions-hold.sh
#   MODES=sessions BIN_DIR=target/release ./bench/sessions-hold.sh
#
# Bounded: each loadgen run has a timeout, `tenure dev` stops by itself, the whole script stops
# after $TIME_LIMIT_S.
set -euo pipefail
cd "$(dirname "$0")/.."

LEASES=${LEASES:-1000000}
SESSIONS=${SESSIONS:-1000}
TTL=${TTL:-30s}
HOLD_S=${HOLD_S:-300}
WORKERS=${WORKERS:-512}
GROUP_COUNT=${GROUP_COUNT:-64}
MODES=${MODES:-"renewer sessions"}
ACQUIRE_MAX_S=${ACQUIRE_MAX_S:-600}
TIME_LIMIT_S=${TIME_LIMIT_S:-3600}
OUT=${OUT:-bench/results/sessions-hold-$(date -u +%Y%m%dT%H%M%SZ)}

. bench/lib.sh
bench_setup sessions-hold

for mode in $MODES; do
  sessions=0
  [ "$mode" = sessions ] && sessions=$SESSIONS
  echo "sessions-hold: $mode: $LEASES leases, ttl $TTL, $GROUP_COUNT groups, sessions $sessions"
  start_dev "$GROUP_COUNT" "$OUT/$mode-dev.log"
  sleep 3
  started=$(date +%s.%N)
  ( while true; do echo "$(date +%s.%N),$(node_cpu)"; sleep 1; done ) >"$OUT/$mode-cpu.csv" &
  sampler=$!
  run_bounded $((ACQUIRE_MAX_S + HOLD_S + 120)) "$OUT/$mode.txt" "$OUT/$mode.progress" "$bin/loadgen" \
    --target tenure --cluster "$work/dev/cluster.json" --scenario hold --leases "$LEASES" \
    --sessions "$sessions" --ttl "$TTL" --workers "$WORKERS" --duration "${HOLD_S}s" \
    --acquire-phase-max "${ACQUIRE_MAX_S}s" --report-json "$OUT/$mode.json" ||
    echo "sessions-hold: loadgen ($mode) exited with $?" >&2
  ended=$(date +%s.%N)
  kill "$sampler" 2>/dev/null || true
  sampler=""
  echo "$started $ended" >"$OUT/$mode-window.txt"
  stop_dev
done

python3 - "$OUT" "$HOLD_S" $MODES <<'EOF' | tee "$OUT/table.txt"
import json, sys
out, hold_s, modes = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
rows, series = [], {}
for mode in modes:
    report = json.load(open(f"{out}/{mode}.json"))
    details = report.get("details", report)
    started, ended = map(float, open(f"{out}/{mode}-window.txt").read().split())
    samples = [tuple(map(float, line.split(","))) for line in open(f"{out}/{mode}-cpu.csv") if "," in line]
    # The hold is loadgen's last HOLD_S seconds (its acquire phase came first).
    hold_start = ended - hold_s
    window = [(t, c) for t, c in samples if hold_start <= t <= ended]
    cores = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]) if len(window) > 1 else float("nan")
    series[mode] = [(t - started, (c2 - c1) / (t - t1)) for (t1, c1), (t, c2) in zip(samples, samples[1:]) if t > t1]
    steady = details["steady"]
    if mode == "sessions":
        requests = steady["keepalive_requests_per_s"]
        ops = steady["keepalives_per_s"]
        what = f"{details['sessions']} sessions x {details['session_groups_open'] // max(1, details['sessions'])} groups"
    else:
        requests = steady["renew_requests_per_s"]
        ops = steady["renewals_per_s"]
        what = "coalescing renewer"
    rows.append((mode, what, details["held_at_start"], details["held_at_end"], details["lost"],
                 requests, ops, cores, details["acquire_phase"]["acquired_per_s"]))
print(f"{'mode':<9} {'kept alive by':<26} {'held at start':>13} {'held at end':>11} {'lost':>8} {'requests/s':>10} {'ops/s':>10} {'node cores':>10} {'acquired/s':>10}")
for mode, what, start, end, lost, requests, ops, cores, acq in rows:
    print(f"{mode:<9} {what:<26} {start:>13} {end:>11} {lost:>8} {requests:>10.1f} {ops:>10.1f} {cores:>10.2f} {acq:>10.0f}")
# Node CPU over time, one line per mode (SVG, no plotting library needed).
width, height, pad = 900, 360, 50
t_max = max((t for s in series.values() for t, _ in s), default=1)
c_max = max((c for s in series.values() for _, c in s), default=1) * 1.1 or 1
colours = {"renewer": "#d62728", "sessions": "#1f77b4"}
lines = []
for mode, points in series.items():
    path = " ".join(f"{pad + t / t_max * (width - 2 * pad):.1f},{height - pad - c / c_max * (height - 2 * pad):.1f}" for t, c in points)
    lines.append(f'<polyline fill="none" stroke="{colours.get(mode, "#333")}" stroke-width="1.5" points="{path}"/>')
    lines.append(f'<text x="{width - pad - 120}" y="{pad + 20 * len(lines) // 2}" fill="{colours.get(mode, "#333")}" font-size="13">{mode}</text>')
svg = f'''<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">
<rect width="100%" height="100%" fill="white"/>
<text x="{pad}" y="25" font-size="15">node CPU (cores, 3 processes) over time: acquire phase, then the hold</text>
<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>
<text x="{pad}" y="{height - 15}" font-size="12">0 s</text>
<text x="{width - pad - 40}" y="{height - 15}" font-size="12">{t_max:.0f} s</text>
<text x="5" y="{pad + 5}" font-size="12">{c_max:.2f}</text>
<text x="20" y="{height - pad}" font-size="12">0</text>
{chr(10).join(lines)}
</svg>'''
open(f"{out}/node-cpu.svg", "w").write(svg)
EOF
echo "sessions-hold: results in $OUT"
