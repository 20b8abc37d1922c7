#!/usr/bin/env bash
# System-wide flat profile (every process, timestamps) around the scale run's storm expiry.
OUT=/work/storm-prof3
rm -rf $OUT
cd /work/main
(BIN_DIR=/work/bin-freeze LEASES=1000000 STORM_LEASES=500000 OUT=$OUT timeout 1200 ./bench/scale.sh > /work/storm-prof3.log 2>&1; echo "run rc=$?" >> /work/storm-prof3.status) &
for i in $(seq 4500); do
  grep -q "leases in .* records kept alive one last time" $OUT/scale.progress 2>/dev/null && break
  sleep 0.2
done
date +%s.%N > /work/storm-prof3.keptalive
sleep 24
echo "perf start $(date +%s.%N)" >> /work/storm-prof3.status
perf record -a -g -F 997 -o /work/storm3.perf.data -- sleep 14 > /work/perf-rec3.log 2>&1
echo "perf done $(date +%s.%N)" >> /work/storm-prof3.status
wait
