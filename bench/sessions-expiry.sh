#!/usr/bin/env bash
# Issue 23's second figure: $LEASES leases held in $SESSIONS session(s) end together, on a fresh
# `tenure dev` cluster per mode (3 node processes, RocksDB with fsync, on loopback), while
# background traffic (the mixed workload of another tenant, a quarter of $WORKERS workers) runs:
#   expire   keep-alives stop after one last keep-alive sent to every (session, group) record at
#            the same moment, so every record expires one ttl later
#   close    every record is closed at once
# For each: the time from the sessions' end to the nodes having ended every bound lease (their
# counter `tenure_session_leases_ended_total`, polled every 25 ms), and the background's p99
# while they did (and 3 s after) against its p99 in the 3 s before (every lease held). Prints one table, writes
# $OUT/table.txt, $OUT/<mode>.json (loadgen's report) and $OUT/<mode>.svg (its timeline plot).
#
#   ./bench/sessions-expiry.sh                                   # 100,000 leases, 1 session
#   LEASES=100000 SESSIONS=100 MODES=expire BIN_DIR=target/release ./bench/sessions-expiry.sh
#
# Bounded: each loadgen run has a --duration bound and a timeout, `tenure dev` stops by itself,
# the whole script stops after $TIME_LIMIT_S.
set -euo pipefail
cd "$(dirname "$0")/.."

LEASES=${LEASES:-100000}
SESSIONS=${SESSIONS:-1}
TTL=${TTL:-10s}
WORKERS=${WORKERS:-64}
# Leases each background worker keeps for renew and release. The mix renews a random one of
# them; with 10, each is renewed about every 0.3 s (ttl 10 s), so the background is a tenant
# whose renewals are on time. With more (loadgen's default is 1000; even 50 leaves about 4% of
# renewals with less than half their ttl left) enough renewals arrive late that a node loaded
# for a moment (the acquire phase, the reclaim) refuses that tenant's acquires for 2 s
# (renewal pressure), and the background stalls for reasons of its own.
HELD_PER_WORKER=${HELD_PER_WORKER:-10}
GROUP_COUNT=${GROUP_COUNT:-64}
MODES=${MODES:-"expire close"}
RUN_BOUND_S=${RUN_BOUND_S:-240}
TIME_LIMIT_S=${TIME_LIMIT_S:-1200}
OUT=${OUT:-bench/results/sessions-expiry-$(date -u +%Y%m%dT%H%M%SZ)}

. bench/lib.sh
bench_setup sessions-expiry

for mode in $MODES; do
  echo "sessions-expiry: $mode: $LEASES leases in $SESSIONS session(s), ttl $TTL, $GROUP_COUNT groups"
  start_dev "$GROUP_COUNT" "$OUT/$mode-dev.log"
  sleep 3
  run_bounded $((RUN_BOUND_S + 60)) "$OUT/$mode.txt" "$OUT/$mode.progress" "$bin/loadgen" --target tenure \
    --cluster "$work/dev/cluster.json" --scenario expiry --leases "$LEASES" --sessions "$SESSIONS" \
    --session-end "$mode" --ttl "$TTL" --workers "$WORKERS" --held-per-worker "$HELD_PER_WORKER" \
    --duration "${RUN_BOUND_S}s" --report-json "$OUT/$mode.json" --plot "$OUT/$mode.svg" ||
    echo "sessions-expiry: loadgen ($mode) exited with $?" >&2
  stop_dev
done

python3 - "$OUT" $MODES <<'EOF' | tee "$OUT/table.txt"
import json, sys
out, modes = sys.argv[1], sys.argv[2:]
def ms(value):
    return "-" if value is None else f"{value:,.0f}"
print(f"{'end':<7} {'leases':>8} {'sessions':>8} {'records':>7} {'ended':>8} {'all ended after end (ms)':>25} "
      f"{'fg p99 before (ms)':>18} {'fg p99 during (ms)':>18} {'ratio':>6} {'fg ops/s before':>15} {'during':>8} {'free after':>10}")
for mode in modes:
    try:
        d = json.load(open(f"{out}/{mode}.json"))["details"]
    except (OSError, ValueError, KeyError) as error:
        print(f"{mode:<7} no report ({error})")
        continue
    before, during = d["background_before"], d["background_during"]
    ratio = d["background_p99_during_over_before"]
    # Latest possible end to the last lease ended; with "expire" the end is known to within
    # end_window_ms (the last keep-alives' round trips).
    print(f"{mode:<7} {d['held']:>8} {d['sessions']:>8} {d['records']:>7} {d['ended']:>8} "
          f"{ms(d['all_ended_after_latest_end_ms']):>25} "
          f"{(before['p99_us'] or 0) / 1000:>18.1f} {(during['p99_us'] or 0) / 1000:>18.1f} "
          f"{'-' if ratio is None else f'{ratio:.2f}':>6} {before['ops_per_s'] or 0:>15.0f} {during['ops_per_s'] or 0:>8.0f} "
          f"{d['free_after_sampled']}/{d['free_after_sampled'] + d['not_free_after_sampled']:>4}")
EOF
echo "sessions-expiry: results in $OUT"
