#!/usr/bin/env bash
# GPU checks for vrampool's CUDA device, in one command, meant for the GPU machine.
#
#   scripts/gpu-check.sh [--require-gpu]   run the checks; results and logs go to $OUT (./gpu-out)
#   scripts/gpu-check.sh --stage DIR       build everything the checks need HERE into DIR, for a
#                                          GPU machine with no cargo and no network (carry DIR)
#
# --stage puts in DIR: the release test binaries of vrampool-cuda (unit-tests, gpu-tests,
# emulated-tests), the benchmark (gpu_bench), the abi3 wheel (vrampool-*.whl, for any Python >=
# 3.9) and wheels of pytest and its dependencies, stripped of debug info (well under 64 MiB).
#
# Run mode, from the repo root (with VRAMPOOL_GPU_BIN=DIR: the staged files; else cargo):
#   1. env.txt      nvidia-smi, driver, toolchain, Python, torch
#   2. tests.log    the Rust CUDA tests: `cargo test --offline --release -p vrampool-cuda`, or the
#                   staged test binaries (emulated-tests reports itself ignored on a real driver)
#   3. bench.json   crates/vrampool-cuda/examples/gpu_bench.rs (+ bench.log): alloc+free latency
#                   of vrampool's strategies vs cuMemAlloc and cuMemAllocAsync
#   4. python.log   the Python GPU tests (tests/test_cuda_gpu.py, tests/test_torch_gpu.py) on the
#                   staged wheel, installed with --no-deps into a scratch folder (python.xml:
#                   JUnit results; torch_gpu.json: the training comparison's figures;
#                   torch_hooks.json: the torch version and the allocator hooks it took)
#   5. pause.log    benches/pause_resume.py: pause and resume of 1-8 GiB with and without a
#                   backup, beside trim-and-regrow and the driver's own copies, on the GPU
#   6. summary.json each step's status, rc and seconds
#
# Every step runs under `timeout`, inside an overall budget (GPU_CHECK_BUDGET_S, 460 s).
# Where nvidia-smi lists a GPU (or with --require-gpu), a missing CUDA device is a failure, not
# a skip (VRAMPOOL_REQUIRE_GPU=1 reaches the tests). Exit status: 0 when every step passed or was
# skipped, 1 when one failed, 2 on bad usage.
#
# Rehearsal without a GPU (everything but torch's CUDA half, which needs the CUDA runtime):
#   scripts/gpu-check.sh --stage gpu-bin
#   EMULATED_CUDA_MEMORY=48GiB VRAMPOOL_GPU_BIN=gpu-bin OUT=/tmp/gpu-out scripts/emulated-cuda.sh scripts/gpu-check.sh
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-460}
TARGET_DIR=${CARGO_TARGET_DIR:-target}

stage() {
    local dir=$1
    mkdir -p "$dir" || return 1
    dir=$(cd "$dir" && pwd)
    # The build tools (cargo's target folder, maturin, pip) come from the project's venv.
    source scripts/env.sh || return 1
    TARGET_DIR=$CARGO_TARGET_DIR
    echo "== building release test binaries into $dir"
    local json
    json=$(cargo test --release -p vrampool-cuda --no-run --message-format=json) || return 1
    printf '%s\n' "$json" | python3 -c '
import json, shutil, sys
dest = sys.argv[1]
names = {"gpu": "gpu-tests", "emulated": "emulated-tests", "vrampool_cuda": "unit-tests"}
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    exe = msg.get("executable") if msg.get("reason") == "compiler-artifact" else None
    if exe and msg.get("profile", {}).get("test"):
        name = names[msg["target"]["name"]]
        shutil.copy2(exe, f"{dest}/{name}")
        print(f"   {exe} -> {dest}/{name}")
' "$dir" || return 1
    echo "== building the benchmark"
    cargo build --release -p vrampool-cuda --example gpu_bench || return 1
    cp "$TARGET_DIR/release/examples/gpu_bench" "$dir/gpu_bench" || return 1
    # Debug info is most of the size; the working tree that travels is limited.
    if command -v strip >/dev/null; then strip --strip-debug "$dir"/*-tests "$dir/gpu_bench"; fi
    echo "== building the abi3 wheel and fetching pytest's"
    rm -f "$dir"/*.whl
    build_wheel "$dir" || return 1  # the portable wheel CI tests
    python -m pip download --quiet --only-binary=:all: --dest "$dir/wheels" "$(grep '^pytest==' requirements-dev.txt)" || return 1
    git rev-parse HEAD >"$dir/COMMIT" 2>/dev/null || true
    ls -la "$dir" "$dir/wheels"
    du -sh "$dir"
    echo "staged; carry '$dir' and run: VRAMPOOL_GPU_BIN=$dir scripts/gpu-check.sh"
}

REQUIRE=${VRAMPOOL_REQUIRE_GPU:-}
case "${1:-}" in
    --stage)
        [ $# -eq 2 ] || { echo "usage: $0 --stage DIR" >&2; exit 2; }
        stage "$2"
        exit $?
        ;;
    --require-gpu) REQUIRE=1 ;;
    "") ;;
    *) echo "usage: $0 [--require-gpu] | --stage DIR" >&2; exit 2 ;;
esac

OUT=${OUT:-./gpu-out}
mkdir -p "$OUT" || exit 2
BIN=${VRAMPOOL_GPU_BIN:-gpu-bin}
STEPS=()
FAILED=0

# Seconds a step may take: its own cap, within what is left of the overall budget.
allow() {
    local left=$((BUDGET - ($(date +%s) - START)))
    [ "$left" -lt "$1" ] && echo $((left > 5 ? left : 5)) || echo "$1"
}

# record NAME STATUS RC SECONDS LOG
record() {
    STEPS+=("{\"name\": \"$1\", \"status\": \"$2\", \"rc\": $3, \"seconds\": $4, \"log\": \"$5\"}")
    [ "$2" = fail ] && FAILED=1
    echo "== $1: $2 (rc $3, ${4}s)"
}

# run_step NAME LOG CAP_SECONDS CMD...: runs CMD under timeout, output to LOG (and the terminal).
run_step() {
    local name=$1 log=$2 cap=$3
    shift 3
    local t0 rc
    t0=$(date +%s)
    echo "== $name: $*"
    timeout --kill-after=10 "$(allow "$cap")" "$@" 2>&1 | tee -a "$OUT/$log"
    rc=${PIPESTATUS[0]}
    LAST_RC=$rc
    LAST_SECONDS=$(($(date +%s) - t0))
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "== $name: TIMED OUT" | tee -a "$OUT/$log"
    return 0
}

# ---- 1. environment ----
{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -a)"
    echo "cargo: $(cargo --version 2>/dev/null || echo absent)"
    echo "rustc: $(rustc --version 2>/dev/null || echo absent)"
    echo "--- nvidia-smi"
    timeout 30 nvidia-smi 2>&1 || echo "nvidia-smi: absent or failed"
    echo "--- nvidia-smi -L"
    timeout 30 nvidia-smi -L 2>&1 || true
} >"$OUT/env.txt"
if [ -z "$REQUIRE" ] && timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    REQUIRE=1
fi
export VRAMPOOL_REQUIRE_GPU=${REQUIRE:-0}
echo "== gpu required: $VRAMPOOL_REQUIRE_GPU (see $OUT/env.txt)"

{
    echo "--- python"
    python3 -c 'import sys; print(sys.version)' 2>&1 || echo "python3: absent"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1
} >>"$OUT/env.txt"
if command -v cargo >/dev/null && [ -z "${VRAMPOOL_GPU_BIN:-}" ]; then
    MODE=cargo
elif [ -x "$BIN/gpu-tests" ]; then
    MODE=staged
else
    MODE=none
fi
echo "== mode: $MODE"

# ---- 2. tests ----
: >"$OUT/tests.log"
case $MODE in
    cargo)
        run_step tests tests.log 300 cargo test --offline --release -p vrampool-cuda -- --nocapture
        ;;
    staged)
        LAST_RC=0
        T0=$(date +%s)
        for exe in "$BIN/unit-tests" "$BIN/gpu-tests" "$BIN/emulated-tests"; do
            [ -x "$exe" ] || continue
            run_step "tests ($exe)" tests.log 120 "$exe" --nocapture
            [ "$LAST_RC" -ne 0 ] && break
        done
        LAST_SECONDS=$(($(date +%s) - T0))
        ;;
    none)
        echo "neither cargo nor staged binaries ($BIN/gpu-tests); see: $0 --stage DIR" | tee "$OUT/tests.log"
        LAST_RC=127
        LAST_SECONDS=0
        ;;
esac
if [ "$LAST_RC" -ne 0 ]; then
    record tests fail "$LAST_RC" "$LAST_SECONDS" tests.log
elif grep -q '^skipped: no CUDA device' "$OUT/tests.log"; then
    record tests skipped 0 "$LAST_SECONDS" tests.log
else
    record tests pass 0 "$LAST_SECONDS" tests.log
fi

# ---- 3. benchmark ----
: >"$OUT/bench.log"
BENCH=
case $MODE in
    cargo)
        run_step "bench build" bench.log 180 cargo build --offline --release -p vrampool-cuda --example gpu_bench
        [ "$LAST_RC" -eq 0 ] && BENCH="$TARGET_DIR/release/examples/gpu_bench"
        ;;
    staged) [ -x "$BIN/gpu_bench" ] && BENCH="$BIN/gpu_bench" ;;
esac
if [ -z "$BENCH" ]; then
    record bench fail "${LAST_RC:-127}" 0 bench.log
else
    run_step bench bench.log 150 "$BENCH" --out "$OUT/bench.json"
    case $LAST_RC in
        0) record bench pass 0 "$LAST_SECONDS" bench.log ;;
        3) if [ "$VRAMPOOL_REQUIRE_GPU" = 1 ]; then
               record bench fail 3 "$LAST_SECONDS" bench.log
           else
               record bench skipped 3 "$LAST_SECONDS" bench.log
           fi ;;
        *) record bench fail "$LAST_RC" "$LAST_SECONDS" bench.log ;;
    esac
fi

# ---- 4. Python: the GPU tests on the staged wheel (or the built module where there is no stage) ----
PY_TESTS=(tests/test_cuda_gpu.py tests/test_torch_gpu.py)
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
: >"$OUT/python.log"
PY_READY=
if [ "$MODE" = staged ] && ls "$BIN"/vrampool-*.whl >/dev/null 2>&1; then
    # --no-deps: the machine's own torch, CuPy, Numba and cuda-python stay as they are.
    if python3 -m pip install --quiet --no-deps --no-index --target "$SITE" "$BIN"/vrampool-*.whl >>"$OUT/python.log" 2>&1; then
        PY_READY=1
        python3 -c 'import pytest' 2>/dev/null \
            || python3 -m pip install --quiet --no-deps --no-index --target "$SITE" "$BIN"/wheels/*.whl >>"$OUT/python.log" 2>&1 \
            || PY_READY=
    fi
    PY_PATH=$SITE
elif PYTHONPATH=python python3 -c 'import vrampool._native' 2>/dev/null; then
    PY_READY=1
    PY_PATH=python
fi
if [ -n "$PY_READY" ]; then
    PYTHONPATH=$PY_PATH timeout 60 python3 -c '
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch, vrampool.torch as vt
    vt.allocator()
    out.update(torch=torch.__version__, hooks=vt.hooks())
except Exception as e:
    out["error"] = repr(e)
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(out)
' "$OUT/torch_hooks.json" >>"$OUT/python.log" 2>&1
    PYTHONPATH=$PY_PATH OUT=$OUT run_step python python.log 240 python3 -m pytest -q -rs -p no:cacheprovider \
        --junitxml="$OUT/python.xml" "${PY_TESTS[@]}"
    case $LAST_RC in
        0) if grep -q ' passed' "$OUT/python.log"; then
               record python pass 0 "$LAST_SECONDS" python.log
           else
               record python skipped 0 "$LAST_SECONDS" python.log
           fi ;;
        5) record python skipped 5 "$LAST_SECONDS" python.log ;; # pytest: no tests collected
        *) record python fail "$LAST_RC" "$LAST_SECONDS" python.log ;;
    esac
else
    echo "no vrampool wheel staged (and no built module): see $0 --stage DIR" >>"$OUT/python.log"
    if [ "$VRAMPOOL_REQUIRE_GPU" = 1 ]; then
        record python fail 1 0 python.log
    else
        record python skipped 0 0 python.log
    fi
fi

# ---- 5. pause and resume of a tag's memory, timed on the GPU ----
if [ -n "$PY_READY" ]; then
    PYTHONPATH=$PY_PATH OUT=$OUT run_step pause pause.log 120 python3 benches/pause_resume.py --gib 1 2 4 8 --repeat 3
    case $LAST_RC in
        0) record pause pass 0 "$LAST_SECONDS" pause.log ;;
        3) if [ "$VRAMPOOL_REQUIRE_GPU" = 1 ]; then # 3: no CUDA device
               record pause fail 3 "$LAST_SECONDS" pause.log
           else
               record pause skipped 3 "$LAST_SECONDS" pause.log
           fi ;;
        *) record pause fail "$LAST_RC" "$LAST_SECONDS" pause.log ;;
    esac
fi

# ---- 6. summary ----
STATUS=pass
[ "$FAILED" -eq 1 ] && STATUS=fail
if [ "$STATUS" = pass ] && ! printf '%s\n' "${STEPS[@]}" | grep -q '"status": "pass"'; then
    STATUS=skipped
fi
if [ "$STATUS" = pass ] && printf '%s\n' "${STEPS[0]}" | grep -q '"status": "skipped"'; then
    STATUS=skipped # the tests themselves found no device
fi
{
    echo "{"
    echo "  \"status\": \"$STATUS\","
    echo "  \"gpu_required\": $([ "$VRAMPOOL_REQUIRE_GPU" = 1 ] && echo true || echo false),"
    echo "  \"mode\": \"$MODE\","
    echo "  \"seconds\": $(($(date +%s) - START)),"
    echo "  \"steps\": ["
    for i in "${!STEPS[@]}"; do
        sep=,
        [ "$i" -eq $((${#STEPS[@]} - 1)) ] && sep=
        echo "    ${STEPS[$i]}$sep"
    done
    echo "  ]"
    echo "}"
} >"$OUT/summary.json"
echo "== RESULT: ${STATUS^^} in $(($(date +%s) - START))s; see $OUT/summary.json"
[ "$STATUS" = fail ] && exit 1
exit 0
