#!/usr/bin/env bash
# The probes and benchmarks of the earlier issues, in one command; each stops by itself:
#  1. `lease_memory`: the pure lease state machine holding one million active leases (memory per
#     lease, renews/s);
#  2. `snapshot_pause`: one group holding one million leases: how long a snapshot build stops
#     its apply, before issue 25 (the whole write) and after (the freeze), and the restore time;
#  3. `transport_cluster`: three in-process nodes over real QUIC on loopback with RocksDB and fsync,
#     256 Raft groups: idle CPU, then replicated entries/s, write latency, Raft messages per frame.
# Arguments go to the cluster run (see bench/src/bin/transport_cluster.rs), e.g. --groups 64.
# Criterion micro-benchmarks: cargo bench -p tenure-bench --bench state_machine
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh release
bin="${CARGO_TARGET_DIR:-target}/release"
"$bin/lease_memory"
"$bin/snapshot_pause"
"$bin/transport_cluster" "$@"
