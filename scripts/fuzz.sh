#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 20) with a fixed seed, as CI
# does; longer runs: scripts/fuzz.sh 3600. Needs a nightly toolchain and
# cargo-fuzz (installed from crates.io when missing). Without nightly it says
# so and exits 0: the decoders are also covered by property tests on stable.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECONDS_PER_TARGET=${1:-20}
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain here; skipping the fuzz targets (property tests still ran)"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install --quiet --locked cargo-fuzz
fi
for t in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$t"
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s"
  cargo +nightly fuzz run "$t" "corpus/$t" -- \
    -max_total_time="$SECONDS_PER_TARGET" -seed=1 -rss_limit_mb=1024 -max_len=65536 2>&1 |
    grep -E "^(Done|#[0-9]+.*DONE|INFO: Seed)|ERROR|panicked" || true
  test "${PIPESTATUS[0]}" -eq 0
  echo "fuzz: $t corpus: $(ls "corpus/$t" | wc -l) inputs"
done
