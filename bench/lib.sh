# Shared by the bench scripts that run `tenure dev` clusters (source it, do not run it):
# dependencies and binaries, a scratch directory, a time limit, starting and stopping
# `tenure dev`, a bounded command in the background, and the nodes' CPU from /proc.
#
#   . "$(dirname "$0")/lib.sh"
#   bench_setup my-bench            # needs OUT and TIME_LIMIT_S; sets bin, work, OUT (absolute)
#   bench_binaries                  # only the dependencies and $bin (scripts with their own cleanup)
#   start_dev 64 "$OUT/dev.log"     # a fresh cluster in $work/dev; sets dev (more `tenure dev`
#                                   # flags may follow the log file)
#   run_bounded 300 "$OUT/x.txt" "$OUT/x.progress" "$bin/loadgen" ...
#   stop_dev
#
# Everything started here stops by itself: the cluster after TIME_LIMIT_S, each command after
# its bound, the calling script after TIME_LIMIT_S (its watchdog), and all of it on exit.

dev=""
current=""
sampler=""
watchdog=""

# Installs what the benches need and picks the binaries (sets bin): $BIN_DIR (binaries built
# earlier, e.g. for an A/B comparison of two builds), else a release build.
bench_binaries() {
  ./scripts/install-deps.sh
  if [ -n "${BIN_DIR:-}" ]; then
    bin=$BIN_DIR
  else
    ./scripts/build.sh release
    bin="${CARGO_TARGET_DIR:-target}/release"
  fi
}

# bench_binaries, then $OUT made absolute, a scratch directory $work, cleanup on exit and the
# watchdog that stops the calling script after $TIME_LIMIT_S.
bench_setup() {
  local name=$1
  bench_binaries
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  work=$(mktemp -d "/tmp/tenure-$name.XXXXXX")
  bench_name=$name
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  ( sleep "$TIME_LIMIT_S"; echo "$name: time limit of ${TIME_LIMIT_S}s reached; stopping" >&2; kill -TERM $$ ) &
  watchdog=$!
  disown "$watchdog"
}

# Starts `tenure dev` with $1 groups in $work/dev (log to $2; further arguments are passed to
# `tenure dev`) and waits for its cluster.json.
start_dev() {
  local groups=$1 log=$2
  shift 2
  "$bin/tenure" dev --base-port 0 --groups "$groups" --data-dir "$work/dev" --duration-s "$TIME_LIMIT_S" \
    "$@" >"$log" 2>&1 &
  dev=$!
  for _ in $(seq 600); do
    [ -s "$work/dev/cluster.json" ] && break
    kill -0 "$dev" 2>/dev/null || break
    sleep 0.1
  done
  if ! [ -s "$work/dev/cluster.json" ]; then
    echo "$bench_name: tenure dev did not become ready" >&2
    tail -20 "$log" >&2
    exit 1
  fi
}

# Stops the cluster (TERM, then KILL after 20 s) and removes its data.
stop_dev() {
  [ -n "$dev" ] || return 0
  local nodes pid
  nodes=$(pgrep -P "$dev" || true)
  kill -TERM "$dev" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$dev" 2>/dev/null || break; sleep 0.1; done
  for pid in "$dev" $nodes; do kill -KILL "$pid" 2>/dev/null || true; done
  dev=""
  rm -rf "$work/dev"
}

# Runs a command for at most $1 seconds, stdout to $2 and stderr to $3; returns its status.
run_bounded() {
  local bound_s=$1 stdout=$2 stderr=$3 status=0
  shift 3
  timeout --signal=TERM --kill-after=10 "$bound_s" "$@" >"$stdout" 2>"$stderr" &
  current=$!
  wait "$current" || status=$?
  current=""
  return "$status"
}

# CPU seconds (user + system) of the cluster's node processes (USER_HZ = 100).
node_cpu() {
  local total=0 pid
  for pid in $(pgrep -P "$dev" || true); do
    total=$(awk -v t="$total" '{ sub(/.*\) /, ""); print t + ($12 + $13) / 100 }' "/proc/$pid/stat" 2>/dev/null || echo "$total")
  done
  echo "$total"
}

bench_cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  if [ -n "$current" ]; then
    kill -TERM "$current" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$current" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$current" 2>/dev/null || true
  fi
  stop_dev
  if [ -n "$watchdog" ]; then
    # The watchdog first, then its sleep: the other way round it would go on to stop us.
    local sleeper
    sleeper=$(pgrep -P "$watchdog" || true)
    kill "$watchdog" 2>/dev/null || true
    [ -n "$sleeper" ] && kill $sleeper 2>/dev/null || true
  fi
  rm -rf "$work"
}
