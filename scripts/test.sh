#!/usr/bin/env bash
# Sets everything up and runs every CPU test: Rust (unit, proptest, stress, loom), the CUDA
# suites under the emulated driver, and pytest.
source "$(dirname "$0")/env.sh"
cd "$root"
echo "== cargo test --workspace"
cargo test --workspace
echo "== the planner on the shared instances in release, where it must reach the lower bounds (a debug build checks validity only)"
cargo test --release -p vrampool-plan --test instances
echo "== vrampool-cuda's device tests under the emulated CUDA driver (host memory, not a GPU)"
EMULATED_CUDA_DEVICES=2 EMULATED_CUDA_MEMORY=48GiB VRAMPOOL_REQUIRE_EMULATED=1 VRAMPOOL_REQUIRE_GPU=1 \
    scripts/emulated-cuda.sh cargo test -p vrampool-cuda
echo "== loom models of the lock-free structures (magazine rings, live-block table)"
RUSTFLAGS="--cfg loom" cargo test -p vrampool-core --lib --target-dir "$CARGO_TARGET_DIR/loom" -- loom_tests
echo "== wheel and pytest"
install_wheel
python -m pytest -q "$@"
echo "== the CUDA Python suites under the emulated CUDA driver (host memory, not a GPU)"
EMULATED_CUDA_DEVICES=2 VRAMPOOL_REQUIRE_EMULATED=1 scripts/emulated-cuda.sh \
    python -m pytest -q tests/test_cuda_gpu.py tests/test_emulated_cuda.py tests/test_torch_gpu.py
