#!/usr/bin/env bash
# The GPU machine's run, in stages sized so that each fits one 10-minute device command:
#   bash scripts/gpu.sh STAGE... [-- extra bench args]
# stages: tests (the suite, GPU-only tests included, minus the reliability file; $TESTS picks files), reliability (1,000 identical
# runs, cuda:1, > 2^31 elements, two-GPU DDP: run alone, it needs the whole GPUs' memory), fuzz (hypothesis with
# the long GPU profile), sanitize (compute-sanitizer memcheck over every registry case at "tiny", racecheck over
# the kernels that use shared memory for reductions), bench (every op, JSON to $OUT).
# Uses ./.venv when there is one, else python3 with PYTHONPATH=src (the GPU machine has no package index).
# Output: $OUT (default ./gpu-out), one log per stage; the exit status is the first failing stage's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}; fi
export PYTHONUNBUFFERED=1
JOBS=${GRADKERN_GPU_JOBS:-8}  # pytest-xdist workers where installed; more than ~8 exhaust one GPU's memory
if $PY -c "import xdist" 2>/dev/null; then XDIST=(-n "$JOBS"); else XDIST=(); fi
PYTEST=($PY -m pytest -q -p no:cacheprovider --tb=short -rfE -o faulthandler_timeout=300)
status=0
run() {  # run NAME CMD...: log to $OUT/NAME.log, keep the first failure's status
    local name=$1; shift
    echo "== $name: $*"
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 5 "$OUT/$name.log"
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
    return 0
}
stages=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do stages+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#stages[@]} -eq 0 ] && stages=(tests reliability fuzz sanitize bench)
for stage in "${stages[@]}"; do
    case $stage in
        tests)  # TESTS="tests/test_a.py ..." runs a part (the whole suite compiles for longer than 10 minutes)
            # shellcheck disable=SC2086
            run tests "${PYTEST[@]}" "${XDIST[@]}" ${TESTS:-tests} --ignore=tests/test_reliability_gpu.py ;;
        reliability) run reliability "${PYTEST[@]}" tests/test_reliability_gpu.py ;;
        fuzz) GRADKERN_FUZZ_EXAMPLES=${GRADKERN_FUZZ_EXAMPLES:-200} \
                  run fuzz "${PYTEST[@]}" "${XDIST[@]}" tests/test_fuzz_pointwise.py tests/test_fuzz_ops.py ;;
        sanitize)
            # no caching allocator: each tensor is its own allocation, so memcheck sees any read past its end
            export GRADKERN_TEST_SIZE=tiny PYTORCH_NO_CUDA_MEMORY_CACHING=1
            run memcheck compute-sanitizer --tool memcheck --error-exitcode 86 --target-processes all \
                "${PYTEST[@]}" tests/test_registry.py -k "cases_match and (f32 or bf16)"
            run racecheck compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 86 \
                --target-processes all "${PYTEST[@]}" tests/test_registry.py \
                -k "cases_match and f32 and (prelu or repeat or sparsemax or segment or lerp or where)"
            unset GRADKERN_TEST_SIZE PYTORCH_NO_CUDA_MEMORY_CACHING ;;
        bench) run bench $PY -m gradkern bench --json "$OUT/bench.json" "$@" ;;
        *) echo "unknown stage: $stage" >&2; exit 2 ;;
    esac
done
exit $status
