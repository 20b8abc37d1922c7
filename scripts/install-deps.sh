#!/usr/bin/env bash
# Installs the system packages the build and the tests need, if missing, on a Debian machine.
# Called by run.sh and test.sh; safe to run repeatedly (does nothing when all are present).
#   libclang-dev: RocksDB's bindgen (tenure-storage compiles RocksDB from source)
#   prometheus:   promtool, which checks ops/prometheus (rules, their unit tests, the scrape config)
#   protobuf-compiler: protoc, for the etcd client's generated gRPC code (loadgen's `etcd` feature)
#   libprotobuf-dev: the well-known .proto files protoc imports (google/protobuf/descriptor.proto);
#                 protobuf-compiler only recommends it, and recommends are not installed here
#   etcd-server, etcd-client: etcd and etcdctl, the baseline of bench/compare-etcd.sh and of
#                 loadgen's etcd-target test
#   iptables:     partitions between the fault suite's node namespaces (ip netns, from iproute2)
#   iproute2:     ip, for those namespaces, veths and the bridge
#   faketime:     libfaketime, which moves a fault-suite node's wall clock (its monotonic clock
#                 is left alone)
# No service of these packages is started (policy-rc.d below); the tests and the benchmark start
# their own servers on loopback.
set -euo pipefail
SYSTEM_PACKAGES=(libclang-dev prometheus protobuf-compiler libprotobuf-dev etcd-server etcd-client iptables iproute2 faketime)
missing=()
for package in "${SYSTEM_PACKAGES[@]}"; do
  # "install ok installed" only: a removed package whose config files remain is missing too.
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # The prometheus package would start a Prometheus server listening on every interface; only
  # its promtool is wanted, so no service may start while installing (policy-rc.d says no).
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod +x "$policy"
    created_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$created_policy" -eq 1 ]; then $SUDO rm -f "$policy"; fi
  for service in prometheus etcd; do
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$service" 2>/dev/null; then
      $SUDO systemctl disable --now "$service" >/dev/null 2>&1 || true
    fi
  done
fi
