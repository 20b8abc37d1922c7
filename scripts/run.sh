#!/usr/bin/env bash
# The README's run command: a local 3-node tenure cluster on loopback (separate node processes,
# embedded RocksDB with fsync, 4 Raft groups per core (8 to 64)), ready for `tenurectl`, curl and the load generator.
# It writes ./tenure-dev/cluster.json once every group has a leader; Ctrl-C stops it cleanly and
# running it again restarts the same cluster with its data. Arguments go to `tenure dev`
# (e.g. --nodes 5 --groups 256 --data-dir /tmp/tenure, --duration-s 60 to stop by itself).
# The earlier probes stay runnable: ./scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh release
bin="${CARGO_TARGET_DIR:-target}/release"
exec "$bin/tenure" dev "$@"
