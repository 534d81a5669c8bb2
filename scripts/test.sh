#!/usr/bin/env bash
# Sets everything up and runs every CPU test: Rust (unit, proptest, stress, loom) and pytest.
source "$(dirname "$0")/env.sh"
cd "$root"
echo "== cargo test --workspace"
cargo test --workspace
echo "== the planner on the shared instances in release, where it must reach the lower bounds (a debug build checks validity only)"
cargo test --release -p vrampool-plan --test instances
echo "== loom models of the lock-free structures (magazine rings, live-block table)"
RUSTFLAGS="--cfg loom" cargo test -p vrampool-core --lib --target-dir "$CARGO_TARGET_DIR/loom" -- loom_tests
echo "== wheel and pytest"
install_wheel
python -m pytest -q "$@"
