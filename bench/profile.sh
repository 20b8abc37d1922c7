#!/usr/bin/env bash
# Where the time goes under load: starts `tenure dev` (3 nodes, fsync, its default group count) on loopback,
# runs loadgen's mixed scenario in closed loop, records every node with `perf record` for 10 s in
# the middle of the run, and prints the CPU split by component (bench/perf_breakdown.py) plus the
# nodes' own per-stage histograms (commit latency, fsync, batch sizes) from /metrics.
#   ./bench/profile.sh                 # SCENARIO=mixed WORKERS=512 DURATION_S=20
#   TENURE_GROUPS=64 BIN_DIR=DIR ./bench/profile.sh   # a group count; binaries built earlier
# Needs perf (Debian: linux-perf; installed if missing). Bounded: the cluster stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
SCENARIO=${SCENARIO:-mixed}
WORKERS=${WORKERS:-512}
DURATION_S=${DURATION_S:-20}
if ! command -v perf >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq linux-perf >/dev/null
fi
TENURE_GROUPS=${TENURE_GROUPS:-}   # empty: tenure dev's default for this machine's cores
. bench/lib.sh
bench_binaries
work=$(mktemp -d /tmp/tenure-profile.XXXXXX)
dev=""; load=""
cleanup() {
  [ -n "$load" ] && kill "$load" 2>/dev/null || true
  [ -n "$dev" ] && kill -TERM "$dev" 2>/dev/null || true
  [ -n "$dev" ] && wait "$dev" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$bin/tenure" dev --base-port 0 --data-dir "$work/dev" --duration-s $((DURATION_S + 60)) \
  ${TENURE_GROUPS:+--groups "$TENURE_GROUPS"} >"$work/dev.log" 2>&1 &
dev=$!
for _ in $(seq 600); do [ -s "$work/dev/cluster.json" ] && break; sleep 0.1; done
if [ ! -s "$work/dev/cluster.json" ]; then
  echo "profile: tenure dev did not become ready:" >&2; tail -20 "$work/dev.log" >&2; exit 1
fi
pids=$(pgrep -P "$dev" | paste -sd, - || true)
[ -n "$pids" ] || { echo "profile: no node processes under tenure dev" >&2; exit 1; }
"$bin/loadgen" --target tenure --cluster "$work/dev/cluster.json" --scenario "$SCENARIO" \
  --workers "$WORKERS" --duration "${DURATION_S}s" --quiet >"$work/loadgen.txt" 2>&1 &
load=$!
sleep $((DURATION_S / 4))
perf record -F 499 -g -p "$pids" -o "$work/perf.data" -- sleep 10 >/dev/null 2>"$work/perf.err" \
  || { echo "profile: perf record failed:" >&2; cat "$work/perf.err" >&2; exit 1; }
wait "$load" || { echo "profile: loadgen failed:" >&2; cat "$work/loadgen.txt" >&2; exit 1; }
load=""
cat "$work/loadgen.txt"
echo "== CPU of the three nodes by component (perf, 10 s under load)"
perf report -i "$work/perf.data" --no-children --sort comm,dso,sym --stdio -g none 2>/dev/null \
  | python3 bench/perf_breakdown.py
echo "== per-stage histograms of node 1 (/metrics: mean = sum / count)"
http=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['nodes'][0]['http'])" "$work/dev/cluster.json")
python3 -c '
import re, sys, urllib.request
sums, counts = {}, {}
for line in urllib.request.urlopen(sys.argv[1] + "/metrics").read().decode().splitlines():
    m = re.match(r"^(tenure_\w+)_(sum|count)(\{[^}]*\})? ([0-9.e+-]+)$", line)
    if m:
        (sums if m.group(2) == "sum" else counts)[m.group(1)] = (sums if m.group(2) == "sum" else counts).get(m.group(1), 0) + float(m.group(4))
for name in sorted(counts):
    if counts[name]:
        print(f"{name}: count {counts[name]:.0f}, mean {sums.get(name, 0) / counts[name]:.6g}")
' "$http"
