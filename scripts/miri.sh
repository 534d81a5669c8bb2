#!/usr/bin/env bash
# The core's unsafe code under Miri: the thread caches' raw pointer (found, used and given back
# at thread exit, and a pool dropped by a thread-local destructor), the arenas' published
# pointers and the host-backed simulated device's memory. Miri needs a nightly toolchain with the
# miri and rust-src components; this installs them through rustup if they are missing. Not part
# of scripts/test.sh: it downloads a toolchain and takes minutes.
#
# Usage: scripts/miri.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal --component miri rust-src
fi
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
target_dir="${CARGO_TARGET_DIR:-$HOME/.cache/vrampool/target}/miri"
echo "== the host-backed device, the live-block table, the arenas' table and the sharded maps"
cargo +nightly miri test -p vrampool-core --lib --target-dir "$target_dir" -- device::sim live_table::tests pool::arenas sharded_map
echo "== pool tests through the thread caches"
cargo +nightly miri test -p vrampool-core --test pool --target-dir "$target_dir" -- \
    small_blocks_come_back freed_blocks_are_reused blocks_cached_by_a_thread \
    a_pool_dropped_by_a_thread_local bad_input_is_refused two_pools_used_in_turn
