#!/usr/bin/env bash
# Sets everything up and runs every CPU test: lint (ruff, rustfmt, clippy), Rust (unit, proptest,
# stress, loom), the CUDA suites under the emulated driver, and pytest.
source "$(dirname "$0")/env.sh"
cd "$root"
cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1 || rustup component add rustfmt clippy
echo "== lint: ruff (python/, tests/, benches/), no module circle (every crate, the Python package), cargo fmt --check and clippy -D warnings (every crate)"
ruff check python tests benches
python scripts/check-imports.py
cargo fmt --all --check
cargo clippy --quiet --no-deps --workspace --all-targets -- -D warnings
echo "== cargo test --workspace"
cargo test --workspace
echo "== the planner on the shared instances and the large graphs in release, where it must reach the lower bounds (a debug build checks validity only)"
cargo test --release -p vrampool-plan --features generators --test instances --test large
echo "== vrampool-cuda's device tests under the emulated CUDA driver (host memory, not a GPU)"
EMULATED_CUDA_DEVICES=2 EMULATED_CUDA_MEMORY=48GiB VRAMPOOL_REQUIRE_EMULATED=1 VRAMPOOL_REQUIRE_GPU=1 \
    scripts/emulated-cuda.sh cargo test -p vrampool-cuda
echo "== loom models of the lock-free structures (magazine rings, live-block table, steal cell, kept run)"
RUSTFLAGS="--cfg loom" cargo test -p vrampool-core --lib --target-dir "$CARGO_TARGET_DIR/loom" -- loom_tests
echo "== the wheel, which must be portable (auditwheel show: $WHEEL_PLATFORM)"
install_wheel
tag=$(auditwheel show "$root"/dist/vrampool-*.whl)
grep -qF "\"$WHEEL_PLATFORM\"" <<<"$tag" || { echo "$tag"; echo "the wheel is not $WHEEL_PLATFORM" >&2; exit 1; }
echo "== pytest (with torch 2.11 beside the venv's 2.15 for the C++ exception's tests)"
install_torch_2_11
python -m pytest -q "$@"
echo "== the CUDA Python suites under the emulated CUDA driver (host memory, not a GPU)"
EMULATED_CUDA_DEVICES=2 VRAMPOOL_REQUIRE_EMULATED=1 scripts/emulated-cuda.sh \
    python -m pytest -q tests/test_cuda_gpu.py tests/test_emulated_cuda.py tests/test_steady_emulated.py tests/test_ahead_emulated.py tests/test_pause_emulated.py tests/test_torch_gpu.py tests/test_ipc.py tests/test_ipc_numba.py
echo "== the Python benchmarks (benches/), each run once as a test"
python -m pytest -q benches --benchmark-disable
