#!/usr/bin/env bash
# The soak of issue 8 at full length: 10 million mixed operations over 8 threads on one pool,
# in release, with the invariant checks of crates/vrampool-core/tests/soak.rs; prints the figures
# (operations, threads, time, cross-stream and deferred frees, leaked bytes).
# Usage: scripts/soak.sh [OPS]   (CI runs the same test with 100,000 in debug)
source "$(dirname "$0")/env.sh"
cd "$root"
ops="${1:-10000000}"
echo "== soak: $ops operations over 8 threads (release)"
VRAMPOOL_SOAK_OPS="$ops" cargo test --release -p vrampool-core --test soak -- --nocapture --test-threads 1
