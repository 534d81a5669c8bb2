#!/usr/bin/env bash
# The stress and soak tests under sanitizers, as far as the toolchain allows (issue 8).
#
# AddressSanitizer and ThreadSanitizer are unstable rustc flags (-Zsanitizer): this uses the
# stable compiler with RUSTC_BOOTSTRAP=1 and the sanitizer runtimes its rust-std ships for
# x86_64-unknown-linux-gnu. Without rust-src there is no -Zbuild-std, so the precompiled standard
# library is not instrumented. ASan accepts that and still sees every heap access of our code
# (the host-backed device's memory is a heap allocation). TSan refuses to mix with an
# uninstrumented std ("mixing -Zsanitizer will cause an ABI mismatch"); it runs here only with
# -Cunsafe-allow-abi-mismatch=sanitizer, may then miss or invent races inside std's
# non-generic code, and so its verdict is printed, not a failure. If the compiler refuses ASan,
# the soak runs under valgrind memcheck instead, at a size valgrind can finish.
#
# Usage: scripts/sanitize.sh            (SOAK_OPS / VALGRIND_OPS override the sizes)
source "$(dirname "$0")/env.sh"
cd "$root"
target=x86_64-unknown-linux-gnu
soak_ops="${SOAK_OPS:-200000}"
valgrind_ops="${VALGRIND_OPS:-16000}"
status=0

sanitized() {  # sanitized NAME [RUSTFLAGS...] -- cargo test arguments...
    local name="$1" flags=""; shift
    while [ "$1" != "--" ]; do flags="$flags $1"; shift; done; shift
    RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=$name -Cdebuginfo=1$flags" \
        cargo test -p vrampool-core --target "$target" --target-dir "$CARGO_TARGET_DIR/sanitize-$name" "$@"
}

echo "== AddressSanitizer: stress test (8 threads x 4 strategies) and soak ($soak_ops ops)"
if sanitized address -- --test stress --test soak --no-run 2>"$CARGO_TARGET_DIR/asan-build.log"; then
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" VRAMPOOL_SOAK_OPS="$soak_ops" \
        sanitized address -- --test stress --test soak -- --nocapture || status=1
    echo "AddressSanitizer: $([ $status = 0 ] && echo clean || echo FAILED)"
else
    echo "AddressSanitizer refused by the toolchain:"; tail -5 "$CARGO_TARGET_DIR/asan-build.log"
    echo "== valgrind memcheck: soak ($valgrind_ops ops)"
    VRAMPOOL_SOAK_OPS="$valgrind_ops" cargo test -p vrampool-core --test soak --no-run
    binary="$(ls -t "$CARGO_TARGET_DIR"/debug/deps/soak-* | grep -v '\.d$' | head -1)"
    VRAMPOOL_SOAK_OPS="$valgrind_ops" valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite \
        "$binary" --nocapture || status=1
fi

echo "== ThreadSanitizer: stress test (informational: std is not instrumented)"
tsan_log="$CARGO_TARGET_DIR/tsan.log"
TSAN_OPTIONS="halt_on_error=0" sanitized thread -Cunsafe-allow-abi-mismatch=sanitizer -- --test stress >"$tsan_log" 2>&1 || true
grep "test result" "$tsan_log" || echo "ThreadSanitizer: the stress test did not finish (see $tsan_log)"
echo "ThreadSanitizer: $(grep -c 'WARNING: ThreadSanitizer' "$tsan_log" || true) warnings; where the racing accesses are reported:"
grep "SUMMARY: ThreadSanitizer" "$tsan_log" | sed 's/.* in //; s/::{closure.*//' | sort | uniq -c | sort -rn | head -12 || true
exit $status
