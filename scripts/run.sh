#!/usr/bin/env bash
# The README's run command. Today the cluster (`tenure dev`) does not exist yet: it arrives with the
# server issue. Until then this runs what does exist, end to end: the pure lease state machine
# holding one million active leases, reporting memory per lease and renewals applied per second.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
exec cargo run --release --locked -p tenure-bench --bin lease_memory -- "$@"
