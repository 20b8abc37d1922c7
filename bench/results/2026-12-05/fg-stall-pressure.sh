#!/usr/bin/env bash
# Mixed open loop 500/s x 256 workers, 45 s, on a fresh 3-node dev cluster (64 groups), with
# [limits] late_renewal_remaining_percent = $LATE (50 default, 0 off). Also scrapes the pressure metrics.
set -euo pipefail
BIN=$1; OUT=$2; LATE=$3; mkdir -p $OUT
D=$(mktemp -d /tmp/fgstall.XXXX)
$BIN/tenure dev --base-port 0 --groups 64 --data-dir $D/dev --duration-s 1 > $OUT/dev-setup.log 2>&1 || true
for c in $D/dev/node-*/tenure.toml; do
  sed -i "s/^late_renewal_remaining_percent = .*/late_renewal_remaining_percent = $LATE/" $c
  grep -q "^late_renewal_remaining_percent = $LATE" $c || { echo "no key in $c"; exit 1; }
done
$BIN/tenure dev --base-port 0 --groups 64 --data-dir $D/dev --duration-s 150 > $OUT/dev.log 2>&1 &
DEV=$!
for i in $(seq 600); do [ -s $D/dev/cluster.json ] && break; sleep 0.1; done
sleep 3
timeout 80 $BIN/loadgen --target tenure --cluster $D/dev/cluster.json --scenario mixed --rate 500 --workers 256 --duration 45s > $OUT/mixed.txt 2>&1 || true
for n in 1 2 3; do
  url=$(python3 -c "import json;c=json.load(open('$D/dev/cluster.json'));print([x for x in c['nodes'] if x['id']==$n][0]['http'])" 2>/dev/null || true)
  [ -n "$url" ] && curl -s $url/metrics | grep -E "^tenure_(acquires_refused_renewal_pressure_total|renewals_late_total|renewals_sampled_total|lease_proposal_mean_seconds)" > $OUT/metrics-node$n.txt || true
done
kill -TERM $DEV; wait $DEV || true; rm -rf $D
