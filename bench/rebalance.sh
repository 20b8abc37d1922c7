#!/usr/bin/env bash
# Rebalancing a loaded cluster onto a new node, measured: a 3-node `tenure dev` cluster (RocksDB
# with fsync, loopback, $NGROUPS groups) holds $LEASES leases (loadgen's hold: acquired, then
# renewed by the client library, ttl $HOLD_TTL) while a foreground open loop runs $FG_SCENARIO
# (acquires of unique keys by default) at $FG_RATE ops/s. After $BASE_S seconds of foreground, `tenure dev add`
# starts node 4 and the placement controller moves replicas to it until every node holds the
# same number (within one). The foreground and the hold run for fixed times around it
# ($BASE_S + $REBALANCE_MAX_S + $AFTER_S, the hold a minute more). Prints the time to balance and the foreground's throughput and p99
# before, during and after the moves, with the hold's losses; keeps every report under $OUT.
#
#   ./bench/rebalance.sh                                  # 64 groups, 1,000,000 leases
#   LEASES=100000 ./bench/rebalance.sh
#   SNAPSHOT_RATE=0 ./bench/rebalance.sh                  # no snapshot rate limit
#   MOVE_PAUSE_MS=0 REBALANCE_MAX_S=420 ./bench/rebalance.sh   # unpaced moves ([cluster] move_pause_ms)
#   BIN_DIR=/tmp/before ./bench/rebalance.sh              # tenure, tenurectl, loadgen built earlier
#   TENURECTL=target/debug/tenurectl ./bench/rebalance.sh  # any tenurectl build
#
# Bounded: the cluster stops by itself, every loadgen run has its duration, the whole script stops
# after $TIME_LIMIT_S.
set -euo pipefail
cd "$(dirname "$0")/.."

NGROUPS=${NGROUPS:-64}
LEASES=${LEASES:-1000000}
HOLD_TTL=${HOLD_TTL:-300s}
ACQUIRE_PHASE_MAX_S=${ACQUIRE_PHASE_MAX_S:-400}
# The foreground's loadgen scenario (mixed's open loop stalls by itself after about 20 s on
# this build, moves or not: see the README; acquire's does not).
FG_SCENARIO=${FG_SCENARIO:-acquire}
FG_RATE=${FG_RATE:-500}
# Enough workers that the open loop never waits for one (latency is counted from each
# operation's intended start, so a loop short of workers measures its own queue).
FG_WORKERS=${FG_WORKERS:-256}
BASE_S=${BASE_S:-60}
REBALANCE_MAX_S=${REBALANCE_MAX_S:-900}
AFTER_S=${AFTER_S:-30}
# Snapshot bytes per second each node sends ([cluster] snapshot_send_bytes_per_s); empty: the
# default (64 MiB/s).
SNAPSHOT_RATE=${SNAPSHOT_RATE:-}
# The controller's pause after each move before the next balancing move ([cluster]
# move_pause_ms); empty: the default (10 s, so 48 moves take about 12 minutes).
MOVE_PAUSE_MS=${MOVE_PAUSE_MS:-}
TIME_LIMIT_S=${TIME_LIMIT_S:-2700}
OUT=${OUT:-bench/results/rebalance-$(date -u +%Y%m%dT%H%M%SZ)}

. bench/lib.sh
bench_binaries
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d /tmp/tenure-rebalance.XXXXXX)
dev=""
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  if [ -n "$dev" ]; then
    local nodes
    nodes=$(pgrep -P "$dev" || true)
    kill -TERM "$dev" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$dev" 2>/dev/null || break; sleep 0.1; done
    for pid in "$dev" $nodes; do kill -KILL "$pid" 2>/dev/null || true; done
  fi
  if [ -n "${watchdog:-}" ]; then
    # The watchdog first, then its sleep: the other way round it would go on to stop us.
    local sleeper
    sleeper=$(pgrep -P "$watchdog" || true)
    kill "$watchdog" 2>/dev/null || true
    [ -n "$sleeper" ] && kill $sleeper 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
( sleep "$TIME_LIMIT_S"; echo "rebalance: time limit of ${TIME_LIMIT_S}s reached; stopping" >&2; kill -TERM $$ ) &
watchdog=$!
disown "$watchdog"

# tenurectl is a client only: any build of it will do (TENURECTL), else the one beside tenure.
ctl() { "${TENURECTL:-$bin/tenurectl}" --cluster "$work/dev/cluster.json" "$@"; }

if [ -n "$SNAPSHOT_RATE$MOVE_PAUSE_MS" ]; then
  # A first short run writes the nodes' configurations; the settings go in their [cluster]
  # (`tenure dev add` copies node 1's for node 4).
  "$bin/tenure" dev --base-port 0 --groups "$NGROUPS" --data-dir "$work/dev" --duration-s 1 \
    >"$OUT/dev-setup.log" 2>&1 || { echo "rebalance: tenure dev setup failed" >&2; exit 1; }
  for config in "$work"/dev/node-*/tenure.toml; do
    python3 - "$config" "$SNAPSHOT_RATE" "$MOVE_PAUSE_MS" <<'PY'
import re, sys
path, rate, pause = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
for key, value in (("snapshot_send_bytes_per_s", rate), ("move_pause_ms", pause)):
    if not value:
        continue
    text, count = re.subn(rf"(?m)^{key} = \d+$", f"{key} = {int(value)}", text)
    if count != 1:
        sys.exit(f"{path}: no {key} in [cluster]")
open(path, "w").write(text)
PY
  done
fi
"$bin/tenure" dev --base-port 0 --groups "$NGROUPS" --data-dir "$work/dev" --duration-s "$TIME_LIMIT_S" \
  >"$OUT/dev.log" 2>&1 &
dev=$!
for _ in $(seq 1200); do
  [ -s "$work/dev/cluster.json" ] && break
  kill -0 "$dev" 2>/dev/null || break
  sleep 0.1
done
[ -s "$work/dev/cluster.json" ] || { echo "rebalance: tenure dev did not become ready" >&2; tail -20 "$OUT/dev.log" >&2; exit 1; }

hold_s=$((BASE_S + REBALANCE_MAX_S + AFTER_S + 60))
echo "rebalance: acquiring $LEASES leases (ttl $HOLD_TTL) over $NGROUPS groups"
"$bin/loadgen" --target tenure --cluster "$work/dev/cluster.json" --scenario hold --leases "$LEASES" \
  --ttl "$HOLD_TTL" --acquire-phase-max "${ACQUIRE_PHASE_MAX_S}s" --duration "${hold_s}s" \
  --report-json "$OUT/hold.json" >"$OUT/hold.txt" 2>"$OUT/hold.err" &
hold=$!
pids+=("$hold")
for _ in $(seq $(((ACQUIRE_PHASE_MAX_S + 120) * 10))); do
  grep -q "hold: acquire phase" "$OUT/hold.err" 2>/dev/null && break
  kill -0 "$hold" 2>/dev/null || break
  sleep 0.1
done
grep "hold: acquire phase" "$OUT/hold.err" || { echo "rebalance: the hold's acquire phase did not end" >&2; exit 1; }
ctl node list >"$OUT/nodes-before.txt"

fg_s=$((BASE_S + REBALANCE_MAX_S + AFTER_S))
fg_start=$(date +%s.%N)
"$bin/loadgen" --target tenure --cluster "$work/dev/cluster.json" --scenario "$FG_SCENARIO" --rate "$FG_RATE" \
  --workers "$FG_WORKERS" --duration "${fg_s}s" --report-json "$OUT/foreground.json" >"$OUT/foreground.txt" 2>&1 &
fg=$!
pids+=("$fg")
sleep "$BASE_S"

add_start=$(date +%s.%N)
"$bin/tenure" dev add --data-dir "$work/dev" >"$OUT/add.txt" 2>&1
echo "rebalance: $(cat "$OUT/add.txt")"
balanced=""
deadline=$(( $(date +%s) + REBALANCE_MAX_S ))
# The poll is kept cheap (one tenurectl call and awk, no interpreter start-up): it runs on the
# same two cores as the nodes whose foreground p99 is being measured. An earlier version
# started python3 every second, which cost about 6% of the machine during the moves (perf).
now=0
while printf -v now '%(%s)T' -1 && [ "$now" -lt "$deadline" ]; do
  # Balanced: four active nodes, the new one among them, within one replica of each other
  # (`node list` columns: NODE STATE ADDR HTTP REPLICAS LEADS).
  if ctl node list >"$OUT/nodes-now.txt" 2>/dev/null && awk '
      $2 == "active" { n++; if (n == 1 || $5 < min) min = $5; if (n == 1 || $5 > max) max = $5 }
      END { exit !(n == 4 && max - min <= 1) }' "$OUT/nodes-now.txt"
  then
    balanced=$(date +%s.%N)
    break
  fi
  sleep 1
done
ctl node list >"$OUT/nodes-after.txt"
cat "$OUT/nodes-after.txt"
# The rest of the foreground, then the hold's end (both run their whole duration: a loadgen
# stopped early writes no report).
wait "$fg" || true
wait "$hold" || true
grep -h "placement: move done" "$work"/dev/node-*/node.log 2>/dev/null | wc -l >"$OUT/moves-done.txt" || true

python3 - "$OUT" "$fg_start" "$add_start" "${balanced:-}" "$BASE_S" <<'PY'
import json, re, statistics, sys
out, fg_start, add_start, balanced, base_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
lines = open(f"{out}/foreground.txt").read().splitlines()
seconds = []
for line in lines:
    m = re.match(r"\[\s*([\d.]+)s\]\s+(\d+) ops/s\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms", line)
    if m:
        seconds.append((float(m[1]), int(m[2]), float(m[3]), float(m[4])))
add_at = add_start - fg_start
end_at = (float(balanced) - fg_start) if balanced else None
# The foreground's per-second latency buckets (loadgen's timeline, `latency_us_buckets`): their
# sums give each window's p99 over all its operations, which the per-second p99s cannot.
report = json.load(open(f"{out}/foreground.json"))
timeline = report.get("timeline", [])
def window_p99_ms(lo, hi):
    counts = {}
    for sample in timeline:
        if lo < sample["t_s"] <= hi:
            for bound, count in sample.get("latency_us_buckets", []):
                counts[bound] = counts.get(bound, 0) + count
    total = sum(counts.values())
    if total == 0:
        return None
    seen = 0
    for bound in sorted(counts):
        seen += counts[bound]
        if seen >= 0.99 * total:
            return round(bound / 1000, 2)
def window(name, lo, hi):
    rows = [s for s in seconds if lo < s[0] <= hi]
    if not rows:
        return None
    return {
        "p99_ms_all_ops": window_p99_ms(lo, hi),
        "window": name, "seconds": len(rows),
        "ops_per_s_mean": round(statistics.mean(r[1] for r in rows), 1),
        "p99_ms_median_of_seconds": round(statistics.median(r[3] for r in rows), 2),
        "p99_ms_worst_second": round(max(r[3] for r in rows), 2),
        "p50_ms_median_of_seconds": round(statistics.median(r[2] for r in rows), 2),
    }
windows = [window("before (no moves)", 5, add_at)]
if end_at is not None:
    windows.append(window("during the rebalance", add_at, end_at))
    windows.append(window("after", end_at, 1e9))
else:
    windows.append(window("after the add (never balanced)", add_at, 1e9))
windows = [w for w in windows if w]
moves = open(f"{out}/moves-done.txt").read().strip() or "?"
hold = json.load(open(f"{out}/hold.json")) if __import__("os").path.exists(f"{out}/hold.json") else {}
details = hold.get("details", hold)
summary = {
    "foreground_started_unix_s": fg_start,
    "add_started_unix_s": add_start,
    "add_at_foreground_s": round(add_at, 1),
    "rebalance_s": round(float(balanced) - add_start, 1) if balanced else None,
    "moves_done": moves,
    "windows": windows,
    "hold_lost": details.get("lost"),
    "hold_held_at_start": details.get("held_at_start"),
    "hold_held_at_end": details.get("held_at_end"),
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(f"time to balance after `tenure dev add`: {summary['rebalance_s']} s ({moves} moves done in the nodes' logs)")
print(f"hold: {summary['hold_held_at_start']} leases held at the start, {summary['hold_lost']} lost, {summary['hold_held_at_end']} held at the end")
print("| window | seconds | ops/s | p50 ms (median second) | p99 ms (median second) | p99 ms (worst second) | p99 ms (all the window's ops) |")
print("|---|---|---|---|---|---|---|")
for w in windows:
    print(f"| {w['window']} | {w['seconds']} | {w['ops_per_s_mean']} | {w['p50_ms_median_of_seconds']} | {w['p99_ms_median_of_seconds']} | {w['p99_ms_worst_second']} | {w['p99_ms_all_ops']} |")
PY
