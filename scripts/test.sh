#!/usr/bin/env bash
# The whole test suite, from a fresh machine of the project's kind (Debian, Rust toolchain, root).
# Installs what it needs, then: format check, clippy with warnings denied, every test.
# CI runs exactly this (.ci/run). Runtime on 2 cores: see README.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

for component in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
    echo "== installing rust component $component"
    rustup component add "$component"
  fi
done

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== promtool: ops/prometheus (alert rules, their unit tests, scrape config)"
promtool check rules ops/prometheus/tenure-alerts.yml
promtool test rules ops/prometheus/tenure-alerts.test.yml
promtool check config --syntax-only ops/prometheus/prometheus.yml

echo "== cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

echo "== cargo test (unit, property, integration; benches run once in test mode)"
# PROPTEST_CASES sets the property-test case count (default 4000 per property).
log_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$log_dir"
log="$log_dir/test-output.log"
set +e
cargo test --workspace --all-targets --all-features --locked -- --nocapture 2>&1 | tee "$log" \
  | grep --line-buffered -E '^(test result|     Running|model property|tight-bounds|crash test|disk full|disk-full|640 appends|[0-9]+ groups: |partition: |leader transfer: |lossy network|snapshots: |failover|restart catch-up: |restarted node installed|sigterm: |skew: |five nodes|ops kit|client routing|failover renewal|loss signal|lost answer|coalescing|loadgen |mixed: |contended: |hold: |expiry: |scale: |nemesis seed|negative control|fencing demo|checker: |sim short mode|sim replay|error|thread .* panicked)'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "== cargo test FAILED; the last lines of $log:"
  tail -n 300 "$log"
  exit "$status"
fi
if ! cargo test --workspace --doc --all-features --locked >>"$log" 2>&1; then
  echo "== doc tests FAILED; the last lines of $log:"
  tail -n 100 "$log"
  exit 1
fi

passed=$(grep -Eo 'test result: ok\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed' "$log" | awk '{s+=$6} END {print s+0}')
echo "tests: ${passed} passed, ${failed} failed"
