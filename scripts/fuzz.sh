#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/, each for a bounded time, and prints
# a summary: executions, executions per second, coverage, crashes.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 300; no TARGET means every target. Each
# target starts from its committed seeds (fuzz/seeds/<target>/) and its
# working corpus (fuzz/corpus/<target>/, not committed, kept between runs).
# A crash leaves its input in fuzz/artifacts/<target>/ and makes the script
# exit non-zero once every target has run; so does an input slower than
# FUZZ_TIMEOUT that is slow again when run on its own (one that is not was
# a stall of the machine: fuzz/stalls/<target>/). libFuzzer's output for each
# target is kept in fuzz/logs/<target>.log (FUZZ_LOG_DIR).
#
# Environment: FUZZ_RSS_MB (default 2048), FUZZ_TIMEOUT (seconds one input
# may take, default 10), FUZZ_BUILD_ARGS (extra `cargo fuzz build` flags),
# FUZZ_NICE (niceness, default 10).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${1:-300}
[ $# -gt 0 ] && shift
rss=${FUZZ_RSS_MB:-2048}
timeout=${FUZZ_TIMEOUT:-10}
niceness=${FUZZ_NICE:-10}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is missing: cargo install cargo-fuzz --locked" >&2
    exit 2
fi
# cargo fuzz needs nightly flags (-Zsanitizer); the toolchain here is stable.
if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi

echo "== building fuzz targets"
if [ $# -gt 0 ]; then
    targets=("$@")
    for target in "${targets[@]}"; do
        # shellcheck disable=SC2086
        nice -n "$niceness" cargo fuzz build ${FUZZ_BUILD_ARGS:-} "$target"
    done
else
    # shellcheck disable=SC2086
    nice -n "$niceness" cargo fuzz build ${FUZZ_BUILD_ARGS:-}
    mapfile -t targets < <(cargo fuzz list)
fi

# libFuzzer keeps an input whose run took longer than -report_slow_units as
# a slow-unit artifact, timed by the wall clock: a machine that stops the
# process for a while (a busy shared host) makes one of a fast input. Each
# is run again, three times: if even the fastest run is slow it stays a
# finding; if not, it is moved to stalls/<target>/, its best time is
# printed, and it is not counted as a crash.
recheck_slow_units() {
    local target=$1 unit start end best took failed_run
    for unit in "artifacts/$1"/slow-unit-*; do
        [ -e "$unit" ] || continue
        best=""
        failed_run=0
        for _ in 1 2 3; do
            start=$(date +%s%N)
            # shellcheck disable=SC2086
            cargo fuzz run ${FUZZ_BUILD_ARGS:-} "$target" "$unit" -- -runs=1 -timeout="$timeout" >/dev/null 2>&1 || failed_run=1
            end=$(date +%s%N)
            took=$(((end - start) / 1000000))
            if [ -z "$best" ] || [ "$took" -lt "$best" ]; then best=$took; fi
        done
        if [ "$failed_run" -ne 0 ]; then
            echo "-- $target: $(basename "$unit") fails when run again: a finding"
        elif [ "$best" -lt $((timeout * 1000)) ]; then
            mkdir -p "stalls/$target"
            mv "$unit" "stalls/$target/"
            echo "-- $target: $(basename "$unit") took ${best} ms at best when run again (slow-unit limit" \
                "${timeout} s): the machine stalled, not the input; kept in fuzz/stalls/$target/"
        else
            echo "-- $target: $(basename "$unit") is slow again: ${best} ms at best"
        fi
    done
}

logs=${FUZZ_LOG_DIR:-logs}
mkdir -p "$logs"
failed=0
summary=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "artifacts/$target" "seeds/$target"
    # One left by an earlier run is settled first, so the count below is
    # of this run's findings.
    recheck_slow_units "$target"
    before=$(find "artifacts/$target" -type f | wc -l)
    echo "== fuzzing $target for ${seconds}s"
    status=0
    # shellcheck disable=SC2086
    nice -n "$niceness" cargo fuzz run ${FUZZ_BUILD_ARGS:-} "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb="$rss" -timeout="$timeout" -report_slow_units="$timeout" \
        -print_final_stats=1 >"$logs/$target.log" 2>&1 || status=$?
    recheck_slow_units "$target"
    after=$(find "artifacts/$target" -type f | wc -l)
    log="$logs/$target.log"
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    if [ -z "$execs" ]; then
        # A crash ends the run before the final stats: take the last status line.
        execs=$( (grep -o '^#[0-9]*' "$log" || true) | tail -1 | tr -d '#')
    fi
    cov=$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
    ft=$( (grep -o 'ft: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
    corpus=$(find "corpus/$target" -type f | wc -l)
    crashes=$((after - before))
    if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        failed=1
        echo "-- $target FAILED (exit $status); the end of its log:"
        grep -v '^#[0-9]' "$log" | tail -40
        [ "$crashes" -gt 0 ] && ls -1 "artifacts/$target"
    fi
    summary+=("$(printf '%-18s %12s %10s %8s %8s %8s %8s' "$target" "${execs:-?}" "${rate:-?}" \
        "${cov:-?}" "${ft:-?}" "$corpus" "$crashes")")
done

echo
echo "== fuzz summary (${seconds}s per target)"
printf '%-18s %12s %10s %8s %8s %8s %8s\n' target executions exec/s cov features corpus crashes
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
    echo "fuzzing found crashes: inputs are in fuzz/artifacts/<target>/" >&2
    exit 1
fi
