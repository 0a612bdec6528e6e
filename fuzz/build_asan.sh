#!/usr/bin/env bash
# Build agentwal with its C core under AddressSanitizer + UndefinedBehaviorSanitizer into a
# separate virtual environment for fuzzing, with atheris (libFuzzer for Python).
#
#   fuzz/build_asan.sh              (re)build, then print how to run a target by hand
#   fuzz/build_asan.sh --if-needed  rebuild only when the sources changed since the last build
#
# Environment: AGENTWAL_ASAN_VENV (default fuzz/.venv-asan), PYTHON (default python3, >= 3.11).
#
# How the sanitizers are wired, and why not the obvious way
# ---------------------------------------------------------
# The C core is compiled by gcc with -fsanitize=address,undefined (native/build.py takes the
# flags from AGENTWAL_CFLAGS), but it is *not* linked against gcc's libasan/libubsan. Python
# itself is not instrumented, so an ASan runtime has to be preloaded -- and preloading gcc's
# libasan (LD_PRELOAD=$(gcc -print-file-name=libasan.so)) breaks atheris: that runtime
# defines the __sanitizer_cov_* callbacks libFuzzer uses for coverage, steals them, and
# atheris warns "Coverage symbols are being provided by a library other than libFuzzer" and
# fuzzes blind (verified here: corpus stuck at one input). atheris ships the matching
# remedy: asan_with_fuzzer.so, clang's ASan runtime (UBSan handlers included) with libFuzzer
# linked in. gcc 12 and that runtime speak the same instrumentation ABI
# (__asan_version_mismatch_check_v8); this script checks that every __asan_*/__ubsan_*/
# __sanitizer_* symbol the extension needs is defined by the runtime, and runs a self-test
# that a heap overflow inside the C core is caught. -fsanitize-coverage=trace-cmp lets
# libFuzzer see the C core's comparisons (magic, CRCs, lengths).
#
# atheris: PyPI has manylinux wheels (atheris 3.0.0 for cp311 x86_64), so no clang is needed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="${AGENTWAL_ASAN_VENV:-$HERE/.venv-asan}"
PYTHON="${PYTHON:-python3}"
SAN_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1 -fsanitize-coverage=trace-cmp"
STAMP="$VENV/.agentwal-asan-build"

source_hash() {
    (cd "$ROOT" && cat pyproject.toml setup.py native/*.c native/*.h native/build.py wal/*.py \
        && echo "$SAN_CFLAGS") | sha256sum | cut -d' ' -f1
}

if [ "${1:-}" = "--if-needed" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(source_hash)" ]; then
    exit 0
fi

echo "== building agentwal with ASan/UBSan into $VENV" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install --quiet "atheris>=2.3" "cffi>=1.16" "lmdb>=1.4" "crcmod>=1.7" "setuptools>=68"

# Build from a clean copy: an in-tree build could pick up a non-sanitized build/ directory
# or wal/_native*.so left by an editable install.
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
cp -r "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/README.md" "$ROOT/native" "$ROOT/wal" "$src/"
# No built module of the tree comes along (an editable build may be writing them right now).
find "$src/wal" -name "*.so" -delete
rm -f "$src"/wal/_native.c
AGENTWAL_CFLAGS="$SAN_CFLAGS" AGENTWAL_LDFLAGS="" \
    pip install --quiet --no-deps --force-reinstall --no-build-isolation "$src"

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
RUNTIME="$("$VENV/bin/python" -c 'import atheris; print(atheris.path())')/asan_with_fuzzer.so"
EXT="$(ls "$SITE"/wal/_native*.so)"
[ -f "$RUNTIME" ] || { echo "atheris has no $RUNTIME; cannot run the ASan build" >&2; exit 1; }

# Every sanitizer symbol the extension expects must come from the preloaded runtime.
missing="$(comm -23 \
    <(nm -D --undefined-only "$EXT" | awk '{print $2}' | grep -E '^__(asan|ubsan|sanitizer)_' | sort -u) \
    <(nm -D --defined-only "$RUNTIME" | awk '{print $3}' | sort -u))"
if [ -n "$missing" ]; then
    echo "the sanitizer runtime $RUNTIME lacks symbols the gcc-built extension needs:" >&2
    echo "$missing" >&2
    exit 1
fi
# (nm's output is taken whole first: with pipefail, `nm | grep -q` fails when grep stops
# reading at the first match and nm, still writing, dies of SIGPIPE.)
if ! grep -q __asan_init <<<"$(nm -D --undefined-only "$EXT")"; then
    echo "$EXT is not instrumented (AGENTWAL_CFLAGS not honoured?)" >&2
    exit 1
fi

cat > "$VENV/asan-env" <<EOF
# Environment for running the ASan/UBSan build (written by fuzz/build_asan.sh).
LD_PRELOAD=$RUNTIME
ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:quarantine_size_mb=64:detect_stack_use_after_return=0:handle_abort=1
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
PYTHONMALLOC=malloc
EOF

# Self-test: an out-of-bounds read by the C core (a CRC over 64 bytes of a 16-byte heap
# buffer) must be reported by ASan. PYTHONMALLOC=malloc puts cffi's buffers on ASan's heap.
selftest="$(cd / && env $(cat "$VENV/asan-env" | grep -v '^#') "$VENV/bin/python" -c '
from wal._bindings import ffi, lib
buf = ffi.new("uint8_t[]", 16)
lib.wal_crc32c(0, buf, 64)
print("not caught")
' 2>&1 || true)"
if ! grep -q "heap-buffer-overflow" <<<"$selftest"; then
    echo "ASan self-test failed: an overflow in the C core was not reported:" >&2
    echo "$selftest" | tail -20 >&2
    exit 1
fi
echo "== ASan self-test ok (a heap overflow in the C core is reported)" >&2

source_hash > "$STAMP"
cat >&2 <<EOF
== done. Run a target by hand (from the repository root):
   env \$(grep -v '^#' $VENV/asan-env) $VENV/bin/python fuzz/fuzz_segment.py -max_total_time=60 fuzz/corpus-work/segment fuzz/corpus/segment
   (LD_PRELOAD=$RUNTIME: the sanitizer runtime, first in the process;
    ASAN_OPTIONS=detect_leaks=0 since CPython leaks by design; UBSAN_OPTIONS=halt_on_error=1.)
   Or simply: fuzz/run.sh SECONDS
EOF
