#!/usr/bin/env bash
# usage: storm3.sh NAME BIN_DIR PACE SNAPSHOT_EVERY COMMANDS_PER_S
name=$1; bin=$2; pace=${3:-}; snap=${4:-200}; cmds=${5:-}
out=/work/s26/$name
rm -rf $out; mkdir -p $out
/work/cpu-sampler.sh $out/node-cpu.log $out/stop &
cd /work/main
BIN_DIR=$bin LEASES=1000000 STORM_LEASES=500000 EXPIRE_PACED_LEASES_PER_S=$pace SNAPSHOT_EVERY_ENTRIES=$snap EXPIRE_COMMANDS_PER_S_MAX=$cmds OUT=$out timeout 1200 ./bench/scale.sh > $out/run.log 2>&1
echo "rc=$?" >> $out/run.log
touch $out/stop
