# Sourced by the other scripts: a cached venv with the pinned tools, and a cached cargo target
# directory, both under ~/.cache/vrampool so that repeated runs (and CI on a warm machine) are quick.
set -euo pipefail
VRAMPOOL_CACHE="${VRAMPOOL_CACHE:-$HOME/.cache/vrampool}"
export VIRTUAL_ENV="$VRAMPOOL_CACHE/venv"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$VRAMPOOL_CACHE/target}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ ! -x "$VIRTUAL_ENV/bin/python" ]; then
    python3 -m venv "$VIRTUAL_ENV"
fi
export PATH="$VIRTUAL_ENV/bin:$PATH"
stamp="$VIRTUAL_ENV/.requirements-$(sha256sum "$root/requirements-dev.txt" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
    python -m pip install --quiet --upgrade pip
    python -m pip install --quiet -r "$root/requirements-dev.txt"
    touch "$stamp"
fi

# The manylinux2014 tag a portable wheel carries: glibc 2.17 and later (RHEL/Rocky 8 have 2.28).
WHEEL_PLATFORM=manylinux_2_17_x86_64

# Builds the portable abi3 wheel into DIR (default dist/): linked by zig against glibc 2.17, so
# that it installs on older clusters than the build machine's.
build_wheel() {
    local out="${1:-$root/dist}"
    (cd "$root" && maturin build --release --quiet --zig --compatibility manylinux2014 --out "$out")
}

# Builds the wheel and installs it into the venv.
install_wheel() {
    rm -rf "$root/dist"
    build_wheel "$root/dist"
    python -m pip install --quiet --force-reinstall --no-deps "$root"/dist/vrampool-*.whl
}

# Installs torch 2.11 (requirements-torch-2.11.txt) into its own cached folder and exports
# VRAMPOOL_TORCH_2_11, which tests/test_cpp_exception.py runs torch 2.11 from.
install_torch_2_11() {
    local dir="$VRAMPOOL_CACHE/torch-2.11"
    local done="$dir/.requirements-$(sha256sum "$root/requirements-torch-2.11.txt" | cut -c1-16)"
    if [ ! -e "$done" ]; then
        rm -rf "$dir"
        python -m pip install --quiet --no-deps --no-compile --target "$dir" -r "$root/requirements-torch-2.11.txt"
        touch "$done"
    fi
    export VRAMPOOL_TORCH_2_11="$dir"
}
