#!/usr/bin/env bash
# Installs the system packages the build and the tests need, if missing, on a Debian machine.
# Called by run.sh and test.sh; safe to run repeatedly (does nothing when all are present).
#   libclang-dev: RocksDB's bindgen (tenure-storage compiles RocksDB from source)
set -euo pipefail
SYSTEM_PACKAGES=(libclang-dev)
missing=()
for package in "${SYSTEM_PACKAGES[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
