#!/usr/bin/env bash
# System-wide flat profile around the storm's expiry (bin $1, name $2, pace $3)
bin=$1; name=$2; pace=${3:-}
OUT=/work/s26/$name
rm -rf $OUT; mkdir -p $OUT
cd /work/main
(BIN_DIR=$bin LEASES=1000000 STORM_LEASES=500000 EXPIRE_PACED_LEASES_PER_S=$pace OUT=$OUT timeout 1200 ./bench/scale.sh > $OUT/run.log 2>&1; echo "run rc=$?" >> $OUT/status) &
for i in $(seq 4500); do
  grep -q "leases in .* records kept alive one last time" $OUT/scale.progress 2>/dev/null && break
  sleep 0.2
done
date +%s.%N > $OUT/keptalive
sleep 26
echo "perf start $(date +%s.%N)" >> $OUT/status
perf record -a -g -F 997 -o $OUT/perf.data -- sleep 12 > $OUT/perf-rec.log 2>&1
echo "perf done $(date +%s.%N)" >> $OUT/status
wait
