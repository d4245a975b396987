#!/usr/bin/env bash
# compute-sanitizer over one EP 1 step (tools/demo.py: schedule, forward, backward; BF16 and
# MXFP8) on the installed mok: memcheck (out-of-bounds and misaligned accesses) and synccheck
# (barrier misuse). Writes one line per tool and mode to REPORT, then the head of every log
# that holds an error; exits 1 if any does. tests/gpu/test_sanitizer.py runs it in the GPU suite.
#   PYTHONPATH=<site with mok> bash tools/sanitize.sh REPORT
# MOK_SANITIZE_TOOLS picks the tools (default "memcheck synccheck"). Left out (tried on 1x H200
# with 3888cee's wheel): initcheck, which does not see TMA or cuBLAS stores (the shared expert's
# gate, written whole by cuBLAS, reads as uninitialized in the SwiGLU kernel), and racecheck, which
# reports the MXFP8 mainloops' stage reuse (consumers' shared loads of a stage, then the
# producer's next bulk copy into it) although the pipeline's empty barrier orders them, as in
# CUTLASS's mixed-input one.
set -uo pipefail
report=${1:?usage: tools/sanitize.sh REPORT}
repo=$(cd "$(dirname "$0")/.." && pwd)
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [[ ! -x $sanitizer ]]; then
    echo "sanitize: no compute-sanitizer on PATH or in /usr/local/cuda" >&2
    exit 2
fi
logs=$(mktemp -d)
: > "$report"
failed=0
for tool in ${MOK_SANITIZE_TOOLS:-memcheck synccheck}; do
    for mode in bf16 mxfp8; do
        flag=()
        [[ $mode == mxfp8 ]] && flag=(--mxfp8)
        log=$logs/$tool-$mode.log
        start=$SECONDS
        # NCCL probes kernels for other architectures at start-up; those API errors are its own.
        timeout "${MOK_SANITIZE_TIMEOUT_S:-300}" "$sanitizer" --tool "$tool" \
            --target-processes all --report-api-errors no --print-limit 20 --log-file "$log" \
            python3 -P "$repo/tools/demo.py" --ep 1 "${flag[@]}" > "$log.out" 2>&1
        rc=$?
        # memcheck and synccheck: "ERROR SUMMARY: N errors"; racecheck: "(N errors, M warnings)".
        errors=$(grep -hoE 'ERROR SUMMARY: [0-9]+|\([0-9]+ errors?' "$log" | grep -oE '[0-9]+' |
            awk '{s += $1} END {if (NR) print s}')
        verdict=$(grep -ho '^\(PASS\|FAIL\)' "$log.out" | head -1)
        echo "$tool $mode: ${errors:-no summary} errors, demo ${verdict:-did not finish}" \
            "(rc $rc, $((SECONDS - start)) s)" | tee -a "$report"
        if [[ ${errors:-1} != 0 || $verdict != PASS ]]; then
            failed=1
            { echo "--- $tool $mode"; head -n 60 "$log"; tail -n 20 "$log.out"; } >> "$logs/failures"
        fi
    done
done
[[ -f $logs/failures ]] && cat "$logs/failures" >> "$report"
rm -rf "$logs"
exit "$failed"
