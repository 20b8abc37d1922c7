#!/usr/bin/env bash
# The performance table in about two minutes per group count: a `tenure dev` cluster (3 node
# processes, RocksDB with fsync, on loopback) measured idle, then under loadgen's mixed 20/70/10
# scenario through the client library:
#   idle          node CPU while nothing is asked (% of one core per node)
#   1 caller      closed loop, one worker: p50/p99
#   16 callers    closed loop, 16 workers: p50/p99
#   saturation    closed loop, $WORKERS workers: ops/s, p50/p99, server CPU per op (all three
#                 nodes, from /proc), load-generator CPU per op (the client library plus the
#                 workload), operations per Raft entry, AppendEntries messages per replicated
#                 entry, WAL syncs and their duration (p50/p99 from the nodes' histogram)
#   half load     open loop at half the saturation rate (latency from the intended start)
#
#   ./bench/perf-smoke.sh                        # 64 groups
#   GROUP_COUNTS="8 64 256" ./bench/perf-smoke.sh
#   BIN_DIR=/tmp/before ./bench/perf-smoke.sh    # tenure and loadgen binaries built earlier
#
# Prints one table (bench/perf_smoke.py) and keeps every loadgen report and the nodes' metric
# snapshots under $OUT (default bench/results/perf-smoke-<time>). Bounded: each loadgen run has a
# timeout, the cluster stops by itself, the whole script stops after $TIME_LIMIT_S.
set -euo pipefail
cd "$(dirname "$0")/.."

GROUP_COUNTS=${GROUP_COUNTS:-64}
WORKERS=${WORKERS:-1024}
SAT_S=${SAT_S:-15}
SHORT_S=${SHORT_S:-8}
IDLE_S=${IDLE_S:-10}
TIME_LIMIT_S=${TIME_LIMIT_S:-1200}
OUT=${OUT:-bench/results/perf-smoke-$(date -u +%Y%m%dT%H%M%SZ)}

./scripts/install-deps.sh
if [ -n "${BIN_DIR:-}" ]; then
  bin=$BIN_DIR    # binaries built earlier (an A/B comparison of two builds)
else
  ./scripts/build.sh release
  bin="${CARGO_TARGET_DIR:-target}/release"
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d /tmp/tenure-perf-smoke.XXXXXX)
dev=""
current=""
# Stops `tenure dev` and its node processes (they run in process groups of their own): TERM, a
# bounded wait, then KILL to whatever is left.
stop_dev() {
  [ -n "$dev" ] || return 0
  local nodes pid
  nodes=$(pgrep -P "$dev" || true)
  kill -TERM "$dev" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$dev" 2>/dev/null || break; sleep 0.1; done
  for pid in "$dev" $nodes; do kill -KILL "$pid" 2>/dev/null || true; done
  dev=""
}
cleanup() {
  if [ -n "$current" ]; then
    kill -TERM "$current" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$current" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$current" 2>/dev/null || true
  fi
  stop_dev
  if [ -n "${watchdog:-}" ]; then pkill -P "$watchdog" 2>/dev/null || true; kill "$watchdog" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
( sleep "$TIME_LIMIT_S"; echo "perf-smoke: time limit of ${TIME_LIMIT_S}s reached; stopping" >&2; kill -TERM $$ ) &
watchdog=$!
disown "$watchdog"

# CPU seconds (user + system) of the node processes (USER_HZ = 100).
node_cpu() {
  local total=0 pid
  for pid in $(pgrep -P "$dev" || true); do
    total=$(awk -v t="$total" '{ sub(/.*\) /, ""); print t + ($12 + $13) / 100 }' "/proc/$pid/stat" 2>/dev/null || echo "$total")
  done
  echo "$total"
}

# scrape NAME: every node's /metrics into $OUT/g$groups-NAME.metrics (nodes separated by a line).
scrape() {
  python3 bench/perf_smoke.py scrape "$work/dev/cluster.json" >"$OUT/g$groups-$1.metrics"
}

# run NAME ARGS...: one bounded loadgen run with the nodes' CPU around it.
run() {
  local name=$1; shift
  local before after
  before=$(node_cpu)
  timeout --signal=TERM --kill-after=10 300 "$bin/loadgen" --target tenure --cluster "$work/dev/cluster.json" \
    --scenario mixed --quiet --report-json "$OUT/g$groups-$name.json" "$@" >"$OUT/g$groups-$name.txt" 2>&1 &
  current=$!
  wait "$current"
  current=""
  after=$(node_cpu)
  python3 bench/perf_smoke.py annotate "$OUT/g$groups-$name.json" "$before" "$after"
}

for groups in $GROUP_COUNTS; do
  echo "perf-smoke: $groups groups"
  "$bin/tenure" dev --base-port 0 --groups "$groups" --data-dir "$work/dev" --duration-s "$TIME_LIMIT_S" \
    >"$OUT/g$groups-dev.log" 2>&1 &
  dev=$!
  for _ in $(seq 600); do
    [ -s "$work/dev/cluster.json" ] && break
    kill -0 "$dev" 2>/dev/null || break
    sleep 0.1
  done
  [ -s "$work/dev/cluster.json" ] || { echo "perf-smoke: tenure dev did not become ready" >&2; tail -20 "$OUT/g$groups-dev.log" >&2; exit 1; }
  sleep 3
  before=$(node_cpu)
  sleep "$IDLE_S"
  after=$(node_cpu)
  python3 -c "import sys; print(round((float(sys.argv[2]) - float(sys.argv[1])) / float(sys.argv[3]) / 3 * 100, 2))" \
    "$before" "$after" "$IDLE_S" >"$OUT/g$groups-idle-percent-per-node.txt"
  run one --workers 1 --warmup 1s --duration "${SHORT_S}s"
  run sixteen --workers 16 --warmup 1s --duration "${SHORT_S}s"
  scrape sat-before
  run sat --workers "$WORKERS" --warmup 3s --duration "${SAT_S}s"
  scrape sat-after
  rate=$(python3 -c "import json,sys; print(max(1, round(json.load(open(sys.argv[1]))['throughput_ops_per_s'] / 2)))" "$OUT/g$groups-sat.json")
  half_workers=$(python3 -c "import sys; print(max(1, min(int(sys.argv[1]), int(sys.argv[2]) * 60)))" "$WORKERS" "$rate")
  run half --workers "$half_workers" --rate "$rate" --warmup 2s --duration "${SAT_S}s"
  stop_dev
  rm -rf "$work/dev"
done

python3 bench/perf_smoke.py table "$OUT" $GROUP_COUNTS | tee "$OUT/table.txt"
