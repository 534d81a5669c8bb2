#!/usr/bin/env bash
# Runs CMD with the emulated CUDA driver (crates/emulated-cuda) loaded as libcuda.so.1:
#
#   scripts/emulated-cuda.sh python -c "import vrampool; print(vrampool.DevicePool(0))"
#   scripts/emulated-cuda.sh cargo test -p vrampool-cuda
#
# The emulator is test infrastructure, never a GPU: it runs the driver API on host memory, with
# virtual memory that faults like a GPU's, a worker thread per stream and a stream-order race
# check. This script builds it if needed and puts it first on the loader path (and gives Numba
# its path in NUMBA_CUDA_DRIVER). The machine it emulates comes from EMULATED_CUDA_* variables
# (crates/emulated-cuda/src/config.rs): devices, memory, driver version, VMM, faults. Strict mode
# is on unless EMULATED_CUDA_STRICT says otherwise: a race or an illegal address ends CMD.
source "$(dirname "$0")/env.sh"
[ $# -gt 0 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
(cd "$root" && cargo build --release --quiet -p emulated-cuda)
lib_dir="$CARGO_TARGET_DIR/emulated-cuda"
mkdir -p "$lib_dir"
for name in libcuda.so.1 libcuda.so; do
    ln -sf "$CARGO_TARGET_DIR/release/libemulated_cuda.so" "$lib_dir/$name"
done
export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NUMBA_CUDA_DRIVER="$lib_dir/libcuda.so.1"
export EMULATED_CUDA_STRICT="${EMULATED_CUDA_STRICT:-1}"
exec "$@"
