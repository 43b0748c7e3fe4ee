#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, and the integration
# tests that start real services and FUSE mounts (needs root and /dev/fuse).
# Ends with one summary line over all test binaries: "tests: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace -- --test-threads="${HIVEFS_TEST_THREADS:-4}" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
