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

# Builds the wheel and installs it into the venv.
install_wheel() {
    rm -rf "$root/dist"
    (cd "$root" && maturin build --release --quiet --out dist)
    python -m pip install --quiet --force-reinstall --no-deps "$root"/dist/vrampool-*.whl
}
