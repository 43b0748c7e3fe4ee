#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, and the integration
# tests that start real services and FUSE mounts (needs root and /dev/fuse).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace -- --test-threads="${HIVEFS_TEST_THREADS:-4}"
