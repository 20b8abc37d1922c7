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

# BIN_DIR: binaries built earlier (an A/B comparison of two builds).
. bench/lib.sh
bench_setup perf-smoke

# scrape NAME: every node's /metrics into $OUT/g$groups-NAME.metrics (nodes separated by a line).
scrape() {
  python3 bench/perf_smoke.py scrape "$work/dev/cluster.json" >"$OUT/g$groups-$1.metrics"
}

# run NAME ARGS...: one bounded loadgen run with the nodes' CPU around it.
run() {
  local name=$1; shift
  local before after
  before=$(node_cpu)
  run_bounded 300 "$OUT/g$groups-$name.txt" "$OUT/g$groups-$name.stderr" "$bin/loadgen" --target tenure \
    --cluster "$work/dev/cluster.json" --scenario mixed --quiet --report-json "$OUT/g$groups-$name.json" "$@"
  after=$(node_cpu)
  python3 bench/perf_smoke.py annotate "$OUT/g$groups-$name.json" "$before" "$after"
}

for groups in $GROUP_COUNTS; do
  echo "perf-smoke: $groups groups"
  start_dev "$groups" "$OUT/g$groups-dev.log"
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
done

python3 bench/perf_smoke.py table "$OUT" $GROUP_COUNTS | tee "$OUT/table.txt"
