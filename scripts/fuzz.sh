#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, cargo-fuzz on the nightly toolchain) for a fixed time each,
# from its committed seeds (fuzz/seeds/T) and its local corpus (fuzz/corpus/T, kept between
# runs, not committed), and writes a summary: target/fuzz-report.json (per target: seconds,
# runs, coverage `cov` and features `ft` as libFuzzer counts them, and the result).
#
#   scripts/fuzz.sh [--seconds N] [--sanitizer address|none] [TARGET...]
#
# A crash, a failed assertion, a leak (address) or an input taking over 10 s fails the run;
# libFuzzer leaves the input in fuzz/artifacts/T/ (replay it: cargo +nightly fuzz run T FILE).
# `make fuzz` runs 60 s a target with AddressSanitizer; CI (`make fuzz-smoke`) 5 s without a
# sanitizer (much faster to build; the code under test is safe Rust but for the VMM's guest
# memory, which the virtio targets exercise either way).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=60
SANITIZER=address
TARGETS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECONDS_EACH=$2; shift 2 ;;
        --sanitizer) SANITIZER=$2; shift 2 ;;
        -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
        *) TARGETS+=("$1"); shift ;;
    esac
done

command -v cargo-fuzz >/dev/null || {
    echo "fuzz.sh: cargo-fuzz is missing: cargo install cargo-fuzz --locked (or .ci/install-deps)" >&2
    exit 1
}
cargo +nightly --version >/dev/null 2>&1 || {
    echo "fuzz.sh: the nightly toolchain is missing: rustup toolchain install nightly" >&2
    exit 1
}
if [ ${#TARGETS[@]} -eq 0 ]; then
    mapfile -t TARGETS < <(cargo +nightly fuzz list)
fi

echo "==> cargo fuzz build (sanitizer $SANITIZER, ${#TARGETS[@]} targets)" >&2
# Release code with debug assertions (-a): an overflow in a parser is a finding too.
FLAGS=(-a -s "$SANITIZER")
cargo +nightly fuzz build "${FLAGS[@]}" || exit 1

mkdir -p target
report=target/fuzz-report.json
log_dir=$(mktemp -d /tmp/sc-fuzz.XXXXXX)
status=0
entries=()
for t in "${TARGETS[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    log="$log_dir/$t.log"
    result=ok
    cargo +nightly fuzz run "${FLAGS[@]}" "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1 || { result=failed; status=1; }
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1 | grep -o '[0-9]*' || true)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n1 | grep -o '[0-9]*' || true)
    echo "    $t: $result, ${runs:-0} runs in ${SECONDS_EACH}s, cov ${cov:-?}, ft ${ft:-?}" >&2
    if [ "$result" != ok ]; then
        echo "---- $t: the end of libFuzzer's output ----" >&2
        tail -n 40 "$log" >&2
    fi
    entries+=("{\"target\":\"$t\",\"seconds\":$SECONDS_EACH,\"runs\":${runs:-0},\"cov\":${cov:-null},\"ft\":${ft:-null},\"result\":\"$result\"}")
done
{
    printf '{"sanitizer":"%s","targets":[' "$SANITIZER"
    (IFS=,; printf '%s' "${entries[*]}")
    printf ']}\n'
} >"$report"
rm -rf "$log_dir"
echo "==> fuzz: $report" >&2
exit "$status"
