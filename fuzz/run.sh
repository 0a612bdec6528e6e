#!/usr/bin/env bash
# fuzz/run.sh SECONDS [TARGET...]   fuzz agentwal for SECONDS in all, under ASan/UBSan
#
# TARGETs: segment (fuzz_segment.py, C scanner vs the reference decoder), open
# (fuzz_open.py, Log.open / wal.open over damaged directories) and envelope (fuzz_envelope.py,
# sealed values opened from damaged bytes; run only when named); default segment and open, SECONDS split
# between them (the open target gets the larger share: it is ~20x slower per input).
#
# Builds the sanitizer venv first if the sources changed (build_asan.sh). Seeds come from
# fuzz/corpus/TARGET; new corpus entries go to fuzz/corpus-work/TARGET (gitignored), and
# crashing inputs to fuzz/corpus-work/artifacts/TARGET/. Exit status 1 if any target found
# anything; the inputs are listed with the command that reproduces each.
#
# Environment:
#   AGENTWAL_FUZZ_KNOWN=name,...  step over open findings (fuzz/findings/README.md) to look
#                                 for new ones; "all" for every one. Default: none. (libFuzzer
#                                 stops at the first finding; its -fork mode does not work
#                                 with atheris scripts, so this is how to keep going.)
#   FUZZ_ARGS="..."               extra libFuzzer flags.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="${AGENTWAL_ASAN_VENV:-$HERE/.venv-asan}"
WORK="$HERE/corpus-work"

usage() { echo "usage: fuzz/run.sh SECONDS [segment|open|envelope ...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
total="$1"; shift
[[ "$total" =~ ^[0-9]+$ ]] && [ "$total" -ge 2 ] || usage
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(segment open)
for t in "${targets[@]}"; do [ -f "$HERE/fuzz_$t.py" ] || usage; done

AGENTWAL_ASAN_VENV="$VENV" "$HERE/build_asan.sh" --if-needed
mapfile -t SAN_ENV < <(grep -v '^#' "$VENV/asan-env")

# The open target's directories: on tmpfs when there is one, in a per-run place removed at exit
# (a sanitizer abort skips the target's own clean-up).
scratch_base=/dev/shm
[ -d "$scratch_base" ] && [ -w "$scratch_base" ] || scratch_base="${TMPDIR:-/tmp}"
scratch="$(mktemp -d "$scratch_base/agentwal-fuzz-run.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

share() {  # seconds for target $1
    local n=${#targets[@]}
    if [ "$n" -eq 2 ]; then
        case "$1" in segment) echo $(( total * 2 / 5 > 0 ? total * 2 / 5 : 1 ));;
                     *) echo $(( total - total * 2 / 5 ));; esac
    else
        echo $(( total / n > 0 ? total / n : 1 ))
    fi
}

status=0
found=()
for t in "${targets[@]}"; do
    secs="$(share "$t")"
    mkdir -p "$WORK/$t" "$WORK/artifacts/$t"
    before="$(ls "$WORK/artifacts/$t" | sort)"
    args=(-max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -max_len=16384
          -artifact_prefix="$WORK/artifacts/$t/" -print_final_stats=1)
    # shellcheck disable=SC2206
    args+=(${FUZZ_ARGS:-})
    echo "== fuzz_$t for ${secs}s (corpus $WORK/$t + seeds fuzz/corpus/$t)" >&2
    rc=0
    (cd "$ROOT" && env "${SAN_ENV[@]}" AGENTWAL_FUZZ_TMP="$scratch" \
        "$VENV/bin/python" "$HERE/fuzz_$t.py" "${args[@]}" "$WORK/$t" "$HERE/corpus/$t") \
        >"$WORK/$t.log" 2>&1 || rc=$?
    grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::average_exec_per_sec|Done [0-9]+ runs)" \
        "$WORK/$t.log" >&2 || true
    new="$(comm -13 <(echo "$before") <(ls "$WORK/artifacts/$t" | sort) | grep -v '^$' || true)"
    if [ "$rc" -ne 0 ] || [ -n "$new" ]; then
        status=1
        echo "!! fuzz_$t: FOUND SOMETHING (exit $rc); log: $WORK/$t.log" >&2
        grep -m1 -A12 -E "Uncaught Python exception|ERROR: AddressSanitizer|runtime error:|ERROR: libFuzzer" \
            "$WORK/$t.log" >&2 || tail -20 "$WORK/$t.log" >&2
        for f in $new; do found+=("$t:$WORK/artifacts/$t/$f"); done
    fi
done

if [ "$status" -ne 0 ]; then
    echo >&2
    echo "== findings (reproduce without sanitizers: python fuzz/repro.py TARGET FILE;" >&2
    echo "   with them: env \$(grep -v '^#' $VENV/asan-env) $VENV/bin/python fuzz/fuzz_TARGET.py FILE)" >&2
    for f in "${found[@]}"; do echo "   ${f%%:*}  ${f#*:}" >&2; done
    exit 1
fi
echo "== no findings" >&2
