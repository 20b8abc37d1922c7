#!/usr/bin/env bash
# The README's run command. The node binary (`tenure dev`) arrives with the server issue; until then
# this runs what exists, end to end, and stops by itself (about a minute after the build):
#  1. the pure lease state machine holding one million active leases (memory per lease, renews/s);
#  2. three in-process nodes over real QUIC on loopback with RocksDB and fsync, 256 Raft groups:
#     idle CPU, then replicated entries/s, write latency and Raft messages per QUIC frame.
# Arguments go to the cluster run (see bench/src/bin/transport_cluster.rs), e.g. --groups 64.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cargo build --release --locked --workspace --all-features --bins
bin="${CARGO_TARGET_DIR:-target}/release"
"$bin/lease_memory"
"$bin/transport_cluster" "$@"
