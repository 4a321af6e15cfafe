#!/usr/bin/env bash
# gpu_check.sh - on a GPU machine with torch preinstalled and no network: build
# torch_oss from scratch, run the whole test suite (CUDA cases included), the
# compute-sanitizer passes and the benchmarks, writing logs and results into
# $TORCH_OSS_RESULTS (default: results/).
#
#   bash scripts/gpu_check.sh                    # the default stages: build test attention_selftest sanitize bench
#   bash scripts/gpu_check.sh build test         # some stages: build test attention_selftest sanitize bench model
#                                                # selftest fuzz
#
#   bash scripts/gpu_check.sh build fuzz         # the long fuzz profile (FUZZ_SECONDS per test)
#
# Knobs: TORCH_CUDA_ARCH_LIST (default 9.0a), MAX_JOBS (default 16),
# TORCH_OSS_HEAD_DIMS, TESTS (test files or node ids, each run on its own; default every
# tests/test_*.py; an entry may join node ids with commas to run them in one pytest run), TEST_JOBS (pytest runs at once, default 1), FILE_TIMEOUT (seconds per pytest run, default 300), PYTEST_ARGS
# (extra pytest arguments), BENCH_ARGS_SOFTMAX,
# BENCH_ARGS_ATTENTION (extra benchmark arguments), SANITIZE_TOOLS (default
# "memcheck racecheck synccheck"), SANITIZE_PARTS (softmax and/or attention; default both),
# STAGE_TIMEOUT (seconds per stage, default 900), FUZZ_SECONDS, FUZZ_CHUNK, FUZZ_TESTS,
# TEST_SHARD (K/N: each pytest run keeps every N-th of its tests from the K-th on, so the
# suite runs as N calls that together cover each test once, e.g. under a per-command limit),
# TEST_DEADLINE (seconds after the script's start past which the test stage starts no
# further file: those are listed as not run, so a run under a wall-clock limit still
# reports what it did; each file's result is also printed as soon as it finishes).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${TORCH_OSS_RESULTS:-results}
mkdir -p "$RESULTS"
export TORCH_OSS_RESULTS=$RESULTS
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1
STAGES=${*:-build test attention_selftest sanitize bench}
T0=$(date +%s)
status=0
summary=()

stage() { echo; echo "=== $1 ($(date +%H:%M:%S)) ==="; }
record() { summary+=("$1: $2"); [ "$2" = ok ] || status=1; }

for s in $STAGES; do
  case $s in
  build)
    stage build
    rm -rf build torch_oss/_C*.so csrc/cuda/attention/generated
    start=$(date +%s)
    if python3 -m pip install -v --no-build-isolation --no-deps -e . >"$RESULTS/build.log" 2>&1; then
      record build ok
      echo "build took $(( $(date +%s) - start )) s"
      # The library must use the process's libstdc++, not carry a private copy
      # of its stream/locale code (that once crashed error formatting).
      so=$(ls torch_oss/_C*.so)
      echo "libstdc++ symbols defined in $so: $(nm -C -D --defined-only "$so" | grep -cE 'std::(basic_ostream|locale)')"
      grep -E "^\s*(g\+\+|c\+\+|x86_64-linux-gnu-g\+\+).* -shared" "$RESULTS/build.log" | tail -1 | cut -c1-600
    else
      tail -40 "$RESULTS/build.log"; record build failed
    fi
    grep -E "registers|spill" "$RESULTS/build.log" | grep -v " 0 bytes spill" | head -20
    python3 -c "import torch, torch_oss; print(torch.cuda.get_device_name(0)); print(torch_oss.build_info())"
    ;;
  test)
    # One pytest run per test file (or per entry of TESTS), each under its own
    # timeout and with its own log, so a slow or hanging file cannot hide the
    # others' results; TEST_JOBS (default 1) of them run at once (on the
    # 16-core H100 host four at once made each file 2-3x slower, which saved
    # little). The failures are listed with their messages, in the order of TESTS.
    # TORCH_OSS_REQUIRE_CUDA=1: each pytest run fails when the build has no CUDA
    # kernels or none of its CUDA tests ran (tests/conftest.py), and a run that
    # collects no test at all (pytest's rc 5) is a failure too.
    stage test
    export TORCH_OSS_REQUIRE_CUDA=1
    : >"$RESULTS/tests.log"
    # progress.log: one line per file as it finishes (read it when a run is cut
    # short and only a few of the logs come back)
    : >"$RESULTS/progress.log"
    ok=1
    files=(${TESTS:-$(ls tests/test_*.py)})
    # Parallel pytest runs share the cores: each gets its share of CPU threads,
    # or the spinning workers of their thread pools starve each other.
    [ "${TEST_JOBS:-1}" -gt 1 ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / TEST_JOBS > 0 ? $(nproc) / TEST_JOBS : 1 ))}
    # An entry may name several node ids joined by commas: they run in one pytest run.
    log_of() { echo "$RESULTS/test_$(echo "$1" | sed 's|^tests/||; s|,.*|_and_more|; s|[^A-Za-z0-9_.-]|_|g').log"; }
    summary_of() { grep -E '(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$1" | tail -1; }
    for t in "${files[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "${TEST_JOBS:-1}" ]; do wait -n; done
      if [ -n "${TEST_DEADLINE:-}" ] && [ $(( $(date +%s) - T0 )) -ge "$TEST_DEADLINE" ]; then
        echo "not run (TEST_DEADLINE)" >"$(log_of "$t")"
        echo "deadline 0" >"$(log_of "$t").rc"
        continue
      fi
      (
        start=$(date +%s)
        COLUMNS=500 timeout ${FILE_TIMEOUT:-300} python3 -m pytest $(echo "$t" | tr , ' ') -q -rfE --tb=short -p no:cacheprovider \
          ${TEST_SHARD:+--shard "$TEST_SHARD"} ${PYTEST_ARGS:-} >"$(log_of "$t")" 2>&1
        rc=$?
        echo "$rc $(( $(date +%s) - start ))" >"$(log_of "$t").rc"
        echo "  finished $t: rc $rc, $(( $(date +%s) - start )) s, $(summary_of "$(log_of "$t")")" |
          tee -a "$RESULTS/progress.log"
      ) &
    done
    wait
    for t in "${files[@]}"; do
      log=$(log_of "$t"); read -r rc secs <"$log.rc"
      cat "$log" >>"$RESULTS/tests.log"
      echo "$t: rc $rc, $secs s, $(summary_of "$log")"
      grep -E '^(FAILED|ERROR) ' "$log" | cut -c1-700
      [ "$rc" = 0 ] || ok=0
    done
    [ $ok = 1 ] && record tests ok || record tests failed
    ;;
  sanitize)
    stage sanitize
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
      timeout ${STAGE_TIMEOUT:-900} compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
        python3 scripts/sanitize_smoke.py ${SANITIZE_PARTS:-} >"$RESULTS/sanitize_$tool.log" 2>&1
      rc=$?
      tail -5 "$RESULTS/sanitize_$tool.log"
      [ $rc = 0 ] && record "sanitize $tool" ok || record "sanitize $tool" "failed (rc $rc)"
    done
    ;;
  bench)
    stage bench
    timeout ${STAGE_TIMEOUT:-900} python3 bench/softmax.py ${BENCH_ARGS_SOFTMAX:-} 2>&1 |
      tee "$RESULTS/bench_softmax.log" | tail -70
    timeout ${STAGE_TIMEOUT:-900} python3 bench/attention.py ${BENCH_ARGS_ATTENTION:-} 2>&1 |
      tee "$RESULTS/bench_attention.log" | tail -80
    record bench done
    ;;
  attention_selftest)
    # The standalone attention self-test (no torch; csrc/tests/attention_cuda_selftest.cu):
    # every dtype and compiled head dim, causal alignments, masks, GQA, awkward
    # lengths and layouts, default and deterministic backward, each tensor
    # against float64 by the tolerance rule; it exits non-zero when a case fails.
    # The kernels are compiled here on their own (MAX_JOBS at once), with the
    # build's flags, for TORCH_CUDA_ARCH_LIST's first arch (the Hopper kernels
    # with 9.0a).
    stage attention_selftest
    dir=build/attention_selftest
    rm -rf "$dir" && mkdir -p "$dir/obj"
    arch=$(echo "${TORCH_CUDA_ARCH_LIST}" | tr ' ;' '\n\n' | head -1)
    sm=$(echo "$arch" | tr -d '.+PTXptx')
    sm90=""
    [ "$sm" = 90a ] && sm90=--sm90
    flags="-std=c++17 -O3 -DOSS_WITH_CUDA -Icsrc -gencode=arch=compute_$sm,code=sm_$sm -U__CUDA_NO_HALF_OPERATORS__
      -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__
      --expt-relaxed-constexpr"
    start=$(date +%s)
    if python3 csrc/cuda/attention/generate_attention_kernels.py $sm90 --out-dir "$dir/generated" \
         ${TORCH_OSS_HEAD_DIMS:+--head-dims "$TORCH_OSS_HEAD_DIMS"} >"$RESULTS/attention_selftest_build.log" 2>&1 &&
       gcc -std=c11 -O2 -DOSS_WITH_CUDA -Icsrc -c csrc/common.c -o "$dir/obj/common.o" \
         >>"$RESULTS/attention_selftest_build.log" 2>&1 &&
       ls csrc/cuda/attention/*.cu "$dir"/generated/*.cu csrc/tests/attention_cuda_selftest.cu |
         xargs -P "$MAX_JOBS" -I{} sh -c 'nvcc $0 -c "{}" -o "$1/obj/$(echo "{}" | tr / _).o"' "$flags" "$dir" \
         >>"$RESULTS/attention_selftest_build.log" 2>&1 &&
       nvcc "$dir"/obj/*.o -o "$dir/selftest" >>"$RESULTS/attention_selftest_build.log" 2>&1; then
      echo "attention self-test built in $(( $(date +%s) - start )) s"
      timeout ${STAGE_TIMEOUT:-900} "$dir/selftest" --no-bench >"$RESULTS/attention_selftest.log" 2>&1
      rc=$?
      tail -n 8 "$RESULTS/attention_selftest.log"
      grep '^FAIL' "$RESULTS/attention_selftest.log" | head -20 | cut -c1-600
      [ $rc = 0 ] && record attention_selftest ok || record attention_selftest "failed (rc $rc)"
    else
      tail -n 20 "$RESULTS/attention_selftest_build.log"
      record attention_selftest "build failed"
    fi
    ;;
  selftest)
    # The standalone softmax self-test (no torch; csrc/tests/softmax_cuda_selftest.cu):
    # every tier forced, every dtype pair, widths 1..16M, misaligned pointers,
    # special values and error paths, against a CPU reference
    stage selftest
    mkdir -p build
    if nvcc -std=c++17 -O3 -DOSS_SOFTMAX_TEST_KNOBS -arch=native -I csrc csrc/common.c csrc/cuda/softmax/softmax.cu \
         csrc/cuda/softmax/softmax_plan.cu csrc/cuda/softmax/softmax_launch.cu \
         csrc/tests/softmax_cuda_selftest.cu -o build/softmax_selftest >"$RESULTS/selftest_build.log" 2>&1 &&
       timeout ${STAGE_TIMEOUT:-900} build/softmax_selftest check >"$RESULTS/softmax_selftest.log" 2>&1; then
      record selftest ok
    else
      record selftest failed
    fi
    tail -n 5 "$RESULTS/selftest_build.log" "$RESULTS/softmax_selftest.log"
    ;;
  fuzz)
    # The long fuzz profile on CUDA: each test in chunks of fresh cases
    # (scripts/fuzz_chunks.sh) for FUZZ_SECONDS (default 120) seconds per test;
    # FUZZ_TESTS picks the tests (default all four). The tests run at the same
    # time, one process each (their time goes to the CPU-side float64
    # reference and to hypothesis, not to the GPU), with FUZZ_THREADS (default
    # 4) CPU threads each.
    stage fuzz
    ok=1
    pids=()
    tests=(${FUZZ_TESTS:-test_fuzz_softmax_forward test_fuzz_softmax_backward test_fuzz_attention_forward test_fuzz_attention_backward})
    for t in "${tests[@]}"; do
      OMP_NUM_THREADS=${FUZZ_THREADS:-4} bash scripts/fuzz_chunks.sh "$t" "${FUZZ_SECONDS:-120}" "${FUZZ_CHUNK:-500}" \
        >"$RESULTS/fuzz_$t.log" 2>&1 &
      pids+=($!)
    done
    for i in "${!tests[@]}"; do
      wait "${pids[$i]}" || ok=0
      echo "${tests[$i]}:"; cat "$RESULTS/fuzz_${tests[$i]}.log"
    done
    echo "fresh passing cases in all: $(grep -h '^total:' "$RESULTS"/fuzz_test_*.log | awk '{s += $2} END {print s + 0}')"
    [ $ok = 1 ] && record fuzz ok || record fuzz failed
    ;;
  model)
    stage model
    timeout ${STAGE_TIMEOUT:-900} python3 bench/model.py 2>&1 | tee "$RESULTS/bench_model.log" | tail -20
    record model done
    ;;
  *) echo "unknown stage $s"; status=1 ;;
  esac
done
echo; echo "=== summary ==="; printf '%s\n' "${summary[@]}"
exit $status
