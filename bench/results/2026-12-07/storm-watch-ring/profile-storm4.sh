#!/usr/bin/env bash
# Call-graph (dwarf) profile of two node processes over the first seconds of the storm.
OUT=/work/storm-prof4
rm -rf $OUT
cd /work/main
(BIN_DIR=/work/bin-freeze LEASES=1000000 STORM_LEASES=500000 OUT=$OUT timeout 1200 ./bench/scale.sh > /work/storm-prof4.log 2>&1; echo "run rc=$?" >> /work/storm-prof4.status) &
for i in $(seq 4500); do
  grep -q "leases in .* records kept alive one last time" $OUT/scale.progress 2>/dev/null && break
  sleep 0.2
done
sleep 29.3
pids=$(pgrep -f "tenure serve" | head -3 | paste -sd, -)
echo "perf start $(date +%s.%N) pids $pids" >> /work/storm-prof4.status
perf record -F 499 --call-graph dwarf,24576 -p $pids -o /work/storm4.perf.data -- sleep 4 > /work/perf-rec4.log 2>&1
echo "perf done $(date +%s.%N)" >> /work/storm-prof4.status
wait
