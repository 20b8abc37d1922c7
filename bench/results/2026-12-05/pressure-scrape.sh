#!/usr/bin/env bash
# scrape.sh CLUSTER_JSON_GLOB OUTFILE SECONDS: every 2 s, the pressure gauges/counters of every node.
glob=$1; out=$2; secs=$3; : > $out
end=$(( $(date +%s) + secs ))
cj=""
while [ $(date +%s) -lt $end ]; do
  [ -z "$cj" ] && cj=$(ls $glob 2>/dev/null | head -1)
  if [ -n "$cj" ] && [ -s "$cj" ]; then
    for url in $(python3 -c "import json,sys;c=json.load(open('$cj'));print(' '.join(x['http'] for x in c['nodes']))" 2>/dev/null); do
      line=$(curl -s -m 1 $url/metrics | grep -E "^tenure_(lease_proposal_mean_seconds|renewal_pressure_tenants|acquires_refused_renewal_pressure_total|renewals_late_total|renewals_sampled_total|requests_inflight|groups_led) " | awk '{printf "%s=%s ", $1, $2}')
      echo "$(date +%T) $url $line" >> $out
    done
  fi
  sleep 2
done
