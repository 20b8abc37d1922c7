#!/usr/bin/env bash
# Issue 25: a fresh `tenure dev` (3 node processes, RocksDB with fsync, $GROUP_COUNT groups, on
# loopback) driven to $LEASES active leases by `loadgen --scenario scale`, which measures, while a
# foreground mix runs at $FOREGROUND_RATE ops/s (open loop): the saturated mixed throughput, a
# failover on the empty cluster, the acquire rate, a steady window holding the leases, each node's
# memory before and after (bytes per active lease per replica), the nodes' snapshot figures, a
# restart of a follower-heavy node, a failover with the leases held, an expiry storm of
# $STORM_LEASES session leases ending in the same second, and last a new replica: a fourth node
# added (`tenure dev add`) and one group's replica moved to it (`MoveReplica`), timed against 60 s
# per group share (last because the placement controller then goes on balancing onto the new
# node; `tenure dev` stops it with the others). Prints loadgen's table (each figure with
# its target and met/missed) and writes $OUT/scale.txt, $OUT/scale.json (the report),
# $OUT/scale.svg (node memory, throughput and p99 over time), $OUT/scale.progress (its progress
# lines) and $OUT/dev.log.
#
#   ./bench/scale.sh                                            # 1,000,000 leases, release build
#   BIN_DIR=target/release LEASES=200000 ./bench/scale.sh
#   BIN_DIR=target/release LEASES=10000000 ./bench/scale.sh     # the issue's figure
#
# The nodes' lease-state budget is sized for $LEASES (`tenure dev --node-memory-budget-bytes`,
# see loadgen/README.md "bench/scale.sh" for the arithmetic): enough lease records per group for
# the leases plus 10% and 10,000 (the hashing's unevenness, the foreground's and the probes'
# records), never less than `tenure dev`'s default (12 GiB split over the nodes). Each tenant
# holds at most $LEASES_PER_TENANT leases (under tenure's default quota of 1,000,000).
#
# Bounded: loadgen's phases are bounded and it runs under a timeout, `tenure dev` stops by
# itself, the whole script stops after $TIME_LIMIT_S.
set -euo pipefail
cd "$(dirname "$0")/.."

LEASES=${LEASES:-1000000}
GROUP_COUNT=${GROUP_COUNT:-64}
FOREGROUND_RATE=${FOREGROUND_RATE:-500}
SESSION_SHARE_PERCENT=${SESSION_SHARE_PERCENT:-90}
STORM_LEASES=${STORM_LEASES:-}
TTL=${TTL:-300s}
SESSION_TTL=${SESSION_TTL:-30s}
WORKERS=${WORKERS:-256}
# Workers of the acquire phase (one Batch in flight each): the bulk leaves the foreground room.
ACQUIRE_WORKERS=${ACQUIRE_WORKERS:-16}
WINDOW=${WINDOW:-20s}
SATURATION=${SATURATION:-10s}
LEASES_PER_TENANT=${LEASES_PER_TENANT:-500000}
# Log entries between a group's snapshots (`tenure dev --snapshot-every-entries`; the default
# 10,000 is never reached here: the session leases are acquired 256 to an entry, so a million
# leases are about 60 entries per group). At 200 every group builds snapshots during the run
# (the foreground alone is a few entries per second per group), so the build figures are real.
SNAPSHOT_EVERY_ENTRIES=${SNAPSHOT_EVERY_ENTRIES:-200}
# Leases a group reclaims per second while its reclaim is on time (`tenure dev
# --expire-paced-leases-per-s`, `timing.expire_paced_leases_per_s`); empty = the nodes' default
# (2,500), 0 = no pacing (the storm reclaimed as fast as the command rate allows).
EXPIRE_PACED_LEASES_PER_S=${EXPIRE_PACED_LEASES_PER_S:-}
# Expire commands a group proposes per second at most (`tenure dev --expire-commands-per-s-max`,
# `timing.expire_commands_per_s_max`); empty = the nodes' default (20).
EXPIRE_COMMANDS_PER_S_MAX=${EXPIRE_COMMANDS_PER_S_MAX:-}
# Worst-case heap bytes of a lease record plus a request-id record, and of a tenant's entry
# (tenure_core::LEASE_RECORD_BYTES_WORST + DEDUP_RECORD_BYTES_WORST, TENANT_BYTES_WORST), and
# the tenants per group the budget then reserves (GROUP_TENANTS_MAX_DEFAULT).
RECORD_PAIR_BYTES=${RECORD_PAIR_BYTES:-1568}
TENANT_BYTES=${TENANT_BYTES:-400}
TENANTS_PER_GROUP=${TENANTS_PER_GROUP:-16384}
records_per_group=$(( LEASES * 11 / 10 / GROUP_COUNT + 10000 ))
budget=$(( GROUP_COUNT * (TENANTS_PER_GROUP * TENANT_BYTES + records_per_group * RECORD_PAIR_BYTES) ))
default_budget=$(( (12 << 30) / 3 ))
[ "$budget" -lt "$default_budget" ] && budget=$default_budget
NODE_MEMORY_BUDGET_BYTES=${NODE_MEMORY_BUDGET_BYTES:-$budget}
# The acquire phase's bound (loadgen's default for scale: 120 s + 1 s per 2,000 leases) and
# room for everything else.
TIME_LIMIT_S=${TIME_LIMIT_S:-$(( 1500 + LEASES / 2000 ))}
OUT=${OUT:-bench/results/scale-$(date -u +%Y%m%dT%H%M%SZ)}

. bench/lib.sh
bench_setup scale

pacing=()
[ -n "$EXPIRE_PACED_LEASES_PER_S" ] && pacing=(--expire-paced-leases-per-s "$EXPIRE_PACED_LEASES_PER_S")
[ -n "$EXPIRE_COMMANDS_PER_S_MAX" ] && pacing+=(--expire-commands-per-s-max "$EXPIRE_COMMANDS_PER_S_MAX")
echo "scale: $LEASES leases, $GROUP_COUNT groups, budget $NODE_MEMORY_BUDGET_BYTES bytes per node, snapshot every $SNAPSHOT_EVERY_ENTRIES entries, expiry pacing ${EXPIRE_PACED_LEASES_PER_S:-default} leases/s and ${EXPIRE_COMMANDS_PER_S_MAX:-default} commands/s per group, foreground $FOREGROUND_RATE ops/s"
start_dev "$GROUP_COUNT" "$OUT/dev.log" --node-memory-budget-bytes "$NODE_MEMORY_BUDGET_BYTES" \
  --snapshot-every-entries "$SNAPSHOT_EVERY_ENTRIES" "${pacing[@]}"
grep -h "state limits per node" "$OUT/dev.log" || true
storm=()
[ -n "$STORM_LEASES" ] && storm=(--storm-leases "$STORM_LEASES")
status=0
run_bounded $((TIME_LIMIT_S - 60)) "$OUT/scale.txt" "$OUT/scale.progress" "$bin/loadgen" \
  --target tenure --cluster "$work/dev/cluster.json" --scenario scale --leases "$LEASES" \
  --session-share-percent "$SESSION_SHARE_PERCENT" --ttl "$TTL" --session-ttl "$SESSION_TTL" \
  --leases-per-tenant "$LEASES_PER_TENANT" --foreground-rate "$FOREGROUND_RATE" \
  --workers "$WORKERS" --acquire-workers "$ACQUIRE_WORKERS" --duration "$WINDOW" --saturation "$SATURATION" "${storm[@]}" \
  --tenure-bin "$bin/tenure" --dev-dir "$work/dev" \
  --report-json "$OUT/scale.json" --plot "$OUT/scale.svg" || status=$?
# Each node's restore at every start (the restart figure's first part).
grep -h "restored the groups' state machines" "$work"/dev/node-*/node.log > "$OUT/restore.log" 2>/dev/null || true
stop_dev
if [ "$status" -ne 0 ]; then
  echo "scale: loadgen exited with $status; the end of its progress:" >&2
  tail -30 "$OUT/scale.progress" >&2
fi
{
  echo "\$ LEASES=$LEASES GROUP_COUNT=$GROUP_COUNT FOREGROUND_RATE=$FOREGROUND_RATE SNAPSHOT_EVERY_ENTRIES=$SNAPSHOT_EVERY_ENTRIES ./bench/scale.sh"
  grep -h "state limits per node" "$OUT/dev.log" || true
  cat "$OUT/scale.txt"
} | tee "$OUT/table.txt"
echo "scale: results in $OUT"
exit "$status"
