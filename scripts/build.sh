#!/usr/bin/env bash
# One build selection per profile, so every script that needs release binaries shares one
# RocksDB build (cargo's feature unification gives librocksdb-sys a new build hash, and a new
# 15-minute C++ compile, for every different package and feature selection):
#   ./scripts/build.sh release   # tenure, tenurectl, loadgen (with its etcd target), the bench binaries
# The selection is the cargo alias `build-release` (.cargo/config.toml), so `cargo build-release`
# typed by hand shares the same build. Used by scripts/run.sh, scripts/bench.sh,
# bench/compare-etcd.sh, bench/perf-smoke.sh and bench/profile.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
case "$profile" in
  release)
    cargo build-release
    ;;
  *) echo "build.sh: unknown profile $profile (known: release)" >&2; exit 2 ;;
esac
