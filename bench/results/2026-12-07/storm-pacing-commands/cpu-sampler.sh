#!/usr/bin/env bash
# Samples the summed CPU time (utime+stime, clock ticks) of every `tenure serve` process once a
# second into $1, with a wall timestamp, until $2 (a file) exists or 900 s pass.
out=$1; stop=$2
hz=$(getconf CLK_TCK)
for i in $(seq 900); do
  [ -e "$stop" ] && break
  total=0
  for pid in $(pgrep -f "tenure serve"); do
    t=$(awk '{print $14+$15}' /proc/$pid/stat 2>/dev/null || echo 0)
    total=$((total + t))
  done
  echo "$(date +%s.%N) $total $hz" >> "$out"
  sleep 1
done
