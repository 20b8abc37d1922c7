#!/usr/bin/env bash
# tenure and etcd side by side on this machine: the same scenarios, the same load generator, the
# same durability (fsync on for both), one system at a time so neither competes with the other's
# idle work.
#
#   ./bench/compare-etcd.sh                      # acquire, mixed, hold (100,000 leases), contended, expiry
#   SCENARIOS="mixed" DURATION=10s ./bench/compare-etcd.sh
#   BIN_DIR=/tmp/before TARGETS=tenure ./bench/compare-etcd.sh   # binaries built earlier
#
# For each system: a 3-node tenure (`tenure dev`: separate node processes, RocksDB with fsync,
# its default Raft group count) or a 3-member etcd (Debian's etcd-server, fsync always on), all on 127.0.0.1,
# in a fresh temporary directory. For acquire, mixed and contended it runs `loadgen` twice: closed
# loop with $WORKERS workers after a warm-up (saturation), then open loop at half the throughput
# that run reached (latency from the intended start). hold acquires $HOLD_LEASES leases and keeps
# them for $HOLD_S seconds (ttl $HOLD_TTL, default 30s); expiry lets $EXPIRY_LEASES leases expire
# at once. Server CPU is read from /proc for each run. It prints a side-by-side table with ratios
# and writes every JSON report, SVG plot and log under $OUT (default
# bench/results/compare-<time>). TENURE_GROUPS sets tenure's Raft group count (default: `tenure
# dev`'s, 4 per core, 8 to 64, as ./scripts/run.sh).
#
# Bounded: every loadgen run has its own timeout and the whole script stops itself after
# $TIME_LIMIT_S seconds (default 2700); the servers are stopped and their data deleted on exit.
# Installs what it needs through scripts/install-deps.sh (etcd-server, protobuf-compiler, libclang).
set -euo pipefail
cd "$(dirname "$0")/.."

SCENARIOS=${SCENARIOS:-"acquire mixed hold contended expiry"}
TARGETS=${TARGETS:-"tenure etcd"}
DURATION=${DURATION:-20s}
WARMUP=${WARMUP:-3s}
WORKERS=${WORKERS:-1024}
HOLD_LEASES=${HOLD_LEASES:-100000}
HOLD_S=${HOLD_S:-30}
HOLD_TTL=${HOLD_TTL:-}    # e.g. 10s; empty: loadgen's hold default (30s)
EXPIRY_LEASES=${EXPIRY_LEASES:-10000}
TENURE_GROUPS=${TENURE_GROUPS:-}
# TOML settings (separated by ';') set in every node's [limits], for A/B runs of a server
# setting, e.g. TENURE_LIMITS="late_renewal_remaining_percent = 0". The cluster is then set up
# by a first short run and restarted: give both sides of an A/B run a setting (the default value
# for the baseline) so that they start alike.
TENURE_LIMITS=${TENURE_LIMITS:-}
TIME_LIMIT_S=${TIME_LIMIT_S:-2700}
OUT=${OUT:-bench/results/compare-$(date -u +%Y%m%dT%H%M%SZ)}

# install-deps.sh installs etcd-server and protobuf-compiler (etcd client build) with the rest.
./scripts/install-deps.sh
if [ -n "${BIN_DIR:-}" ]; then
  bin=$BIN_DIR    # tenure and loadgen built earlier (an A/B comparison of two builds)
else
  ./scripts/build.sh release
  bin="${CARGO_TARGET_DIR:-target}/release"
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d /tmp/tenure-compare.XXXXXX)
server_pids=()
current=""
# Stops the servers: TERM to every server process and its children (tenure dev's nodes run in
# their own process groups), a bounded wait, then KILL to whatever is left.
stop_servers() {
  local pids pid
  pids=$(server_tree)
  [ -z "$pids" ] && { server_pids=(); return 0; }
  for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 300); do
    local alive=0
    for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
  server_pids=()
}
cleanup() {
  [ -n "$current" ] && kill -TERM "$current" 2>/dev/null || true
  stop_servers
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
# The whole run is bounded: the watchdog sends TERM, which interrupts the `wait` below at once.
( sleep "$TIME_LIMIT_S"; echo "compare-etcd: time limit of ${TIME_LIMIT_S}s reached; stopping" >&2; kill -TERM $$ ) &
watchdog=$!

# CPU seconds (user+system) of the server processes (USER_HZ = 100).
server_cpu() {
  local total=0 pid
  for pid in $(server_tree); do
    if [ -r "/proc/$pid/stat" ]; then
      total=$(awk -v t="$total" '{ sub(/.*\) /, ""); print t + ($12 + $13) / 100 }' "/proc/$pid/stat" 2>/dev/null || echo "$total")
    fi
  done
  echo "$total"
}
server_tree() {
  local pid
  for pid in "${server_pids[@]}"; do echo "$pid"; pgrep -P "$pid" || true; done | sort -u
}

start_tenure() {
  if [ -n "$TENURE_LIMITS" ] && [ ! -d "$work/tenure" ]; then
    # A first short run writes the nodes' configurations; the settings go in their [limits].
    "$bin/tenure" dev --base-port 0 ${TENURE_GROUPS:+--groups "$TENURE_GROUPS"} --data-dir "$work/tenure" \
      --duration-s 1 >"$OUT/tenure-dev-setup.log" 2>&1 \
      || { echo "compare-etcd: tenure dev setup failed; see $OUT/tenure-dev-setup.log" >&2; exit 1; }
    local config
    for config in "$work"/tenure/node-*/tenure.toml; do
      python3 - "$config" "$TENURE_LIMITS" <<'PY'
import sys
import re
path = sys.argv[1]
settings = [line.strip() for line in sys.argv[2].split(";") if line.strip()]
text = open(path).read()
start = text.find("\n[limits]\n")
if start < 0:
    sys.exit(f"{path} has no [limits] table")
start += len("\n[limits]\n")
end = text.find("\n[", start)
end = len(text) if end < 0 else end + 1
table = text[start:end]
for setting in settings:
    key = setting.split("=", 1)[0].strip()
    line = re.compile(rf"^{re.escape(key)}\s*=.*$", re.M)
    # A key the node's configuration already states is replaced, else added.
    table = line.sub(setting, table, count=1) if line.search(table) else setting + "\n" + table
open(path, "w").write(text[:start] + table + text[end:])
PY
    done
  fi
  "$bin/tenure" dev --base-port 0 ${TENURE_GROUPS:+--groups "$TENURE_GROUPS"} --data-dir "$work/tenure" --duration-s "$TIME_LIMIT_S" \
    >"$OUT/tenure-dev.log" 2>&1 &
  server_pids=($!)
  for _ in $(seq 600); do
    [ -s "$work/tenure/cluster.json" ] && return 0
    kill -0 "${server_pids[0]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "compare-etcd: tenure dev did not become ready; see $OUT/tenure-dev.log" >&2
  exit 1
}

ETCD_ENDPOINTS=127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793
start_etcd() {
  local cluster="e1=http://127.0.0.1:23801,e2=http://127.0.0.1:23802,e3=http://127.0.0.1:23803" i
  server_pids=()
  for port in 23791 23792 23793 23801 23802 23803; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "compare-etcd: 127.0.0.1:$port is already in use (a leftover etcd?)" >&2
      exit 1
    fi
  done
  for i in 1 2 3; do
    etcd --name "e$i" --data-dir "$work/etcd$i" \
      --listen-client-urls "http://127.0.0.1:2379$i" --advertise-client-urls "http://127.0.0.1:2379$i" \
      --listen-peer-urls "http://127.0.0.1:2380$i" --initial-advertise-peer-urls "http://127.0.0.1:2380$i" \
      --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token tenure-compare \
      --quota-backend-bytes 8589934592 --logger zap --log-level warn >"$OUT/etcd$i.log" 2>&1 &
    server_pids+=($!)
  done
  for _ in $(seq 300); do
    for pid in "${server_pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "compare-etcd: an etcd member exited (port in use?); see $OUT/etcd*.log" >&2; exit 1; }
    done
    ETCDCTL_API=3 etcdctl --endpoints "$ETCD_ENDPOINTS" endpoint health >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "compare-etcd: etcd did not become healthy; see $OUT/etcd*.log" >&2
  exit 1
}

target_args() {
  case "$1" in
    tenure) echo "--target tenure --cluster $work/tenure/cluster.json" ;;
    tenure-http) echo "--target tenure-http --cluster $work/tenure/cluster.json" ;;
    etcd) echo "--target etcd --endpoints $ETCD_ENDPOINTS" ;;
  esac
}

# run_loadgen NAME TARGET ARGS...: one bounded loadgen run; its report gets the servers' CPU.
run_loadgen() {
  local name=$1 target=$2; shift 2
  local before after
  before=$(server_cpu)
  rm -f "$OUT/$name.json"
  # shellcheck disable=SC2046
  timeout --signal=TERM --kill-after=10 900 "$bin/loadgen" $(target_args "$target") \
    --report-json "$OUT/$name.json" --plot "$OUT/$name.svg" "$@" \
    >"$OUT/$name.txt" 2>"$OUT/$name.progress" &
  current=$!
  local status=0
  wait "$current" || status=$?
  current=""
  if [ "$status" -ne 0 ] || [ ! -s "$OUT/$name.json" ]; then
    echo "compare-etcd: $name failed (exit $status); see $OUT/$name.progress" >&2
    return 1
  fi
  after=$(server_cpu)
  python3 - "$OUT/$name.json" "$before" "$after" $(server_tree) <<'PY'
import json, sys
path, before, after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
report = json.load(open(path))
report["server_cpu_s"] = after - before
# Each server process's resident memory when the run ended and its peak since it started
# (VmRSS, VmHWM), for the processes still running.
memory = {}
for pid in sys.argv[4:]:
    try:
        fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status") if ":" in line)
        memory[pid] = {key: int(fields[field].split()[0]) * 1024
                       for key, field in (("rss_bytes", "VmRSS"), ("peak_rss_bytes", "VmHWM"))}
    except (OSError, KeyError, ValueError):
        pass
report["server_memory"] = memory
json.dump(report, open(path, "w"), indent=1)
PY
  echo "  $name: $(head -1 "$OUT/$name.txt")"
}

run_target() {
  local target=$1 scenario throughput rate
  for scenario in $SCENARIOS; do
    case "$scenario" in
      acquire|mixed|contended)
        run_loadgen "$target-$scenario-sat" "$target" --scenario "$scenario" --workers "$WORKERS" \
          --warmup "$WARMUP" --duration "$DURATION" || continue
        throughput=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['throughput_ops_per_s'])" \
          "$OUT/$target-$scenario-sat.json" 2>/dev/null || echo 0)
        rate=$(python3 -c "import sys; print(max(1, round(float(sys.argv[1]) / 2)))" "$throughput")
        # At least one operation per worker per minute (loadgen's bound).
        half_workers=$(python3 -c "import sys; print(max(1, min(int(sys.argv[1]), int(sys.argv[2]) * 60)))" "$WORKERS" "$rate")
        run_loadgen "$target-$scenario-half" "$target" --scenario "$scenario" --workers "$half_workers" \
          --rate "$rate" --warmup "$WARMUP" --duration "$DURATION" || true
        ;;
      hold)
        run_loadgen "$target-hold" "$target" --scenario hold --leases "$HOLD_LEASES" \
          --workers "$WORKERS" --duration "${HOLD_S}s" ${HOLD_TTL:+--ttl "$HOLD_TTL"} || true
        ;;
      expiry)
        run_loadgen "$target-expiry" "$target" --scenario expiry --leases "$EXPIRY_LEASES" \
          --workers 64 --duration 90s || true
        ;;
      *) echo "compare-etcd: unknown scenario $scenario" >&2 ;;
    esac
  done
}

echo "compare-etcd: results in $OUT"
for target in $TARGETS; do
  case "$target" in
    tenure|tenure-http) start_tenure ;;
    etcd) start_etcd ;;
    *) echo "compare-etcd: unknown target $target" >&2; exit 2 ;;
  esac
  echo "compare-etcd: $target"
  run_target "$target"
  stop_servers
  rm -rf "$work/tenure" "$work"/etcd?
done

python3 bench/compare_table.py "$OUT" $TARGETS | tee "$OUT/table.txt"
