#!/usr/bin/env bash
# usage: rqsampler.sh OUT STOPFILE : every 0.5 s, per node process the summed schedstat of its
# threads (on-cpu ns, run-queue wait ns, timeslices)
out=$1; stop=$2
for i in $(seq 7200); do
  [ -e "$stop" ] && break
  ts=$(date +%s.%N)
  for pid in $(pgrep -f "tenure serve"); do
    cat /proc/$pid/task/*/schedstat 2>/dev/null | awk -v ts=$ts -v pid=$pid '{r+=$1; w+=$2; n+=$3} END {printf "%s %s %.0f %.0f %.0f\n", ts, pid, r, w, n}' >> $out
  done
  sleep 0.5
done
